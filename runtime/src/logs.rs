//! Structured logs of both services.

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
