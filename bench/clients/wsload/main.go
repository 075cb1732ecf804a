// wsload: a WebSocket echo load generator for bench/ws.sh. It opens -conns
// connections, and each keeps -depth messages of -size bytes in flight:
// send, wait for the echo, check it, send the next. After -duration it
// prints the echoes per second over all connections, and fails when an
// echo differs from what was sent.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8080/ws", "server URL")
	conns := flag.Int("conns", 100, "connections")
	size := flag.Int("size", 64, "message size in bytes")
	depth := flag.Int("depth", 1, "messages in flight per connection")
	duration := flag.Duration("duration", 5*time.Second, "how long to measure")
	binary := flag.Bool("binary", false, "binary messages (default text)")
	flag.Parse()

	msg := bytes.Repeat([]byte("m"), *size)
	typ := websocket.TextMessage
	if *binary {
		typ = websocket.BinaryMessage
	}
	dialer := websocket.Dialer{ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	cs := make([]*websocket.Conn, *conns)
	for i := range cs {
		c, _, err := dialer.Dial(*url, nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wsload: dial %d: %v\n", i, err)
			os.Exit(1)
		}
		cs[i] = c
	}
	var count atomic.Int64
	var bad atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range cs {
		wg.Add(2)
		sem := make(chan struct{}, *depth)
		go func(c *websocket.Conn) { // writer
			defer wg.Done()
			for {
				select {
				case sem <- struct{}{}:
				case <-done:
					return
				}
				if err := c.WriteMessage(typ, msg); err != nil {
					return
				}
			}
		}(c)
		go func(c *websocket.Conn) { // reader
			defer wg.Done()
			for {
				_, got, err := c.ReadMessage()
				if err != nil {
					return
				}
				if !bytes.Equal(got, msg) {
					bad.Add(1)
				}
				count.Add(1)
				<-sem
			}
		}(c)
	}
	time.Sleep(*duration)
	n := count.Load()
	elapsed := time.Since(start)
	close(done)
	for _, c := range cs {
		c.Close()
	}
	wg.Wait()
	if bad.Load() > 0 {
		fmt.Fprintf(os.Stderr, "wsload: %d echoes differed\n", bad.Load())
		os.Exit(1)
	}
	fmt.Printf("%.0f\n", float64(n)/elapsed.Seconds())
}
