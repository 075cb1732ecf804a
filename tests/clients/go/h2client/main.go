// Command h2client drives `tern serve`'s TLS port with Go's net/http
// client, which negotiates HTTP/2 by ALPN as every Go program does, and
// prints one JSON object on stdout. Run by tests/integration/test_h2.py:
//
//	h2client https://127.0.0.1:PORT
//
// It asks GET /ping, POST /echo with 1 MiB (more than any flow-control
// window) and again with "Expect: 100-continue" (the client holds the body
// until the server's 100, or for ExpectContinueTimeout: 60 s here, past
// the test's patience), GET /stream (a streamed answer of 1 MB) and 50
// GET /delay?ms=200 at once, which net/http multiplexes over one
// connection. The JSON carries the facts (protocol, status, sizes, how
// many TCP connections were dialled) and the Python test asserts on them;
// a failed step still prints JSON (with "error") and exits 1.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// answer is what one request got.
type answer struct {
	Proto  string `json:"proto"`
	Status int    `json:"status"`
	Len    int    `json:"len"`
	Same   bool   `json:"same"` // the body is what was expected
}

type report struct {
	Client   string   `json:"client"`
	Ping     answer   `json:"ping"`
	Echo     answer   `json:"echo"`
	Expect   answer   `json:"expect"`
	Stream   answer   `json:"stream"`
	Parallel []answer `json:"parallel"`
	Dials    int64    `json:"dials"` // TCP connections the transport opened
	Error    string   `json:"error,omitempty"`
}

func main() {
	rep := report{Client: "go net/http " + runtime.Version()}
	err := run(os.Args[1], &rep)
	if err != nil {
		rep.Error = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(rep)
	if err != nil {
		os.Exit(1)
	}
}

func run(base string, rep *report) error {
	var dials atomic.Int64
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		// the test's self-signed certificate
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		// a Transport with its own TLS configuration offers h2 only when asked
		ForceAttemptHTTP2:     true,
		ExpectContinueTimeout: 60 * time.Second,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		},
	}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer func() { rep.Dials = dials.Load() }()

	do := func(req *http.Request, want []byte) (answer, error) {
		resp, err := c.Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return answer{}, err
		}
		return answer{Proto: resp.Proto, Status: resp.StatusCode, Len: len(body),
			Same: want == nil || bytes.Equal(body, want)}, nil
	}
	get := func(path string, want []byte) (answer, error) {
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			return answer{}, err
		}
		return do(req, want)
	}
	post := func(path string, body []byte, expect bool) (answer, error) {
		req, err := http.NewRequest("POST", base+path, bytes.NewReader(body))
		if err != nil {
			return answer{}, err
		}
		if expect {
			req.Header.Set("Expect", "100-continue")
		}
		return do(req, body)
	}

	var err error
	if rep.Ping, err = get("/ping", []byte("pong")); err != nil {
		return fmt.Errorf("GET /ping: %w", err)
	}
	big := make([]byte, 1<<20)
	rand.Read(big)
	if rep.Echo, err = post("/echo", big, false); err != nil {
		return fmt.Errorf("POST /echo: %w", err)
	}
	if rep.Expect, err = post("/echo", big, true); err != nil {
		return fmt.Errorf("POST /echo with Expect: 100-continue: %w", err)
	}
	if rep.Stream, err = get("/stream?chunks=100&size=10000", nil); err != nil {
		return fmt.Errorf("GET /stream: %w", err)
	}
	rep.Parallel = make([]answer, 50)
	errs := make([]error, len(rep.Parallel))
	var wg sync.WaitGroup
	for i := range rep.Parallel {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rep.Parallel[i], errs[i] = get("/delay?ms=200", []byte("done\n"))
		}(i)
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return fmt.Errorf("GET /delay: %w", e)
		}
	}
	return nil
}
