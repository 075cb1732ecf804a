//! What both peers share: the command line and the accept loop.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

/// The command line: `-addr HOST:PORT` (Go flag style, also `-addr=HOST:PORT`),
/// resolved here on the main thread so tokio needs no blocking thread for the
/// lookup, and `-tls-cert FILE -tls-key FILE` (PEM) to serve TLS on it.
pub struct Args {
    pub addr: SocketAddr,
    pub tls: Option<(String, String)>,
}

pub fn args(default: &str) -> Args {
    let mut addr = String::from(default);
    let (mut cert, mut key) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-addr" || a == "--addr" {
            addr = args.next().expect("-addr needs HOST:PORT");
        } else if let Some(v) = a.strip_prefix("-addr=").or(a.strip_prefix("--addr=")) {
            addr = v.to_string();
        } else if a == "-tls-cert" {
            cert = Some(args.next().expect("-tls-cert needs FILE"));
        } else if a == "-tls-key" {
            key = Some(args.next().expect("-tls-key needs FILE"));
        } else {
            panic!("unknown argument {a:?}; usage: -addr HOST:PORT [-tls-cert F -tls-key F]");
        }
    }
    let addr = addr
        .to_socket_addrs()
        .expect("bad -addr")
        .next()
        .expect("-addr resolves to nothing");
    Args { addr, tls: cert.zip(key) }
}

/// A rustls server (ring provider, TLS 1.2 and 1.3, ALPN http/1.1) with the
/// certificate chain and key of these PEM files.
pub fn tls_acceptor(cert: &str, key: &str) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs = CertificateDer::pem_file_iter(cert)
        .expect("-tls-cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("-tls-cert");
    let key = PrivateKeyDer::from_pem_file(key).expect("-tls-key");
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("certificate and key");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// Runs `handle` on every connection accepted at `-addr` (or `default`), on
/// one tokio current_thread runtime: one thread of event processing, as the
/// suite wants. TCP_NODELAY is set on every socket, as the other peers do.
pub fn serve<F, Fut>(addr: SocketAddr, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
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
