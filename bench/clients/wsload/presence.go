package main

// The churn and presence modes: what presence and join/leave cost a server,
// tern serve's /pubsub (a topic whose rule says presence=on, join-leave=on)
// and Centrifugo's (a namespace with presence, join_leave and
// force_push_join_leave) driven alike.
//
//   -mode churn     -conns watchers subscribe to -topic and stay, reading
//                   the joins and leaves pushed to them; then -rate new
//                   connections a second (spread evenly) each connect,
//                   subscribe, wait for the answer and close: a join and a
//                   leave each. Counted in the window: the churns done, their
//                   connect-to-subscribed time, and the events the watchers
//                   got (2 per churn and watcher when none is lost).
//   -mode presence  -conns subscribers of -topic, then one of them asks -op
//                   (presence: who is there; presence_stats: how many) -rate
//                   times a second, one request at a time, and times each
//                   answer.
//
// tern: {"op":"presence","topic":T} answers {"ok":"presence",...}; its list
// holds at most 1 000 entries (the limit's maximum). Centrifugo:
// {"id":N,"presence":{"channel":T}} answers {"id":N,"presence":{...}} with
// every subscriber. presence_stats is the same size on both.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type rtResult struct {
	Mode        string  `json:"mode"`
	Server      string  `json:"server"`
	Connections int     `json:"connections"`
	Rate        int     `json:"rate"`
	Op          string  `json:"op,omitempty"`
	WarmupS     float64 `json:"warmup_s"`
	DurationS   float64 `json:"duration_s"`
	ConnectS    float64 `json:"connect_s"`
	// churns (connect + subscribe + close) or queries answered in the window
	Messages  int64              `json:"messages"`
	MsgPerS   float64            `json:"msg_per_s"`
	Skipped   int64              `json:"skipped"`
	Failed    int64              `json:"failed"`
	Events    int64              `json:"events"`
	LatencyUs map[string]float64 `json:"latency_us"`
	Bytes     int64              `json:"answer_bytes,omitempty"`
	Client    string             `json:"client"`
}

// The commands that subscribe a connection to topic on server.
func subscribeCmds(server, topic string) []string {
	if server == "centrifugo" {
		return []string{`{"id":1,"connect":{}}`,
			`{"id":2,"subscribe":{"channel":"` + topic + `"}}`}
	}
	return []string{`{"op":"subscribe","topic":"` + topic + `"}`}
}

// Opens the -conns connections that stay (watchers, subscribers), each
// subscribed before the next is opened.
func openStaying(server, url, topic string, conns int) []*websocket.Conn {
	dialer := websocket.Dialer{}
	cs := make([]*websocket.Conn, conns)
	for i := range cs {
		cs[i] = dial(&dialer, url, i)
		cmds := subscribeCmds(server, topic)
		for _, m := range cmds {
			if err := cs[i].WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
				fmt.Fprintf(os.Stderr, "wsload: subscribe %d: %v\n", i, err)
				os.Exit(1)
			}
		}
		awaitReplies(cs[i], len(cmds), i)
	}
	return cs
}

// Whether line is a join or leave pushed to a subscriber: tern's
// {"topic":T,"join":{...}}, Centrifugo's {"push":{"channel":T,"join":{...}}}.
func isJoinLeave(line []byte) bool {
	return bytes.Contains(line, []byte(`"join":{`)) || bytes.Contains(line, []byte(`"leave":{`))
}

// One churn: connect, subscribe, wait for the answer, close. Returns its
// time, or false when a step failed.
func churnOnce(server, url, topic string) (time.Duration, bool) {
	start := time.Now()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	c, _, err := d.Dial(url, nil)
	if err != nil {
		return 0, false
	}
	defer c.Close()
	cmds := subscribeCmds(server, topic)
	for _, m := range cmds {
		if c.WriteMessage(websocket.TextMessage, []byte(m)) != nil {
			return 0, false
		}
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for want := len(cmds); want > 0; {
		_, b, err := c.ReadMessage()
		if err != nil {
			return 0, false
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if bytes.Contains(line, []byte(`"error"`)) {
				return 0, false
			}
			if len(bytes.TrimSpace(line)) > 2 && !isJoinLeave(line) {
				want--
			}
		}
	}
	took := time.Since(start)
	c.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	return took, true
}

// Reads c until it ends, answering Centrifugo's pings; each line goes to
// line.
func readLines(server string, c *websocket.Conn, line func([]byte)) {
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			return
		}
		for _, l := range bytes.Split(b, []byte("\n")) {
			if server == "centrifugo" && string(bytes.TrimSpace(l)) == "{}" {
				c.WriteMessage(websocket.TextMessage, []byte("{}"))
				continue
			}
			line(l)
		}
	}
}

func closeAll(cs []*websocket.Conn) {
	for _, c := range cs {
		c.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.Close()
	}
}

func printRT(r rtResult, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("wsload %s %s: %d connections, %.0f a second (%d skipped, %d failed), "+
		"p50 %.0f us, p99 %.0f us, %d events\n", r.Mode, r.Server, r.Connections, r.MsgPerS,
		r.Skipped, r.Failed, r.LatencyUs["p50"], r.LatencyUs["p99"], r.Events)
}

// inFlightMax: churns at once; a tick that finds this many still going is
// skipped (counted), so that a server that falls behind is seen, not
// buried under goroutines.
const inFlightMax = 2000

