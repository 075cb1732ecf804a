//! What both peers share: the command line.

use std::net::{SocketAddr, ToSocketAddrs};

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
