package main

// The pubsub-json mode: one publisher through a server's HTTP publish API,
// N subscribers through its own WebSocket protocol, both read and written
// here, so that tern serve and Centrifugo are driven alike:
//
//   -server tern        subscribers: /pubsub, {"op":"subscribe","topic":T};
//                       messages {"topic":T,"seq":N,"data":"..."}, one per
//                       frame; publisher: POST /publish/T on the admin
//                       listener, Authorization: Bearer KEY, the body the data
//   -server centrifugo  subscribers: {"id":1,"connect":{}}, then
//                       {"id":2,"subscribe":{"channel":T}}; pushes
//                       {"push":{"channel":T,"pub":{"data":{...}}}}, several
//                       per frame when the server packs them ("\n" between);
//                       an empty command {} is a ping, answered {}; publisher:
//                       POST /api/publish {"channel":T,"data":{...}}, X-API-Key
//
// The sse mode is the same with tern's GET /sse?topic=T streams as the
// subscribers (sse.go).
//
// -url may name several servers, comma-separated (the nodes of a bridge):
// subscriber i goes to the i-th modulo their number, the publisher to
// -publish-url only, and the latency is also given per URL, so that the
// subscribers of the nodes the publisher is not on show what the bridge
// adds.
//
// Each message's data carries its send time (ns) and its number; a
// subscriber counts what it gets, the latency, and the numbers it missed.
// The publisher sends -rate messages a second (one request at a time, on one
// kept-alive connection: a slow answer lowers the rate it reaches, which is
// reported). The JSON line has `tern load pubsub --json`'s fields and the
// publish answers' latency.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type pubsubResult struct {
	Mode          string             `json:"mode"`
	Server        string             `json:"server"`
	Connections   int                `json:"connections"`
	Size          int                `json:"size"`
	Rate          int                `json:"rate"`
	WarmupS       float64            `json:"warmup_s"`
	DurationS     float64            `json:"duration_s"`
	ConnectS      float64            `json:"connect_s"`
	Published     int64              `json:"published"`
	PublishRate   float64            `json:"publish_rate"`
	Expected      int64              `json:"expected"`
	Messages      int64              `json:"messages"`
	Gaps          int64              `json:"gaps"`
	MsgPerS       float64            `json:"msg_per_s"`
	LatencyUs     map[string]float64 `json:"latency_us"`
	PublishUs     map[string]float64 `json:"publish_us"`
	UncleanCloses int                `json:"unclean_closes"`
	Client        string             `json:"client"`
	// per URL of -url, in its order (subscribers i, i+len, ...)
	URLs          []string             `json:"urls"`
	MessagesByURL []int64              `json:"messages_by_url"`
	LatencyByURL  []map[string]float64 `json:"latency_by_url_us"`
}

// The decimal number right after key in b (its first occurrence).
func numAfter(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	var v int64
	k := i + len(key)
	start := k
	for ; k < len(b) && b[k] >= '0' && b[k] <= '9'; k++ {
		v = v*10 + int64(b[k]-'0')
	}
	return v, k > start
}

// The numbers a message carries: its send time (ns) and its number. In
// tern's messages the data string starts "<ns> <i> " ({"topic":..,"data":
// "<ns> <i> ppp"}); in Centrifugo's pushes the data is {"t":ns,"i":i,..}.
// Read by hand rather than by encoding/json: at 100 000 messages a second
// a full decode made the client, not the server, the bottleneck.
func stamp(server string, line []byte) (int64, int64, bool) {
	if server == "centrifugo" {
		t, ok1 := numAfter(line, `"t":`)
		n, ok2 := numAfter(line, `"i":`)
		return t, n, ok1 && ok2
	}
	i := bytes.Index(line, []byte(`"data":"`))
	if i < 0 {
		return 0, 0, false
	}
	rest := line[i+8:]
	t, ok1 := numAfter(rest, "")
	sp := bytes.IndexByte(rest, ' ')
	if !ok1 || sp < 0 {
		return 0, 0, false
	}
	n, ok2 := numAfter(rest[sp+1:], "")
	return t, n, ok2
}

type subCounts struct {
	got, gaps int64
	lat       []time.Duration
}

// A subscriber of either transport: read hands each message line (a
// WebSocket frame's lines, an SSE event's data) to line until the
// connection ends; stop ends it.
type subscriber interface {
	read(line func([]byte))
	stop()
}

// A /pubsub (or Centrifugo) WebSocket subscriber.
type wsSub struct {
	c      *websocket.Conn
	server string
}

// Opens subscriber i on url and subscribes it to topic (the server's reply
// read), or ends the run: a load that cannot subscribe measures nothing.
func openWS(server, url, topic string, i int) subscriber {
	dialer := websocket.Dialer{}
	c := dial(&dialer, url, i)
	var cmds []string
	if server == "centrifugo" {
		cmds = []string{`{"id":1,"connect":{}}`,
			`{"id":2,"subscribe":{"channel":"` + topic + `"}}`}
	} else {
		cmds = []string{`{"op":"subscribe","topic":"` + topic + `"}`}
	}
	for _, m := range cmds {
		if err := c.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
			fmt.Fprintf(os.Stderr, "wsload: subscribe %d: %v\n", i, err)
			os.Exit(1)
		}
	}
	awaitReplies(c, len(cmds), i)
	return &wsSub{c, server}
}

// Reads until want replies (tern's ack, Centrifugo's connect and subscribe)
// have come on c, or ends the run on an error.
func awaitReplies(c *websocket.Conn, want, i int) {
	for want > 0 {
		_, b, err := c.ReadMessage()
		if err != nil {
			fmt.Fprintf(os.Stderr, "wsload: subscribe %d: %v\n", i, err)
			os.Exit(1)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if bytes.Contains(line, []byte(`"error"`)) {
				fmt.Fprintf(os.Stderr, "wsload: subscribe %d: %s\n", i, line)
				os.Exit(1)
			}
			if len(bytes.TrimSpace(line)) > 2 {
				want--
			}
		}
	}
}

