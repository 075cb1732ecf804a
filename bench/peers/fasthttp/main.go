// Peer: valyala/fasthttp serving the HTTP routes of `tern serve` (GET /ping,
// GET /echo?size=N, POST /echo). HTTP only: fasthttp has no WebSocket of its own.
package main

import (
	"bytes"
	"flag"
	"log"

	"github.com/valyala/fasthttp"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9094", "listen address")
	tlsCert := flag.String("tls-cert", "", "PEM certificate: serve HTTPS on -addr")
	tlsKey := flag.String("tls-key", "", "PEM private key of -tls-cert")
	flag.Parse()
	xs := bytes.Repeat([]byte("x"), 1<<20)
	h := func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		switch {
		case path == "/ping" && ctx.IsGet():
			ctx.SetContentType("text/plain")
			ctx.SetBodyString("pong")
		case path == "/echo" && ctx.IsGet():
			n, err := ctx.QueryArgs().GetUint("size")
			if err != nil || n > len(xs) {
				ctx.Error("bad size", fasthttp.StatusBadRequest)
				return
			}
			ctx.SetContentType("application/octet-stream")
			ctx.SetBody(xs[:n])
		case path == "/echo" && ctx.IsPost():
			ctx.SetContentType("application/octet-stream")
			ctx.SetBody(ctx.PostBody())
		default:
			ctx.Error("not found", fasthttp.StatusNotFound)
		}
	}
	s := &fasthttp.Server{Handler: h, MaxRequestBodySize: 16 << 20, Name: "fasthttp"}
	if *tlsCert != "" && *tlsKey != "" {
		log.Fatal(s.ListenAndServeTLS(*addr, *tlsCert, *tlsKey)) // crypto/tls
	}
	log.Fatal(s.ListenAndServe(*addr))
}
