//! Peer: tokio-tungstenite WebSocket echo (WebSocket only, no HTTP routes).
//!
//! One tokio current_thread runtime (one thread of event processing), a
//! TcpListener, and per connection a task that does
//! `tokio_tungstenite::accept_async` (any request path is accepted) and then the
//! plain echo loop: `ws.next()` a message, `ws.send()` it back (send = write +
//! flush). Text and binary messages are echoed as one frame of the same type;
//! Ping/Pong/Close are left to tungstenite, which queues the pong or the close
//! reply itself and flushes it on the next read or write. Settings: the library
//! defaults (WebSocketConfig: messages up to 64 MiB, frames up to 16 MiB, 128 KiB
//! read buffer, 128 KiB write buffer; no permessage-deflate, which tungstenite
//! does not negotiate), TCP_NODELAY on every accepted socket as the other
//! peers have. SIGTERM keeps its default disposition and ends the process.
//!
//! Run: tokio-tungstenite -addr 127.0.0.1:PORT

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;

async fn echo(stream: TcpStream) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let mut ws = tokio_tungstenite::accept_async(stream).await?;
    while let Some(msg) = ws.next().await {
        let msg = msg?;
        if msg.is_text() || msg.is_binary() {
            ws.send(msg).await?;
        }
    }
    Ok(())
}

fn main() {
    let args = tern_bench_peers::args("127.0.0.1:9096");
    if args.tls.is_some() {
        eprintln!("tokio-tungstenite: no TLS in this peer (bench/run leaves it out of wss-echo)");
        std::process::exit(2);
    }
    tern_bench_peers::serve(args.addr, |stream| async move {
        let _ = echo(stream).await;
    });
}
