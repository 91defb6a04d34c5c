//! Process plumbing both binaries share: structured logs and the shutdown signal.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs JSON logs on stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_json_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_writer(std::io::stderr)
        .init();
}

/// Installs ring as the one rustls crypto provider of the process. Must run first in `main`,
/// before any TLS client or server is built.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Resolves when the process receives SIGTERM or SIGINT, and names the signal.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        // Without signal handlers the process can only be killed; never return early.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
