// Package routes holds what every Go net/http-based peer serves: the same
// three HTTP routes as `tern serve` (GET /ping, GET /echo?size=N, POST
// /echo), and the WebSocket echo handler on / and /ws.
package routes

import (
	"bytes"
	"crypto/tls"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
)

// -tls-cert and -tls-key (PEM files; bench/run's one self-signed RSA-2048
// pair): when both are given, the peer serves HTTPS and WSS on -addr instead
// of plain HTTP and WS. Registered here, so every peer has them; parsed by the
// peer's own flag.Parse.
var (
	TLSCert = flag.String("tls-cert", "", "PEM certificate: serve TLS on -addr")
	TLSKey  = flag.String("tls-key", "", "PEM private key of -tls-cert")
	// -h2: offer HTTP/2 by ALPN on the TLS listener (net/http's own h2,
	// as every Go server has it by default); the h2 suite's Go row
	H2 = flag.Bool("h2", false, "offer HTTP/2 (ALPN h2) on the TLS listener")
)

// TLS reports whether -tls-cert and -tls-key were given.
func TLS() bool { return *TLSCert != "" && *TLSKey != "" }

// TLSConfig loads -tls-cert and -tls-key into a crypto/tls server
// configuration (Go's defaults otherwise: TLS 1.2 and 1.3, HTTP/1.1 only
// since nothing offers h2 here).
func TLSConfig() *tls.Config {
	cert, err := tls.LoadX509KeyPair(*TLSCert, *TLSKey)
	if err != nil {
		log.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// ListenAndServe serves h at addr: over TLS (crypto/tls, net/http's
// ListenAndServeTLS) when -tls-cert and -tls-key were given, else plain.
func ListenAndServe(addr string, h http.Handler) error {
	if TLS() {
		srv := &http.Server{Addr: addr, Handler: h}
		if !*H2 {
			// no h2: the clients speak HTTP/1.1 and WebSocket over HTTP/1.1
			srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
		}
		return srv.ListenAndServeTLS(*TLSCert, *TLSKey)
	}
	return http.ListenAndServe(addr, h)
}

var xs = bytes.Repeat([]byte("x"), 1<<20)

// Register adds /ping and /echo to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "4") // net/http adds it anyway; nbhttp would chunk
		w.Write([]byte("pong"))
	})
	mux.HandleFunc("GET /echo", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("size"))
		if err != nil || n < 0 || n > len(xs) {
			http.Error(w, "bad size", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(xs[:n])
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
}

// ServeWithEcho serves the HTTP routes and echo on / and /ws at addr, until
// the listener fails.
func ServeWithEcho(addr string, echo http.HandlerFunc) {
	mux := http.NewServeMux()
	Register(mux)
	mux.HandleFunc("/ws", echo)
	mux.HandleFunc("/{$}", echo)
	log.Fatal(ListenAndServe(addr, mux))
}
