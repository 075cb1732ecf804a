// bench/run fanout's routes, as gorilla's chat example builds a broadcast:
//
//   - /fanout: each message is answered with 10 binary messages of 10 000
//     bytes (the market-data write-up's workload);
//   - /fanout/sub: a subscriber of the one topic; /fanout/pub and
//     /fanout/pub-keyed: each message is broadcast to every subscriber (the
//     key in a pub-keyed message is not used: a hub has no conflation).
//   - -sndbuf N: the kernel send buffer of each subscriber (SetWriteBuffer),
//     as tern serve's --sndbuf, so a slow reader shows as one.
//
// The hub is the chat example's: one goroutine owns the set of subscribers
// and hands each message to every subscriber's buffered channel (256
// messages); a writer goroutine per subscriber writes them out. A
// subscriber whose channel is full misses the message (dropped, as tern's
// default slow-consumer policy does; the chat example closes it instead).
package main

import (
	"flag"
	"net"
	"net/http"

	"github.com/gorilla/websocket"
)

type subscriber struct {
	conn *websocket.Conn
	send chan []byte
}

type hub struct {
	subs       map[*subscriber]struct{}
	broadcast  chan []byte
	register   chan *subscriber
	unregister chan *subscriber
}

func (h *hub) run() {
	for {
		select {
		case s := <-h.register:
			h.subs[s] = struct{}{}
		case s := <-h.unregister:
			if _, ok := h.subs[s]; ok {
				delete(h.subs, s)
				close(s.send)
			}
		case m := <-h.broadcast:
			for s := range h.subs {
				select {
				case s.send <- m:
				default: // slow: this one misses m
				}
			}
		}
	}
}

var block = make([]byte, 10000)

var sndbuf = flag.Int("sndbuf", 0, "SO_SNDBUF of each subscriber (0: the kernel's autotuning)")

func registerFanout(mux *http.ServeMux) {
	h := &hub{subs: map[*subscriber]struct{}{}, broadcast: make(chan []byte, 256),
		register: make(chan *subscriber), unregister: make(chan *subscriber)}
	go h.run()
	mux.HandleFunc("/fanout", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
			for i := 0; i < 10; i++ {
				if err := c.WriteMessage(websocket.BinaryMessage, block); err != nil {
					return
				}
			}
		}
	})
	mux.HandleFunc("/fanout/sub", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		if tc, ok := c.NetConn().(*net.TCPConn); ok && *sndbuf > 0 {
			tc.SetWriteBuffer(*sndbuf)
		}
		s := &subscriber{conn: c, send: make(chan []byte, 256)}
		h.register <- s
		go func() { // the writer: until the hub closes send
			for m := range s.send {
				if err := c.WriteMessage(websocket.BinaryMessage, m); err != nil {
					break
				}
			}
			c.Close()
		}()
		for { // the reader: only to see the close
			if _, _, err := c.ReadMessage(); err != nil {
				break
			}
		}
		h.unregister <- s
	})
	publish := func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadLimit(16 << 20)
		for {
			_, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			h.broadcast <- m
		}
	}
	mux.HandleFunc("/fanout/pub", publish)
	mux.HandleFunc("/fanout/pub-keyed", publish)
}
