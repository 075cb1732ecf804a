// wsload: a WebSocket echo load generator built on gorilla/websocket, the
// client the public Go write-ups drive their servers with. bench/run uses it
// (--client gorilla) to cross-check `tern load echo`: both must rank the
// servers alike.
//
// It opens -conns connections; each runs a synchronous loop on its own
// goroutine: write one binary message of -size bytes, read the echo, check
// it, record the round trip. The first -warmup is not counted; then it
// measures for -duration. With -json it prints one line with the same
// fields as `tern load echo --json`; otherwise a short summary. It exits 1
// when a dial fails or an echo differs from what was sent. ws:// or wss://
// (crypto/tls, certificate not verified): the wss-echo suite's client.
// -mode fanout: the fanout suite's independent client (fanout.go);
// -mode pubsub-json: tern serve's and Centrifugo's own protocols (pubsub.go);
// -mode sse: the same with tern's /sse streams as subscribers (sse.go);
// -mode churn and -mode presence: join/leave churn and presence queries
// (presence.go).
package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type result struct {
	Mode          string             `json:"mode"`
	URL           string             `json:"url"`
	Connections   int                `json:"connections"`
	Size          int                `json:"size"`
	WarmupS       float64            `json:"warmup_s"`
	DurationS     float64            `json:"duration_s"`
	ConnectS      float64            `json:"connect_s"`
	Messages      int64              `json:"messages"`
	MsgPerS       float64            `json:"msg_per_s"`
	MBPerS        float64            `json:"mb_per_s"`
	LatencyUs     map[string]float64 `json:"latency_us"`
	UncleanCloses int                `json:"unclean_closes"`
	Client        string             `json:"client"`
}

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/ws",
		"server URL (pubsub-json, sse: several, comma-separated, subscribers spread over them)")
	conns := flag.Int("conns", 100, "connections")
	size := flag.Int("size", 64, "message size in bytes")
	warmup := flag.Duration("warmup", time.Second, "unmeasured time before measuring")
	duration := flag.Duration("duration", 5*time.Second, "how long to measure")
	asJSON := flag.Bool("json", false, "print one JSON line")
	mode := flag.String("mode", "echo",
		"echo, fanout (fanout.go), pubsub-json (pubsub.go), sse (sse.go), churn or presence "+
			"(presence.go)")
	replies := flag.Int("replies", 10, "fanout: messages back per round")
	replySize := flag.Int("reply-size", 10000, "fanout: bytes of each")
	interval := flag.Duration("interval", time.Second, "fanout: a round per connection this often")
	server := flag.String("server", "tern", "pubsub-json: tern or centrifugo (pubsub.go)")
	publishURL := flag.String("publish-url", "", "pubsub-json: the HTTP publish API's URL")
	apiKey := flag.String("api-key", "", "pubsub-json: the publish API's key")
	topic := flag.String("topic", "bench", "pubsub-json: the topic (channel)")
	rate := flag.Int("rate", 100,
		"pubsub-json, sse: messages published a second; churn: connections; presence: queries")
	op := flag.String("op", "presence", "presence: presence or presence_stats")
	flag.Parse()
	switch *mode {
	case "pubsub-json", "sse":
		runPubsub(*mode, *server, *url, *publishURL, *apiKey, *topic, *conns, *size, *rate,
			*warmup, *duration, *asJSON)
		return
	case "churn":
		runChurn(*server, *url, *topic, *conns, *rate, *warmup, *duration, *asJSON)
		return
	case "presence":
		runPresence(*server, *url, *topic, *op, *conns, *rate, *warmup, *duration, *asJSON)
		return
	}
	if *mode == "fanout" {
		runFanout(*url, *conns, *size, *replies, *replySize, *interval, *warmup, *duration, *asJSON)
		return
	}

	msg := bytes.Repeat([]byte("m"), *size)
	// wss:// URLs: crypto/tls, the certificate not verified (bench/run's is
	// self-signed); session tickets are not reused, each connection does a
	// full handshake
	dialer := websocket.Dialer{ReadBufferSize: 4096, WriteBufferSize: 4096,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	t0 := time.Now()
	cs := make([]*websocket.Conn, *conns)
	for i := range cs {
		cs[i] = dial(&dialer, *url, i)
	}
	connectS := time.Since(t0).Seconds()

	// phase: 0 warm-up, 1 measuring, 2 stop. Each goroutine keeps its own
	// count and round trips, handed over when it stops.
	var phase atomic.Int32
	var bad atomic.Int64
	counts := make([]int64, len(cs))
	rtts := make([][]time.Duration, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c *websocket.Conn) {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<14)
			var n int64
			for {
				p := phase.Load()
				if p == 2 {
					break
				}
				start := time.Now()
				if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
					break
				}
				_, got, err := c.ReadMessage()
				if err != nil {
					break
				}
				if !bytes.Equal(got, msg) {
					bad.Add(1)
				}
				if p == 1 && phase.Load() == 1 {
					n++
					lat = append(lat, time.Since(start))
				}
			}
			counts[i], rtts[i] = n, lat
		}(i, c)
	}
	time.Sleep(*warmup)
	phase.Store(1)
	m0 := time.Now()
	time.Sleep(*duration)
	phase.Store(2)
	secs := time.Since(m0).Seconds()
	wg.Wait()
	for _, c := range cs {
		c.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.Close()
	}
	if bad.Load() > 0 {
		fmt.Fprintf(os.Stderr, "wsload: %d echoes differed\n", bad.Load())
		os.Exit(1)
	}

	var total int64
	var all []time.Duration
	for i := range cs {
		total += counts[i]
		all = append(all, rtts[i]...)
	}
	r := result{Mode: "echo", URL: *url, Connections: *conns, Size: *size,
		WarmupS: warmup.Seconds(), DurationS: secs, ConnectS: connectS, Messages: total,
		MsgPerS: float64(total) / secs, MBPerS: float64(total) / secs * float64(*size) / 1e6,
		LatencyUs: quantiles(all),
		Client:    "gorilla/websocket"}
	if *asJSON {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("wsload %s: %d connections, %d-byte messages: %.0f msg/s, p50 %.0f us, p99 %.0f us\n",
		*url, *conns, *size, r.MsgPerS, r.LatencyUs["p50"], r.LatencyUs["p99"])
}

// dial opens connection i of a run, or ends the run: a load that cannot
// connect measures nothing.
func dial(d *websocket.Dialer, url string, i int) *websocket.Conn {
	c, _, err := d.Dial(url, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "wsload: dial %d: %v\n", i, err)
		os.Exit(1)
	}
	return c
}
