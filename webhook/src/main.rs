//! projection-webhook: validating and mutating admission for projection.sh resources.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runtime::crypto::install_crypto_provider();
    // `projection-webhook test ...`: the check `helm test` runs in a pod of this image (no shell
    // there to run anything else); the server's flags stay as they are.
    if std::env::args().nth(1).as_deref() == Some("test") {
        let args = webhook::selftest::TestArgs::parse_from(std::env::args().skip(1));
        return webhook::selftest::run(args).await;
    }
    let args = webhook::cli::Args::parse();
    runtime::logs::init_logs().map_err(anyhow::Error::msg)?;
    tracing::info!(
        bind_address = %args.bind_address,
        tls_cert_file = %args.tls_cert_file.display(),
        self_managed_certificate_secret = args.self_managed_certificate_secret.as_deref().unwrap_or(""),
        tenant_mode = args.tenant_mode,
        source_mode = %args.source_mode,
        check_source_access = args.check_source_access,
        "projection-webhook starting"
    );
    webhook::run(args)
        .await
        .inspect_err(|e| tracing::error!(error = format!("{e:#}"), "projection-webhook failed"))
}
