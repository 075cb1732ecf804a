// The gorilla/websocket peer for bench/ws.sh: an echo server on /ws that
// answers each message with the same type, one goroutine per connection,
// as gorilla's own echo example does. Compression is off by default, as
// it is in gorilla; -compress turns it on.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/gorilla/websocket"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9091", "listen address")
	compress := flag.Bool("compress", false, "offer permessage-deflate")
	flag.Parse()
	up := websocket.Upgrader{
		ReadBufferSize:    4096,
		WriteBufferSize:   4096,
		EnableCompression: *compress,
		CheckOrigin:       func(*http.Request) bool { return true },
	}
	http.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
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
	})
	log.Fatal(http.ListenAndServe(*addr, nil))
}
