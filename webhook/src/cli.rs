//! Command-line flags of the admission webhook. The probe and metrics flags have the controller's
//! (and the Go operator's) names.

use clap::Parser;
use shared::policy::SourceMode;
use std::{net::SocketAddr, path::PathBuf, time::Duration};

/// projection-webhook: admission webhook for projection.sh resources.
#[derive(Parser, Debug, Clone)]
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

    /// How often the certificate files are re-read to pick up a rotation.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    /// Deny ClusterProjection creates and spec changes (namespace tenants only).
    #[arg(long, default_value_t = false)]
    pub tenant_mode: bool,

    /// Which sources may be projected: allowlist (only sources annotated
    /// projection.sh/projectable="true") or permissive (all but those annotated "false").
    #[arg(long, default_value = "allowlist", value_parser = |s: &str| s.parse::<SourceMode>())]
    pub source_mode: SourceMode,

    /// Require the requesting user to be allowed to get the source (SubjectAccessReview), so a
    /// Projection cannot read what its author may not.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub check_source_access: bool,

    /// Address of the Prometheus metrics endpoint; "0" disables it.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// After SIGTERM: how long to keep serving while not ready, so endpoints drop this pod first.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,

    /// After the shutdown delay: how long in-flight requests may take to finish.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let args = Args::parse_from(["projection-webhook"]);
        assert_eq!(args.bind_address, "0.0.0.0:9443".parse().unwrap());
        assert!(!args.tenant_mode);
        assert!(args.check_source_access);
        assert_eq!(args.source_mode, SourceMode::Allowlist);
        assert_eq!(args.tls_reload_interval, Duration::from_secs(1));
    }

    #[test]
    fn source_access_check_can_be_turned_off() {
        let args = Args::parse_from(["projection-webhook", "--check-source-access=false"]);
        assert!(!args.check_source_access);
        let args = Args::parse_from(["projection-webhook", "--check-source-access"]);
        assert!(args.check_source_access);
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        for bad in [
            vec!["--bind-address", "nowhere"],
            vec!["--source-mode", "open"],
            vec!["--shutdown-delay", "soon"],
        ] {
            let err = Args::try_parse_from(std::iter::once("projection-webhook").chain(bad.clone()))
                .expect_err("bad value must be refused");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }
}
