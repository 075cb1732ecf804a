// Peer: gorilla/websocket echo on / and /ws, as gorilla's own echo example
// does it: one goroutine per connection, ReadMessage then WriteMessage, 4 KiB
// read and write buffers, compression off (gorilla's default). The HTTP
// routes are net/http's (internal/routes). bench/run fanout's routes are in
// fanout.go.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/gorilla/websocket"

	"tern.bench/peers/internal/routes"
)

var up = websocket.Upgrader{
	ReadBufferSize:  4096,
	WriteBufferSize: 4096,
	CheckOrigin:     func(*http.Request) bool { return true },
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9091", "listen address")
	flag.Parse()
	echo := func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadLimit(16 << 20)
		for {
			t, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(t, msg); err != nil {
				return
			}
		}
	}
	mux := http.NewServeMux()
	routes.Register(mux)
	mux.HandleFunc("/ws", echo)
	mux.HandleFunc("/{$}", echo)
	registerFanout(mux)
	log.Fatal(routes.ListenAndServe(*addr, mux))
}
