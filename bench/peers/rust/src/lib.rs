//! What both peers share: the command line and the accept loop.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};

use tokio::net::{TcpListener, TcpStream};

/// `-addr HOST:PORT` (Go flag style, also `-addr=HOST:PORT`), resolved here
/// on the main thread so tokio needs no blocking thread for the lookup.
pub fn addr_arg(default: &str) -> SocketAddr {
    let mut addr = String::from(default);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-addr" || a == "--addr" {
            addr = args.next().expect("-addr needs HOST:PORT");
        } else if let Some(v) = a.strip_prefix("-addr=").or(a.strip_prefix("--addr=")) {
            addr = v.to_string();
        } else {
            panic!("unknown argument {a:?}; usage: -addr HOST:PORT");
        }
    }
    addr.to_socket_addrs()
        .expect("bad -addr")
        .next()
        .expect("-addr resolves to nothing")
}

/// Runs `handle` on every connection accepted at `-addr` (or `default`), on
/// one tokio current_thread runtime: one thread of event processing, as the
/// suite wants. TCP_NODELAY is set on every socket, as the other peers do.
pub fn serve<F, Fut>(default: &str, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let addr = addr_arg(default);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).await.expect("bind");
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(_) => continue, // e.g. EMFILE: try again
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(handle(stream));
        }
    });
}