func runChurn(server, url, topic string, conns, rate int, warmup, duration time.Duration,
	asJSON bool) {
	t0 := time.Now()
	ws := openStaying(server, url, topic, conns)
	connectS := time.Since(t0).Seconds()
	var measuring atomic.Bool
	var events atomic.Int64
	var wg sync.WaitGroup
	for _, c := range ws {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			readLines(server, c, func(l []byte) {
				if measuring.Load() && isJoinLeave(l) {
					events.Add(1)
				}
			})
		}(c)
	}

	var mu sync.Mutex
	var lat []time.Duration
	var done, failed, skipped atomic.Int64
	var inFlight atomic.Int64
	var churns sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	mStart, mEnd := start.Add(warmup), start.Add(warmup+duration)
	for next := start; ; next = next.Add(interval) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		// a churn belongs to the window its tick was due in: a client late
		// to start them (its core busy) catches up, and counts no more
		if !next.Before(mEnd) {
			break
		}
		counted := !next.Before(mStart)
		measuring.Store(counted)
		if inFlight.Load() >= inFlightMax {
			if counted {
				skipped.Add(1)
			}
			continue
		}
		inFlight.Add(1)
		churns.Add(1)
		go func(counted bool) {
			defer churns.Done()
			defer inFlight.Add(-1)
			took, ok := churnOnce(server, url, topic)
			if !counted {
				return
			}
			if !ok {
				failed.Add(1)
				return
			}
			done.Add(1)
			mu.Lock()
			lat = append(lat, took)
			mu.Unlock()
		}(counted)
	}
	churns.Wait()
	time.Sleep(200 * time.Millisecond) // the last leaves' way to the watchers
	measuring.Store(false)
	closeAll(ws)
	wg.Wait()
	r := rtResult{Mode: "churn", Server: server, Connections: conns, Rate: rate,
		WarmupS: warmup.Seconds(), DurationS: duration.Seconds(), ConnectS: connectS,
		Messages: done.Load(), MsgPerS: float64(done.Load()) / duration.Seconds(),
		Skipped: skipped.Load(), Failed: failed.Load(), Events: events.Load(),
		LatencyUs: quantiles(lat), Client: "gorilla/websocket (churn)"}
	printRT(r, asJSON)
}

func runPresence(server, url, topic, op string, conns, rate int, warmup,
	duration time.Duration, asJSON bool) {
	t0 := time.Now()
	cs := openStaying(server, url, topic, conns)
	connectS := time.Since(t0).Seconds()
	// every subscriber but the asking one (the last) is read and drained
	var wg sync.WaitGroup
	for _, c := range cs[:len(cs)-1] {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			readLines(server, c, func([]byte) {})
		}(c)
	}
	q := cs[len(cs)-1]
	want := []byte(`"ok":"` + op + `"`)
	var lat []time.Duration
	var done, nbytes int64
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	mStart, mEnd := start.Add(warmup), start.Add(warmup+duration)
	id := 3
	for next := start; ; next = next.Add(interval) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		if !now.Before(mEnd) {
			break
		}
		var cmd string
		if server == "centrifugo" {
			id++
			cmd = `{"id":` + strconv.Itoa(id) + `,"` + op + `":{"channel":"` + topic + `"}}`
			want = []byte(`{"id":` + strconv.Itoa(id) + `,`)
		} else {
			cmd = `{"op":"` + op + `","topic":"` + topic + `"}`
		}
		if err := q.WriteMessage(websocket.TextMessage, []byte(cmd)); err != nil {
			fmt.Fprintf(os.Stderr, "wsload: %s: %v\n", op, err)
			os.Exit(1)
		}
		// nothing else comes on this connection (no message is published to
		// the topic, no join/leave pushed): an error is the query's (the
		// rule, the namespace or a rate limit refused it)
		q.SetReadDeadline(time.Now().Add(10 * time.Second))
		ok, size := false, 0
		for !ok {
			_, b, err := q.ReadMessage()
			if err != nil {
				fmt.Fprintf(os.Stderr, "wsload: %s: %v\n", op, err)
				os.Exit(1)
			}
			for _, l := range bytes.Split(b, []byte("\n")) {
				if server == "centrifugo" && string(bytes.TrimSpace(l)) == "{}" {
					q.WriteMessage(websocket.TextMessage, []byte("{}"))
				} else if bytes.Contains(l, []byte(`"error"`)) {
					fmt.Fprintf(os.Stderr, "wsload: %s: %.300s\n", op, l)
					os.Exit(1)
				} else if bytes.Contains(l, want) {
					ok, size = true, len(l)
				}
			}
		}
		if !now.Before(mStart) {
			done++
			nbytes += int64(size)
			lat = append(lat, time.Since(now))
		}
	}
	closeAll(cs)
	wg.Wait()
	r := rtResult{Mode: "presence", Server: server, Connections: conns, Rate: rate, Op: op,
		WarmupS: warmup.Seconds(), DurationS: duration.Seconds(), ConnectS: connectS,
		Messages: done, MsgPerS: float64(done) / duration.Seconds(),
		LatencyUs: quantiles(lat), Client: "gorilla/websocket (presence)"}
	if done > 0 {
		r.Bytes = nbytes / done
	}
	printRT(r, asJSON)
}
