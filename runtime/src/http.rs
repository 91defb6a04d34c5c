//! The HTTP endpoints of both services: `/metrics` (OpenMetrics text to scrapers that ask for
//! it, the classic Prometheus text format to the others) on the metrics address, over HTTPS when
//! given a certificate ([`crate::tls::MetricsTlsArgs`]), `/healthz` and `/readyz` on the probe
//! address, always plain HTTP for the kubelet (both on one listener when the addresses are equal,
//! which HTTPS metrics refuse). Both run the limited accept loop of [`crate::serve`] with
//! [`crate::serve::Limits::PROBES`].

use crate::metrics_format;
use anyhow::Context;
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header::ACCEPT},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::registry::Registry;
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

/// How long a scrape or probe in flight at shutdown may take to finish.
const PROBES_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Parses a Go-style bind address (`:8080`, `127.0.0.1:8080`, `0` for disabled).
pub fn bind_address(value: &str) -> Result<Option<SocketAddr>, std::net::AddrParseError> {
    match value {
        "" | "0" => Ok(None),
        v if v.starts_with(':') => format!("0.0.0.0{v}").parse().map(Some),
        v => v.parse().map(Some),
    }
}

/// Whether the process is ready to serve (watches synced, not shutting down).
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Sets readiness.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let mut body = String::new();
    if prometheus_client::encoding::text::encode(&mut body, &state.registry).is_err() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            String::new(),
        );
    }
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    if metrics_format::wants_openmetrics(accept) {
        (
            StatusCode::OK,
            [("content-type", metrics_format::OPENMETRICS_CONTENT_TYPE)],
            body,
        )
    } else {
        (
            StatusCode::OK,
            [("content-type", metrics_format::CLASSIC_CONTENT_TYPE)],
            metrics_format::openmetrics_to_classic(&body),
        )
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.readiness.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Whether metrics served over HTTPS have an address of their own: not disabled, and not the
/// probes' (which stay plain HTTP for the kubelet).
pub fn check_https_metrics_address(
    metrics_addr: Option<SocketAddr>,
    probe_addr: Option<SocketAddr>,
) -> anyhow::Result<()> {
    match metrics_addr {
        None => anyhow::bail!("--metrics-cert-file is set but --metrics-bind-address disables the metrics"),
        Some(m) if Some(m) == probe_addr => anyhow::bail!(
            "--metrics-cert-file needs a --metrics-bind-address apart from --health-probe-bind-address: the probes stay plain HTTP"
        ),
        Some(_) => Ok(()),
    }
}

/// Binds the endpoints' addresses, then returns the server, which serves them until `shutdown`
/// resolves; `/metrics` over HTTPS with `metrics_tls`. An address that cannot be bound (a port
/// already taken) is an error here, naming the address and what it is for, so that the process
/// ends at its start instead of running on with no probes and no metrics.
pub async fn serve(
    (metrics_addr, metrics_tls): (Option<SocketAddr>, Option<Arc<rustls::ServerConfig>>),
    probe_addr: Option<SocketAddr>,
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: tokio_util::sync::WaitForCancellationFutureOwned,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static> {
    let state = AppState { registry, readiness };
    let metrics_routes = Router::new().route("/metrics", get(metrics));
    let probe_routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if metrics_tls.is_some() {
        check_https_metrics_address(metrics_addr, probe_addr)?;
    }
    let mut servers = Vec::new();
    match (metrics_addr, probe_addr) {
        (Some(m), Some(p)) if m == p => servers.push((
            m,
            "the metrics and probes",
            metrics_routes.merge(probe_routes),
            None,
        )),
        (m, p) => {
            servers.extend(m.map(|m| (m, "the metrics", metrics_routes, metrics_tls)));
            servers.extend(p.map(|p| (p, "the probes", probe_routes, None)));
        }
    }
    let mut bound = Vec::new();
    for (addr, purpose, router, tls) in servers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for {purpose}"))?;
        bound.push((listener, router, tls));
    }
    Ok(run(bound, state, shutdown))
}

/// Serves the bound listeners until `shutdown` resolves.
async fn run(
    bound: Vec<(
        tokio::net::TcpListener,
        Router<AppState>,
        Option<Arc<rustls::ServerConfig>>,
    )>,
    state: AppState,
    shutdown: tokio_util::sync::WaitForCancellationFutureOwned,
) -> anyhow::Result<()> {
    let shutdown = futures::FutureExt::shared(shutdown);
    let mut tasks = Vec::new();
    for (listener, router, tls) in bound {
        let app = router.with_state(state.clone());
        // The probe servers' limit hits are not exported: their clients are the kubelet and a
        // scraper.
        let (limits, hits) = (crate::serve::Limits::PROBES, crate::serve::LimitHits::default());
        let task = match tls {
            Some(config) => {
                tracing::info!(address = %listener.local_addr()?, "serving HTTPS");
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                let handshake = move |tcp, peer: SocketAddr| {
                    let acceptor = acceptor.clone();
                    async move {
                        match acceptor.accept(tcp).await {
                            Ok(stream) => Some((stream, ())),
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                None
                            }
                        }
                    }
                };
                tokio::spawn(crate::serve::serve(
                    listener,
                    limits,
                    hits,
                    handshake,
                    app,
                    shutdown.clone(),
                    PROBES_DRAIN_TIMEOUT,
                ))
            }
            None => {
                tracing::info!(address = %listener.local_addr()?, "serving HTTP");
                // Plain HTTP: the TCP stream is the connection; no identity to carry.
                let plain = |tcp: tokio::net::TcpStream, _| async move { Some((tcp, ())) };
                tokio::spawn(crate::serve::serve(
                    listener,
                    limits,
                    hits,
                    plain,
                    app,
                    shutdown.clone(),
                    PROBES_DRAIN_TIMEOUT,
                ))
            }
        };
        tasks.push(task);
    }
    for task in tasks {
        task.await?;
    }
    Ok(())
}