func (s *wsSub) read(line func([]byte)) {
	for {
		_, b, err := s.c.ReadMessage()
		if err != nil {
			return
		}
		for _, l := range bytes.Split(b, []byte("\n")) {
			if s.server == "centrifugo" && string(bytes.TrimSpace(l)) == "{}" { // ping
				s.c.WriteMessage(websocket.TextMessage, []byte("{}"))
				continue
			}
			line(l)
		}
	}
}

func (s *wsSub) stop() {
	s.c.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	s.c.Close()
}

func runPubsub(mode, server, urlList, publishURL, key, topic string, conns, size, rate int,
	warmup, duration time.Duration, asJSON bool) {
	urls := strings.Split(urlList, ",")
	t0 := time.Now()
	cs := make([]subscriber, conns)
	for i := range cs {
		if mode == "sse" {
			cs[i] = openSSE(urls[i%len(urls)], topic, i)
		} else {
			cs[i] = openWS(server, urls[i%len(urls)], topic, i)
		}
	}
	connectS := time.Since(t0).Seconds()

	var measuring atomic.Bool
	var firstN, lastN atomic.Int64 // the numbers published in the window
	firstN.Store(-1)
	var unclean atomic.Int64
	out := make([]subCounts, conns)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c subscriber) {
			defer wg.Done()
			var k subCounts
			last := int64(-1)
			c.read(func(line []byte) {
				ts, n, ok := stamp(server, line)
				if !ok {
					return
				}
				if last >= 0 && n > last+1 && measuring.Load() {
					k.gaps += n - last - 1
				}
				last = n
				if f := firstN.Load(); f >= 0 && n >= f && (lastN.Load() < 0 || n <= lastN.Load()) {
					k.got++
					k.lat = append(k.lat, time.Duration(time.Now().UnixNano()-ts))
				}
			})
			out[i] = k
		}(i, c)
	}

	// the publisher
	lastN.Store(-1)
	client := &http.Client{Timeout: 10 * time.Second}
	pad := strings.Repeat("p", size)
	var pubLat []time.Duration
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	mStart, mEnd := start.Add(warmup), start.Add(warmup+duration)
	var published, n int64
	for next := start; ; next = next.Add(interval) {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		if !now.Before(mEnd) {
			break
		}
		if !now.Before(mStart) && firstN.Load() < 0 {
			firstN.Store(n)
			measuring.Store(true)
		}
		var req *http.Request
		if server == "centrifugo" {
			body := fmt.Sprintf(`{"channel":%q,"data":{"t":%d,"i":%d,"p":%q}}`, topic,
				now.UnixNano(), n, pad)
			req, _ = http.NewRequest("POST", publishURL, strings.NewReader(body))
			req.Header.Set("X-API-Key", key)
			req.Header.Set("Content-Type", "application/json")
		} else {
			body := fmt.Sprintf("%d %d %s", now.UnixNano(), n, pad)
			req, _ = http.NewRequest("POST", publishURL, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wsload: publish: %v\n", err)
			os.Exit(1)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fmt.Fprintf(os.Stderr, "wsload: publish: HTTP %d\n", resp.StatusCode)
			os.Exit(1)
		}
		if firstN.Load() >= 0 {
			published++
			pubLat = append(pubLat, time.Since(now))
		}
		n++
	}
	lastN.Store(n - 1)
	time.Sleep(500 * time.Millisecond) // the last messages' way to the subscribers
	for _, c := range cs {
		c.stop()
	}
	wg.Wait()

	r := pubsubResult{Mode: mode, Server: server, Connections: conns, Size: size,
		Rate: rate, WarmupS: warmup.Seconds(), DurationS: duration.Seconds(), ConnectS: connectS,
		Published: published, PublishRate: float64(published) / duration.Seconds(),
		Expected: published * int64(conns), UncleanCloses: int(unclean.Load()),
		Client: "gorilla/websocket (pubsub-json)", URLs: urls}
	if mode == "sse" {
		r.Client = "net/http (sse)"
	}
	var all []time.Duration
	byURL := make([][]time.Duration, len(urls))
	r.MessagesByURL = make([]int64, len(urls))
	for i, k := range out {
		r.Messages += k.got
		r.Gaps += k.gaps
		all = append(all, k.lat...)
		byURL[i%len(urls)] = append(byURL[i%len(urls)], k.lat...)
		r.MessagesByURL[i%len(urls)] += k.got
	}
	r.MsgPerS = float64(r.Messages) / duration.Seconds()
	r.LatencyUs = quantiles(all)
	for _, l := range byURL {
		r.LatencyByURL = append(r.LatencyByURL, quantiles(l))
	}
	r.PublishUs = quantiles(pubLat)
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("wsload %s %s: %d subscribers, %.0f msg/s published: %d of %d delivered, "+
		"p99 %.0f us; publish p50 %.0f us\n", mode, server, conns, r.PublishRate, r.Messages,
		r.Expected, r.LatencyUs["p99"], r.PublishUs["p50"])
}

// Mean, p50, p99 and max of all (sorted here), in microseconds: every
// mode's latency figures.
func quantiles(all []time.Duration) map[string]float64 {
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	q := func(f float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return us(all[int(f*float64(len(all)-1))])
	}
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	mean := 0.0
	if len(all) > 0 {
		mean = us(sum) / float64(len(all))
	}
	return map[string]float64{"mean": mean, "p50": q(0.5), "p99": q(0.99), "max": q(1)}
}
