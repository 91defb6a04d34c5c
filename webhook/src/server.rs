//! The HTTPS admission server: TCP, a TLS handshake bounded in time, then HTTP/1.1 or HTTP/2 (ALPN)
//! into the axum router, through the limited accept loop of `runtime::serve` (connection cap, room
//! reserved for the apiserver, header, idle and HTTP/2 limits). Each request carries the [`Caller`]
//! its connection's TLS handshake established. On shutdown it stops accepting and lets in-flight requests finish (idle
//! keep-alive connections are closed), up to a drain timeout.

use axum::Router;
use runtime::serve::{LimitHits, Limits};
use rustls::ServerConfig;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Who sent a request, as far as TLS proved it: an extension of every request the server hands the
/// router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The client presented a certificate chained to the `--client-ca-file` CA (rustls verified
    /// it during the handshake; without that flag no client is ever verified).
    pub verified: bool,
}

/// Serves `app` over TLS on `listener` within `limits` (counting each limit hit in `hits`) until
/// `shutdown` resolves, then drains for up to `drain_timeout`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    limits: Limits,
    hits: LimitHits,
    app: Router,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let handshake = move |tcp, peer| {
        let acceptor = acceptor.clone();
        async move {
            match acceptor.accept(tcp).await {
                Ok(stream) => {
                    // With a client verifier configured, rustls only completes handshakes whose
                    // certificate it verified; without one it never asks for a certificate.
                    let verified = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .is_some_and(|c| !c.is_empty());
                    Some((stream, Caller { verified }))
                }
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    None
                }
            }
        }
    };
    runtime::serve::serve(listener, limits, hits, handshake, app, shutdown, drain_timeout).await;
}
