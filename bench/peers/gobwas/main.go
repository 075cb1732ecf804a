// Peer: gobwas/ws echo on / and /ws with its low-level API (the one its
// README shows for zero-copy use): ws.UpgradeHTTP, then per frame
// ws.ReadHeader, read the payload, ws.Cipher to unmask, ws.WriteHeader and
// the payload back unmasked, through 4 KiB bufio buffers; control frames are
// answered (ping → pong, close → close). One goroutine per connection. The
// HTTP routes are net/http's (internal/routes).
package main

import (
	"bufio"
	"flag"
	"io"
	"net/http"

	"github.com/gobwas/ws"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9093", "listen address")
	flag.Parse()
	echo := func(w http.ResponseWriter, r *http.Request) {
		conn, _, _, err := ws.UpgradeHTTP(r, w)
		if err != nil {
			return
		}
		defer conn.Close()
		rd := bufio.NewReaderSize(conn, 4096)
		wr := bufio.NewWriterSize(conn, 4096)
		payload := make([]byte, 0, 4096)
		for {
			h, err := ws.ReadHeader(rd)
			if err != nil || h.Length > 16<<20 {
				return
			}
			if int64(cap(payload)) < h.Length {
				payload = make([]byte, h.Length)
			}
			payload = payload[:h.Length]
			if _, err := io.ReadFull(rd, payload); err != nil {
				return
			}
			if h.Masked {
				ws.Cipher(payload, h.Mask, 0)
				h.Masked = false
			}
			switch h.OpCode {
			case ws.OpPing:
				h.OpCode = ws.OpPong
			case ws.OpPong:
				continue
			case ws.OpClose:
				ws.WriteHeader(wr, h)
				wr.Write(payload)
				wr.Flush()
				return
			}
			if err := ws.WriteHeader(wr, h); err != nil {
				return
			}
			if _, err := wr.Write(payload); err != nil {
				return
			}
			if rd.Buffered() == 0 { // flush once the pipelined frames read so far are answered
				if err := wr.Flush(); err != nil {
					return
				}
			}
		}
	}
	routes.ServeWithEcho(*addr, echo)
}
