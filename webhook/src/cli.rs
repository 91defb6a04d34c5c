//! Command-line flags of the admission webhook.

use clap::Parser;
use std::{net::SocketAddr, path::PathBuf};

/// projection-webhook: admission webhook for projection.sh resources.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// Address of the HTTPS admission server.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub bind_address: SocketAddr,

    /// PEM certificate chain served to the apiserver; reloaded when it changes.
    #[arg(long, default_value = "/tls/tls.crt")]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the serving certificate; reloaded when it changes.
    #[arg(long, default_value = "/tls/tls.key")]
    pub tls_key_file: PathBuf,

    /// Deny ClusterProjection creates and updates (namespace tenants only).
    #[arg(long, default_value_t = false)]
    pub tenant_mode: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let args = Args::parse_from(["projection-webhook"]);
        assert_eq!(args.bind_address, "0.0.0.0:9443".parse().unwrap());
        assert!(!args.tenant_mode);
    }

    #[test]
    fn rejects_a_bad_bind_address_naming_the_flag() {
        let err = Args::try_parse_from(["projection-webhook", "--bind-address", "nowhere"]).unwrap_err();
        assert!(err.to_string().contains("--bind-address"), "{err}");
    }
}
