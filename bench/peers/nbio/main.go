// Peer: lesismal/nbio, its nbhttp engine (epoll, non-blocking) with the
// nbhttp/websocket upgrader, set up as nbio's echo example and the nbio
// "nonblocking" server of lesismal/go-websocket-benchmark do it:
// nbhttp.NewEngine with IOModNonBlocking and ReleaseWebsocketPayload, an
// http.ServeMux as the handler, upgrader.OnMessage echoing with
// c.WriteMessage(messageType, data), upgrader.KeepaliveTime 0 (no idle read
// deadline on WebSocket connections). The HTTP routes (internal/routes) go
// through the same engine: nbhttp parses the requests and calls the mux.
//
// Settings: NPoller 1 (one epoll goroutine; the suite runs Go peers with
// GOMAXPROCS=1), compression off (not negotiated), message limit 16 MiB
// (default 4 MiB), MaxWebsocketFramePayloadSize 16 MiB: nbio's WriteMessage
// splits a message into frames of at most this size (default 32 KiB), and
// the spec wants every echo as one frame.
//
// Execution mode: nbio's default, the one the benchmark's nbio_nonblocking
// server uses (it sets no ServerExecutor): the poller goroutine reads and
// parses frames and requests, and each OnMessage / HTTP handler call is
// queued on the connection's ordered job list and run by nbio's goroutine
// pool (taskpool), one job at a time per connection, so echoes stay in
// order. It is the mode nbio ships and its benchmark measures, and the one
// where a slow handler cannot stall the poller; with GOMAXPROCS=1 the
// poller and the pool goroutines still share one P.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lesismal/llib/std/crypto/tls"
	"github.com/lesismal/nbio/nbhttp"
	"github.com/lesismal/nbio/nbhttp/websocket"

	"tern.bench/peers/internal/routes"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9096", "listen address")
	flag.Parse()

	up := websocket.NewUpgrader()
	up.CheckOrigin = func(*http.Request) bool { return true }
	up.EnableCompression(false)
	up.MessageLengthLimit = 16 << 20
	up.KeepaliveTime = 0
	up.OnMessage(func(c *websocket.Conn, messageType websocket.MessageType, data []byte) {
		c.WriteMessage(messageType, data)
	})
	echo := func(w http.ResponseWriter, r *http.Request) {
		if _, err := up.Upgrade(w, r, nil); err != nil {
			return // Upgrade has already answered with an HTTP error
		}
	}

	mux := http.NewServeMux()
	routes.Register(mux)
	mux.HandleFunc("/ws", echo)
	mux.HandleFunc("/{$}", echo)

	cfg := nbhttp.Config{
		Network:                      "tcp",
		Addrs:                        []string{*addr},
		Handler:                      mux,
		IOMod:                        nbhttp.IOModNonBlocking,
		NPoller:                      1,
		ReleaseWebsocketPayload:      true,
		MaxWebsocketFramePayloadSize: 16 << 20,
	}
	if routes.TLS() { // HTTPS/WSS on -addr: nbio's own non-blocking TLS (lesismal/llib tls)
		cfg.AddrsTLS, cfg.Addrs = cfg.Addrs, nil
		cert, err := tls.LoadX509KeyPair(*routes.TLSCert, *routes.TLSKey)
		if err != nil {
			log.Fatal(err)
		}
		cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	engine := nbhttp.NewEngine(cfg)
	if err := engine.Start(); err != nil {
		log.Fatalf("nbio start: %v", err)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	engine.Shutdown(ctx) // closes listeners and connections; gives up after 1 s
}
