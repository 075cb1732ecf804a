// Package routes holds what every Go net/http-based peer serves: the same
// three HTTP routes as `tern serve` (GET /ping, GET /echo?size=N, POST
// /echo), and the WebSocket echo handler on / and /ws.
package routes

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"strconv"
)

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
	log.Fatal(http.ListenAndServe(addr, mux))
}
