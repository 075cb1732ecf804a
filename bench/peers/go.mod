module tern.bench/peers

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/gobwas/ws v1.5.0
	github.com/gorilla/websocket v1.5.3
	github.com/lesismal/nbio v1.6.8
	github.com/valyala/fasthttp v1.78.0
)

require (
	github.com/gobwas/httphead v0.1.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/lesismal/llib v1.2.2 // indirect
	github.com/molecule-man/go-brrr v1.3.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
