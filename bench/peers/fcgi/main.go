// Peer: a Go net/http/fcgi application (standard library only) serving the
// HTTP routes of `tern serve` (the same handlers as the nethttp peer) over
// FastCGI, for the proxy suite's FastCGI rows: nginx in front with
// fastcgi_pass, over TCP (-addr) and over a Unix socket (-unix). It speaks
// only FastCGI: nginx is its one client.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/fcgi"
	"os"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "FastCGI listen address (TCP)")
	unix := flag.String("unix", "", "also serve FastCGI on this Unix socket")
	flag.Parse()
	mux := http.NewServeMux()
	routes.Register(mux)
	if *unix != "" {
		os.Remove(*unix)
		ln, err := net.Listen("unix", *unix)
		if err != nil {
			log.Fatal(err)
		}
		go func() { log.Fatal(fcgi.Serve(ln, mux)) }()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(fcgi.Serve(ln, mux))
}
