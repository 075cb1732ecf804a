// Command server is a gorilla/websocket echo server for tern's client
// tests (tests/integration/test_client.py): it listens on 127.0.0.1 at a
// free port, prints "PORT n" on stdout, and echoes every message with its
// type, with permessage-deflate when the client offers it. The
// subprotocol "chat" is chosen when offered; the Cookie and Origin headers
// of the upgrade are sent back as the first message when the client asks
// for /headers.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/gorilla/websocket"
)

func main() {
	up := websocket.Upgrader{
		EnableCompression: true,
		Subprotocols:      []string{"chat"},
		CheckOrigin:       func(*http.Request) bool { return true },
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if r.URL.Path == "/headers" {
			msg := fmt.Sprintf("cookie=%s origin=%s", r.Header.Get("Cookie"), r.Header.Get("Origin"))
			c.WriteMessage(websocket.TextMessage, []byte(msg))
		}
		for {
			t, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if c.WriteMessage(t, m) != nil {
				return
			}
		}
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("PORT %d\n", l.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	http.Serve(l, nil)
}
