package main

// The sse mode's subscribers: tern serve's GET /sse?topic=T (EventSource's
// protocol, text/event-stream), read as a lean Go client would: net/http
// (its chunked decoding), one goroutine per stream, a 4 KiB bufio.Reader
// whose lines are looked at in place (ReadSlice, nothing copied) and only
// the "data:" lines handed on. The publisher, the counting and the JSON
// line are pubsub-json's (pubsub.go), so that the SSE and the WebSocket
// cells differ only in the transport.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"
)

// One transport for every stream (its MaxConnsPerHost of 0: no limit on
// connections to a server), no compression asked (tern's /sse sends none;
// the decoding would be the client's cost anyway).
var sseTransport = &http.Transport{DisableCompression: true,
	ResponseHeaderTimeout: 10 * time.Second}

// A stream: cancel ends it (a Close of the body would wait for the read
// under way, which waits for the next event).
type sseSub struct {
	resp   *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
}

// Opens stream i on base (http://host:port) for topic and reads up to its
// "subscribed" event, so that it is in the topic before the publisher
// starts; or ends the run.
func openSSE(base, topic string, i int) subscriber {
	u := base + "/sse?topic=" + url.QueryEscape(topic)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := sseTransport.RoundTrip(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "wsload: sse %d: %v\n", i, err)
		os.Exit(1)
	}
	if resp.StatusCode != 200 {
		fmt.Fprintf(os.Stderr, "wsload: sse %d: HTTP %d\n", i, resp.StatusCode)
		os.Exit(1)
	}
	s := &sseSub{resp, bufio.NewReaderSize(resp.Body, 4096), cancel}
	for {
		l, err := s.r.ReadSlice('\n')
		if err != nil {
			fmt.Fprintf(os.Stderr, "wsload: sse %d: the stream ended before its subscribed "+
				"event: %v\n", i, err)
			os.Exit(1)
		}
		if bytes.HasPrefix(l, []byte("event: subscribed")) {
			return s
		}
		if bytes.HasPrefix(l, []byte("event: error")) {
			fmt.Fprintf(os.Stderr, "wsload: sse %d: an error event\n", i)
			os.Exit(1)
		}
	}
}

func (s *sseSub) read(line func([]byte)) {
	for {
		l, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull { // a line longer than the buffer: not a message of ours
			for err == bufio.ErrBufferFull {
				_, err = s.r.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			s.resp.Body.Close()
			return
		}
		if bytes.HasPrefix(l, []byte("data: ")) {
			line(l[6:])
		}
	}
}

func (s *sseSub) stop() {
	s.cancel()
}
