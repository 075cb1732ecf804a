// Peer: Go net/http (standard library only), the HTTP routes of `tern serve`.
// With -unix PATH it also serves on a Unix socket, for the proxy suite
// (nginx in front over TCP or over a Unix socket).
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"os"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	unix := flag.String("unix", "", "also listen on this Unix socket")
	flag.Parse()
	mux := http.NewServeMux()
	routes.Register(mux)
	if *unix != "" {
		os.Remove(*unix)
		ln, err := net.Listen("unix", *unix)
		if err != nil {
			log.Fatal(err)
		}
		go func() { log.Fatal(http.Serve(ln, mux)) }()
	}
	log.Fatal(routes.ListenAndServe(*addr, mux))
}
