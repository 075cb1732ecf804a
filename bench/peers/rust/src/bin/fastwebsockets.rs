//! Peer: fastwebsockets (denoland) on a hyper 1.x HTTP/1.1 server.
//!
//! As fastwebsockets' own examples/echo_server.rs: one tokio current_thread
//! runtime (one thread of event processing), a TcpListener, per connection
//! hyper's `http1::Builder::serve_connection(..).with_upgrades()` (keep-alive is
//! hyper's default), and for an upgrade request on `/` or `/ws`
//! `fastwebsockets::upgrade::upgrade`, then a spawned task (in
//! `tokio::task::unconstrained`, as the example does) that reads with a
//! `FragmentCollector` (fragmented messages come whole) and writes each Text or
//! Binary frame back: one final, unmasked frame of the same type. auto_pong and
//! auto_close are on (fastwebsockets' defaults, set explicitly here), so a ping
//! gets a pong and a close gets a close reply from the library. Max message
//! size: the default 64 MiB. No compression (fastwebsockets has none).
//! The same server has the HTTP routes of `tern serve`: GET /ping -> "pong",
//! GET /echo?size=N -> N bytes (N <= 1 MiB, like the Go peers), POST /echo ->
//! the request body (up to 16 MiB). TCP_NODELAY on every accepted socket.
//! SIGTERM keeps its default disposition and ends the process.
//! With `-tls-cert F -tls-key F` the same over TLS (tokio-rustls, ring).
//!
//! Run: fastwebsockets -addr 127.0.0.1:PORT

use std::convert::Infallible;

use fastwebsockets::{upgrade, FragmentCollector, OpCode, WebSocketError};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Method, Request, Response, StatusCode};

/// 1 MiB of 'x' for GET /echo?size=N.
static XS: [u8; 1 << 20] = [b'x'; 1 << 20];

async fn handle_client(fut: upgrade::UpgradeFut) -> Result<(), WebSocketError> {
    let mut ws = fut.await?;
    ws.set_auto_pong(true);
    ws.set_auto_close(true);
    let mut ws = FragmentCollector::new(ws);
    loop {
        let frame = ws.read_frame().await?;
        match frame.opcode {
            OpCode::Close => break,
            OpCode::Text | OpCode::Binary => ws.write_frame(frame).await?,
            _ => {}
        }
    }
    Ok(())
}

fn reply(status: StatusCode, ctype: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    // Full has an exact size hint, so hyper sets Content-Length.
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .body(Full::new(body))
        .unwrap()
}

async fn serve(mut req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    if (path == "/" || path == "/ws") && upgrade::is_upgrade_request(&req) {
        return Ok(match upgrade::upgrade(&mut req) {
            Ok((response, fut)) => {
                tokio::task::spawn(async move {
                    let _ = tokio::task::unconstrained(handle_client(fut)).await;
                });
                response.map(|_| Full::default())
            }
            Err(_) => reply(StatusCode::BAD_REQUEST, "text/plain", Bytes::from_static(b"bad upgrade")),
        });
    }
    let text = "text/plain";
    let bin = "application/octet-stream";
    Ok(match (req.method(), path) {
        (&Method::GET, "/ping") => reply(StatusCode::OK, text, Bytes::from_static(b"pong")),
        (&Method::GET, "/echo") => {
            let size = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("size="))
                .and_then(|v| v.parse::<usize>().ok());
            match size {
                Some(n) if n <= XS.len() => reply(StatusCode::OK, bin, Bytes::from_static(&XS[..n])),
                _ => reply(StatusCode::BAD_REQUEST, text, Bytes::from_static(b"bad size")),
            }
        }
        (&Method::POST, "/echo") => match Limited::new(req.into_body(), 16 << 20).collect().await {
            Ok(body) => reply(StatusCode::OK, bin, body.to_bytes()),
            Err(_) => reply(StatusCode::BAD_REQUEST, text, Bytes::from_static(b"read error")),
        },
        _ => reply(StatusCode::NOT_FOUND, text, Bytes::from_static(b"not found")),
    })
}

async fn connection<S>(stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service_fn(serve))
        .with_upgrades();
    let _ = conn.await;
}

fn main() {
    let args = tern_bench_peers::args("127.0.0.1:9097");
    // -tls-cert/-tls-key: the TLS handshake (tokio-rustls) in the connection's
    // task, then the same hyper connection on the TLS stream
    let tls = args.tls.as_ref().map(|(c, k)| tern_bench_peers::tls_acceptor(c, k));
    tern_bench_peers::serve(args.addr, move |stream| {
        let tls = tls.clone();
        async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(s) = acceptor.accept(stream).await {
                        connection(s).await
                    }
                }
                None => connection(stream).await,
            }
        }
    });
}
