// Command wsclient drives a tern /ws echo endpoint with gorilla/websocket
// and prints one JSON object on stdout. Run by
// tests/integration/test_ws_clients.py:
//
//	wsclient echo   ws://127.0.0.1:PORT/ws
//	wsclient toobig ws://127.0.0.1:PORT/ws LIMIT
//
// echo: with compression (EnableCompression, as gorilla users turn it on)
// and then without, every size at the frame-length boundaries goes out and
// must come back byte for byte with its type; a ping must get its pong;
// a close with 4000 must get 4000 back.
//
// toobig: against a server started with --ws-max-message LIMIT, a message
// of exactly LIMIT bytes is echoed and one of LIMIT+1 bytes is refused with
// close code 1009, both compressed and not.
//
// The JSON carries the facts and the Python test asserts on them; a failed
// step still prints JSON (with "error") and exits 1.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

var sizes = []int{0, 125, 126, 65535, 65536, 1 << 20}

const stepTimeout = 20 * time.Second

// countingConn counts the bytes that cross the TCP connection.
type countingConn struct {
	net.Conn
	in, out atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

func dial(url string, compress bool) (*websocket.Conn, *countingConn, *http.Response, error) {
	var cc *countingConn
	d := websocket.Dialer{
		HandshakeTimeout:  10 * time.Second,
		EnableCompression: compress,
		// wss:// to a test server's self-signed certificate (crypto/tls).
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cc = &countingConn{Conn: c}
			return cc, nil
		},
	}
	ws, resp, err := d.Dial(url, nil)
	if err != nil {
		return nil, nil, resp, err
	}
	ws.SetReadLimit(4 << 20)
	ws.EnableWriteCompression(compress)
	return ws, cc, resp, nil
}

// textOf makes valid, compressible UTF-8 of exactly n bytes.
func textOf(n int) []byte {
	unit := "tern ✓ echo " // 14 bytes
	s := strings.Repeat(unit, n/len(unit))
	s += strings.Repeat("x", n-len(s))
	return []byte(s)
}

// binaryOf makes n incompressible bytes.
func binaryOf(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

type message struct {
	Type    string `json:"type"`
	Size    int    `json:"size"`
	GotType string `json:"got_type"`
	GotSize int    `json:"got_size"`
	Equal   bool   `json:"equal"`
	WireIn  int64  `json:"wire_in"`
	WireOut int64  `json:"wire_out"`
}

type closeInfo struct {
	Code   int    `json:"code"`
	Reason string `json:"reason"`
}

type session struct {
	Compress   bool       `json:"compress"`
	Extensions string     `json:"extensions"`
	Messages   []message  `json:"messages"`
	Ping       *pingInfo  `json:"ping"`
	Close      *closeInfo `json:"close"`
}

type pingInfo struct {
	Sent  string `json:"sent"`
	Pong  string `json:"pong"`
	Equal bool   `json:"equal"`
}

func typeName(t int) string {
	switch t {
	case websocket.TextMessage:
		return "text"
	case websocket.BinaryMessage:
		return "binary"
	}
	return strconv.Itoa(t)
}

// echo sends one message and reads the next, returning what came back.
func echo(ws *websocket.Conn, t int, payload []byte) (int, []byte, error) {
	ws.SetWriteDeadline(time.Now().Add(stepTimeout))
	if err := ws.WriteMessage(t, payload); err != nil {
		return 0, nil, fmt.Errorf("write %d bytes: %w", len(payload), err)
	}
	ws.SetReadDeadline(time.Now().Add(stepTimeout))
	gt, got, err := ws.ReadMessage()
	if err != nil {
		return 0, nil, fmt.Errorf("read echo of %d bytes: %w", len(payload), err)
	}
	return gt, got, nil
}

// closeCode reads until the connection fails and returns the close frame's
// code and reason, or an error if it ended some other way.
func closeCode(ws *websocket.Conn) (*closeInfo, error) {
	ws.SetReadDeadline(time.Now().Add(stepTimeout))
	for {
		_, data, err := ws.ReadMessage()
		if err == nil {
			return nil, fmt.Errorf("expected a close, got a %d-byte message", len(data))
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return &closeInfo{Code: ce.Code, Reason: ce.Text}, nil
		}
		return nil, fmt.Errorf("expected a close frame: %w", err)
	}
}

func runSession(url string, compress bool) (*session, error) {
	s := &session{Compress: compress}
	ws, cc, resp, err := dial(url, compress)
	if err != nil {
		return s, fmt.Errorf("dial (compress=%v): %w", compress, err)
	}
	defer ws.Close()
	s.Extensions = resp.Header.Get("Sec-WebSocket-Extensions")

	for _, t := range []int{websocket.TextMessage, websocket.BinaryMessage} {
		for _, n := range sizes {
			payload := textOf(n)
			if t == websocket.BinaryMessage {
				payload = binaryOf(n)
			}
			in0, out0 := cc.in.Load(), cc.out.Load()
			gt, got, err := echo(ws, t, payload)
			if err != nil {
				return s, fmt.Errorf("compress=%v %s: %w", compress, typeName(t), err)
			}
			s.Messages = append(s.Messages, message{
				Type: typeName(t), Size: n, GotType: typeName(gt), GotSize: len(got),
				Equal: bytes.Equal(got, payload), WireIn: cc.in.Load() - in0,
				WireOut: cc.out.Load() - out0,
			})
		}
	}

	// The pong handler runs inside ReadMessage: ping, then echo one more
	// message; the pong precedes its echo on the wire.
	pingData := "tern-ping-✓"
	pong := make(chan string, 1)
	ws.SetPongHandler(func(appData string) error {
		select {
		case pong <- appData:
		default:
		}
		return nil
	})
	if err := ws.WriteControl(websocket.PingMessage, []byte(pingData),
		time.Now().Add(stepTimeout)); err != nil {
		return s, fmt.Errorf("ping: %w", err)
	}
	if _, _, err := echo(ws, websocket.TextMessage, []byte("after ping")); err != nil {
		return s, fmt.Errorf("after ping: %w", err)
	}
	select {
	case p := <-pong:
		s.Ping = &pingInfo{Sent: pingData, Pong: p, Equal: p == pingData}
	default:
		s.Ping = &pingInfo{Sent: pingData}
	}

	if err := ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(4000, "go client done"),
		time.Now().Add(stepTimeout)); err != nil {
		return s, fmt.Errorf("close: %w", err)
	}
	s.Close, err = closeCode(ws)
	return s, err
}

