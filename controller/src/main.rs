//! projection-controller. For now: parses its flags, logs, and exits cleanly on SIGTERM.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shared::process::install_crypto_provider();
    let args = cli::Args::parse();
    shared::process::init_json_logs();
    let metrics = cli::bind_address(&args.metrics_bind_address)?;
    let health = cli::bind_address(&args.health_probe_bind_address)?;
    tracing::info!(
        source_mode = ?args.source_mode,
        requeue_interval = ?args.requeue_interval,
        selector_write_concurrency = args.selector_write_concurrency,
        metrics = ?metrics,
        health = ?health,
        leader_elect = args.leader_elect,
        "projection-controller starting"
    );
    let signal = shared::process::shutdown_signal().await;
    tracing::info!(signal, "projection-controller shutting down");
    Ok(())
}
