//! Structured logs of both services.

use tracing_subscriber::{EnvFilter, fmt};

/// What is logged unless `RUST_LOG` says otherwise: `info`, except kube's watcher below ERROR. Our
/// watch tasks log each watch error once with the apiserver's message; kube's watcher would log the
/// same error again at WARN as a `Debug` dump of the apiserver's answer.
pub const DEFAULT_FILTER: &str = "info,kube_runtime::watcher=error";

/// Installs JSON logs on stderr, filtered by `RUST_LOG` (default [`DEFAULT_FILTER`]).
pub fn init_json_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_writer(std::io::stderr)
        .init();
}
