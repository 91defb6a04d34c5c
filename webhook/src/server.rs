//! The HTTPS accept loop: TCP, a TLS handshake bounded in time, then HTTP/1.1 or HTTP/2 (ALPN) into
//! the axum router. On shutdown it stops accepting and lets in-flight requests finish (idle
//! keep-alive connections are closed), up to a drain timeout.

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto::Builder, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use rustls::ServerConfig;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A client that opens a connection and never finishes the handshake gives up its slot after this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that never finishes its request headers gives up its slot after this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then drains for up to
/// `drain_timeout`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut http = Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (acceptor, app, http, watcher) =
            (acceptor.clone(), app.clone(), http.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let connection = http
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("in-flight requests drained"),
        () = tokio::time::sleep(drain_timeout) => tracing::warn!(?drain_timeout, "drain timeout; closing remaining connections"),
    }
}
