// Peer: gorilla/websocket echo on / and /ws, as gorilla's own echo example
// does it: one goroutine per connection, ReadMessage then WriteMessage, 4 KiB
// read and write buffers, compression off (gorilla's default). The HTTP
// routes are net/http's (internal/routes).
package main

import (
	"flag"
	"net/http"

	"github.com/gorilla/websocket"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9091", "listen address")
	flag.Parse()
	up := websocket.Upgrader{
		ReadBufferSize:  4096,
		WriteBufferSize: 4096,
		CheckOrigin:     func(*http.Request) bool { return true },
	}
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
	routes.ServeWithEcho(*addr, echo)
}
