// Peer: coder/websocket (formerly nhooyr.io/websocket) echo on / and /ws
// with its message API: c.Read then c.Write of the same type (one frame per
// message). Its echo example's Reader/Writer + io.Copy form is not used: it
// sends each message as a data frame plus an empty final continuation frame,
// which `tern load pipeline` (it counts echoed bytes) cannot count.
// Compression disabled. The HTTP routes are net/http's (internal/routes).
package main

import (
	"context"
	"flag"
	"net/http"

	"github.com/coder/websocket"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9092", "listen address")
	flag.Parse()
	echo := func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
			InsecureSkipVerify: true,
			CompressionMode:    websocket.CompressionDisabled,
		})
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(16 << 20)
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	}
	routes.ServeWithEcho(*addr, echo)
}