type tooBig struct {
	Compress   bool       `json:"compress"`
	Extensions string     `json:"extensions"`
	AtLimitOK  bool       `json:"at_limit_ok"`
	OverLimit  int        `json:"over_limit"`
	Close      *closeInfo `json:"close"`
}

func runTooBig(url string, limit int, compress bool) (*tooBig, error) {
	r := &tooBig{Compress: compress, OverLimit: limit + 1}
	ws, _, resp, err := dial(url, compress)
	if err != nil {
		return r, fmt.Errorf("dial (compress=%v): %w", compress, err)
	}
	defer ws.Close()
	r.Extensions = resp.Header.Get("Sec-WebSocket-Extensions")
	// Compressible text with compression (the limit must hold for the
	// inflated size), random bytes without.
	gen := binaryOf
	t := websocket.BinaryMessage
	if compress {
		gen, t = textOf, websocket.TextMessage
	}
	at := gen(limit)
	gt, got, err := echo(ws, t, at)
	if err != nil {
		return r, fmt.Errorf("compress=%v message at the limit: %w", compress, err)
	}
	r.AtLimitOK = gt == t && bytes.Equal(got, at)
	ws.SetWriteDeadline(time.Now().Add(stepTimeout))
	if err := ws.WriteMessage(t, gen(limit+1)); err != nil {
		return r, fmt.Errorf("write over the limit: %w", err)
	}
	r.Close, err = closeCode(ws)
	return r, err
}

func main() {
	out := map[string]any{"client": "gorilla/websocket v1.5.3"}
	code := 0
	fail := func(err error) {
		out["error"] = err.Error()
		code = 1
	}
	// A last resort: whatever hangs, the process ends.
	time.AfterFunc(50*time.Second, func() {
		fmt.Println(`{"error": "wsclient: timed out after 50 s"}`)
		os.Exit(1)
	})
	args := os.Args[1:]
	switch {
	case len(args) == 2 && args[0] == "echo":
		for _, compress := range []bool{true, false} {
			s, err := runSession(args[1], compress)
			out[map[bool]string{true: "deflate", false: "plain"}[compress]] = s
			if err != nil {
				fail(err)
				break
			}
		}
	case len(args) == 3 && args[0] == "toobig":
		limit, err := strconv.Atoi(args[2])
		if err != nil {
			fail(err)
			break
		}
		for _, compress := range []bool{true, false} {
			r, err := runTooBig(args[1], limit, compress)
			out[map[bool]string{true: "deflate", false: "plain"}[compress]] = r
			if err != nil {
				fail(err)
				break
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: wsclient echo URL | wsclient toobig URL LIMIT")
		os.Exit(2)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	os.Exit(code)
}
