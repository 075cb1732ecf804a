// Peer: Go net/http (standard library only), the HTTP routes of `tern serve`.
package main

import (
	"flag"
	"log"
	"net/http"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	flag.Parse()
	mux := http.NewServeMux()
	routes.Register(mux)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
