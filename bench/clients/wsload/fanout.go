package main

// The fanout mode: the market-data write-up's workload read by a client tern
// did not write. Each of -conns connections, on its own goroutine, sends a
// binary message of -size bytes every -interval (the connections take turns,
// spread evenly over it) and reads -replies binary messages of -reply-size
// bytes back with gorilla's NextReader (drained, nothing kept) and default
// buffers, as a Go subscriber would. A round not done within its interval is missed: late
// when its replies came after it, skipped when its time had passed before it
// could be sent. The JSON line has `tern load fanout --json`'s fields.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type fanoutResult struct {
	Mode          string             `json:"mode"`
	URL           string             `json:"url"`
	Connections   int                `json:"connections"`
	Size          int                `json:"size"`
	Replies       int                `json:"replies"`
	ReplySize     int                `json:"reply_size"`
	IntervalS     float64            `json:"interval_s"`
	WarmupS       float64            `json:"warmup_s"`
	DurationS     float64            `json:"duration_s"`
	ConnectS      float64            `json:"connect_s"`
	RoundsSent    int64              `json:"rounds_sent"`
	Rounds        int64              `json:"rounds"`
	Late          int64              `json:"late"`
	Skipped       int64              `json:"skipped"`
	Missed        int64              `json:"missed"`
	Messages      int64              `json:"messages"`
	MsgPerS       float64            `json:"msg_per_s"`
	MBPerS        float64            `json:"mb_per_s"`
	LatencyUs     map[string]float64 `json:"latency_us"`
	UncleanCloses int                `json:"unclean_closes"`
	Client        string             `json:"client"`
}

// per connection, handed over when it stops
type fanoutCounts struct {
	sent, done, late, skipped, messages int64
	lat                                 []time.Duration
}

func runFanout(url string, conns, size, replies, replySize int, interval, warmup,
	duration time.Duration, asJSON bool) {
	dialer := websocket.Dialer{} // default buffers, as a Go subscriber has
	t0 := time.Now()
	cs := make([]*websocket.Conn, conns)
	for i := range cs {
		cs[i] = dial(&dialer, url, i)
	}
	connectS := time.Since(t0).Seconds()
	msg := make([]byte, size)
	start := time.Now().Add(10 * time.Millisecond)
	mStart := start.Add(warmup)
	mEnd := mStart.Add(duration)
	var bad, unclean atomic.Int64
	out := make([]fanoutCounts, conns)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c *websocket.Conn) {
			defer wg.Done()
			var k fanoutCounts
			offset := time.Duration(int64(interval) * int64(i) / int64(conns))
			for r := 0; ; r++ {
				at := start.Add(offset + time.Duration(r)*interval)
				if !at.Before(mEnd) {
					break
				}
				measured := !at.Before(mStart)
				if d := time.Until(at); d > 0 {
					time.Sleep(d)
				} else if -d >= interval { // its time passed while the last round ran
					if measured {
						k.skipped++
					}
					continue
				}
				sentAt := time.Now()
				if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
					unclean.Add(1)
					break
				}
				ok := true
				for j := 0; j < replies; j++ {
					// NextReader drained into io.Discard (its pooled buffer):
					// ReadMessage's per-message allocation made this reader,
					// not the server, the bottleneck at 5 000 connections
					typ, r, err := c.NextReader()
					var n int64
					if err == nil {
						n, err = io.Copy(io.Discard, r)
					}
					if err != nil {
						unclean.Add(1)
						ok = false
						break
					}
					if typ != websocket.BinaryMessage || n != int64(replySize) {
						bad.Add(1)
					}
					if measured {
						k.messages++
					}
				}
				if !ok {
					break
				}
				if measured {
					k.sent++
					took := time.Since(sentAt)
					if time.Now().After(at.Add(interval)) {
						k.late++
					} else {
						k.done++
					}
					k.lat = append(k.lat, took)
				}
			}
			out[i] = k
		}(i, c)
	}
	wg.Wait()
	for _, c := range cs {
		c.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.Close()
	}
	if bad.Load() > 0 {
		fmt.Fprintf(os.Stderr, "wsload: %d replies were not %d-byte binary messages\n", bad.Load(),
			replySize)
		os.Exit(1)
	}
	r := fanoutResult{Mode: "fanout", URL: url, Connections: conns, Size: size, Replies: replies,
		ReplySize: replySize, IntervalS: interval.Seconds(), WarmupS: warmup.Seconds(),
		DurationS: duration.Seconds(), ConnectS: connectS, UncleanCloses: int(unclean.Load()),
		Client: "gorilla/websocket (fanout)"}
	var all []time.Duration
	for _, k := range out {
		r.RoundsSent += k.sent
		r.Rounds += k.done
		r.Late += k.late
		r.Skipped += k.skipped
		r.Messages += k.messages
		all = append(all, k.lat...)
	}
	r.Missed = r.Late + r.Skipped
	r.MsgPerS = float64(r.Messages) / duration.Seconds()
	r.MBPerS = r.MsgPerS * float64(replySize) / 1e6
	r.LatencyUs = quantiles(all)
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("wsload fanout %s: %d connections: %.0f msg/s, %d of %d rounds missed, p99 %.0f us\n",
		url, conns, r.MsgPerS, r.Missed, r.RoundsSent+r.Skipped, r.LatencyUs["p99"])
}
