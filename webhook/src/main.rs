//! projection-webhook. For now: parses its flags, logs, and exits cleanly on SIGTERM.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shared::process::install_crypto_provider();
    let args = cli::Args::parse();
    shared::process::init_json_logs();
    tracing::info!(
        bind_address = %args.bind_address,
        tls_cert_file = %args.tls_cert_file.display(),
        tenant_mode = args.tenant_mode,
        "projection-webhook starting"
    );
    let signal = shared::process::shutdown_signal().await;
    tracing::info!(signal, "projection-webhook shutting down");
    Ok(())
}
