//! Command-line flags of the admission webhook. The probe and metrics flags have the controller's
//! (and the Go operator's) names.

use crate::error::ConfigError;
use clap::Parser;
use shared::{policy::kind_policy::AllowedPowerKinds, policy::projectable::SourceMode};
use std::{net::SocketAddr, path::PathBuf, time::Duration};

/// projection-webhook: admission webhook for projection.sh resources.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Args {
    /// Address of the HTTPS admission server.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub bind_address: SocketAddr,

    /// PEM certificate chain served to the apiserver; reloaded when it changes. Ignored with
    /// --self-managed-certificate-secret.
    #[arg(long, default_value = "/tls/tls.crt")]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the serving certificate; reloaded when it changes. Ignored with
    /// --self-managed-certificate-secret.
    #[arg(long, default_value = "/tls/tls.key")]
    pub tls_key_file: PathBuf,

    /// How often the certificate files are re-read to pick up a rotation. Ignored with
    /// --self-managed-certificate-secret.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    /// PEM CA bundle of the apiserver's client certificate for webhooks (its admission
    /// configuration's kubeConfigFile). When set, every TLS client must present a certificate
    /// chained to it, and reviews run every check. When not set, no caller is authenticated, and
    /// reviews skip every check that reads the cluster (see docs/webhook.md). Re-read every
    /// --tls-reload-interval: a changed CA verifies new handshakes once it parses.
    #[arg(long, value_name = "PATH")]
    pub client_ca_file: Option<PathBuf>,

    /// Self-managed certificate mode: the webhook creates and rotates its own CA and serving
    /// certificate, keeps them in this Secret (type kubernetes.io/tls; tls.crt, tls.key, ca.crt,
    /// ca.key) in --namespace, and sets the CA as caBundle of the webhook configurations named by
    /// --validating-webhook-configuration / --mutating-webhook-configuration. The TLS file flags are
    /// ignored in this mode.
    #[arg(long, value_name = "NAME")]
    pub self_managed_certificate_secret: Option<String>,

    /// Namespace of the self-managed certificate Secret and of the webhook Service (required with
    /// --self-managed-certificate-secret).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Name of the webhook's Service: the serving certificate is valid for NAME, NAME.NS,
    /// NAME.NS.svc and NAME.NS.svc.<cluster-domain> (required with
    /// --self-managed-certificate-secret).
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,

    /// The cluster's DNS domain, for the serving certificate's longest name.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,

    /// Further names of the serving certificate, DNS names or IP addresses (repeatable or
    /// comma-separated), e.g. 127.0.0.1 for a webhook registered by URL on this host.
    #[arg(long, value_name = "SAN", value_delimiter = ',')]
    pub extra_san: Vec<String>,

    /// ValidatingWebhookConfiguration whose webhooks get the self-managed CA as caBundle.
    #[arg(long, value_name = "NAME")]
    pub validating_webhook_configuration: Option<String>,

    /// MutatingWebhookConfiguration whose webhooks get the self-managed CA as caBundle.
    #[arg(long, value_name = "NAME")]
    pub mutating_webhook_configuration: Option<String>,

    /// Validity of a self-managed serving certificate.
    #[arg(long, default_value = "8760h", value_parser = humantime::parse_duration)]
    pub certificate_validity: Duration,

    /// A self-managed certificate (and the CA) is renewed this long before it expires.
    #[arg(long, default_value = "720h", value_parser = humantime::parse_duration)]
    pub certificate_renew_before: Duration,

    /// Validity of a self-managed CA (tests shorten it to exercise a CA rotation).
    #[arg(long, default_value = "87600h", value_parser = humantime::parse_duration, hide = true)]
    pub ca_validity: Duration,

    /// How long a new CA is only published in the caBundle before serving certificates are issued
    /// by it (tests shorten it).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, hide = true)]
    pub ca_publish_delay: Duration,

    /// Deny ClusterProjection creates and spec changes (namespace tenants only).
    #[arg(long, default_value_t = false)]
    pub tenant_mode: bool,

    /// Kinds that grant power (RBAC Roles and RoleBindings, ServiceAccounts, Endpoints,
    /// EndpointSlices, ServiceAccount token Secrets) that may be projected, comma-separated, e.g.
    /// `RoleBinding.rbac.authorization.k8s.io,Secret/service-account-token`; give the controller
    /// the same list. By default none; projection.sh kinds never.
    #[arg(long, default_value = "", value_parser = |s: &str| s.parse::<AllowedPowerKinds>())]
    pub allow_power_kinds: AllowedPowerKinds,

    /// Which sources may be projected: allowlist (only sources annotated
    /// projection.sh/projectable="true") or permissive (all but those annotated "false").
    #[arg(long, default_value = "allowlist", value_parser = |s: &str| s.parse::<SourceMode>())]
    pub source_mode: SourceMode,

    /// Require the requesting user to be allowed to get the source (SubjectAccessReview), so a
    /// Projection cannot read what its author may not. Runs for authenticated callers only (see
    /// --client-ca-file). Off, reviews also skip every other check that reads the cluster
    /// (projectability, content, other CRs): without it they would tell any writer whether a
    /// source exists and how it is annotated. The controller checks both where copies are made.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub check_source_access: bool,

    /// How long a SubjectAccessReview that allowed a user to get a source is reused for the same
    /// user, groups, extra and source; "0" asks the apiserver every time. Denials are never
    /// reused. A revoked permission can still be used for at most this long.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub access_review_cache_ttl: Duration,

    /// Most bytes the kept SubjectAccessReview grants may take in all (each counted with its user,
    /// uid, groups and extra); the grants closest to expiring go first. A grant whose question is
    /// over 4 KiB (a forged userInfo) is never kept. "0" keeps nothing.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub access_review_cache_bytes: usize,

    /// How long a read of a source's metadata that let a projection in is reused for the same
    /// source; "0" reads it from the apiserver every time. Only reads that allow are reused: a
    /// source that is missing, not opted in or opted out is read again, so an opt-in takes effect
    /// at once, while an opt-out lets Projections in for at most this long (the controller still
    /// refuses to copy from it).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub source_metadata_cache_ttl: Duration,

    /// Address of the Prometheus metrics endpoint; "0" disables it.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// The metrics endpoint over HTTPS (`--metrics-cert-file`, `--metrics-key-file`).
    #[command(flatten)]
    pub metrics_tls: runtime::tls::MetricsTlsArgs,

    /// After SIGTERM: how long to keep serving while not ready, so endpoints drop this pod first.
    /// 5 s proved short on a loaded 2-core node: one admission in 2188 during a rollout reached a
    /// pod that had already closed its connections.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,

    /// After the shutdown delay: how long in-flight requests may take to finish.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Connections the admission server serves at once. Beyond this it stops accepting: new
    /// connections wait in the kernel's listen queue until one ends (an apiserver keeps a few).
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,

    /// Connections served at once from one IP address other than the apiserver's (--apiserver-cidrs);
    /// more are closed at once, so that one client (a pod) cannot take every connection. Mind a
    /// proxy in front of the webhook (e.g. konnectivity), through which every apiserver connection
    /// comes from one address: list that address in --apiserver-cidrs.
    #[arg(long, default_value_t = 64)]
    pub max_connections_per_peer: usize,

    /// The addresses the apiserver's calls come from, as CIDR blocks or single addresses
    /// (repeatable or comma-separated). Connections from them have no share per address and may
    /// use --apiserver-reserved-connections that no other address may; empty: the apiserver is
    /// not told apart.
    #[arg(long = "apiserver-cidrs", value_name = "CIDR", value_delimiter = ',')]
    pub apiserver_cidrs: Vec<runtime::cidr::Cidr>,

    /// Connections of --max-connections kept for --apiserver-cidrs: while only these are left, a
    /// connection from another address is closed at once. Nothing is reserved without --apiserver-cidrs.
    #[arg(long, default_value_t = 64)]
    pub apiserver_reserved_connections: usize,

    /// Reviews handled at once, in units: a review counts one, plus one per 256 KiB of its body (a
    /// 4 MiB body counts 17), so the memory of bodies in flight stays bounded. A small body (at most
    /// 32 KiB announced, what the apiserver sends) takes its unit only once it has arrived whole; a
    /// larger one, or one of unknown length, takes its units before it is read, from at most half
    /// of the limit. A review over the limit is answered at once: HTTP 429 with Retry-After and an
    /// AdmissionReview denying with code 429 "webhook overloaded, retry".
    #[arg(long, default_value_t = 64)]
    pub max_in_flight_reviews: u32,

    /// Time a client has for its TLS handshake and its first request's headers, and for the
    /// headers of any HTTP/1.1 request once started.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,

    /// A connection without a request in flight for this long is closed (HTTP/2: GOAWAY). This also
    /// ends an HTTP/2 client stalled in the middle of a request's headers.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Longest wait for the whole body of a review, from the end of its headers (HTTP 408 after).
    /// The apiserver sends a review in one go: a client still sending after this is cut off.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,

    /// HTTP/2 streams one connection may have open at once. The apiserver opens another connection
    /// when it needs more.
    #[arg(long, default_value_t = 8)]
    pub http2_max_concurrent_streams: u32,

    /// HTTP/2: a PING after this long without a frame from the client ...
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub http2_keep_alive_interval: Duration,

    /// ... which must be answered within this long, or the connection is closed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub http2_keep_alive_timeout: Duration,

    /// Largest request header list in bytes (HTTP/2, decoded).
    #[arg(long, default_value_t = 32 * 1024)]
    pub max_header_list_size: u32,

    /// HTTP/2 streams a client may reset before they are answered before its connection is closed
    /// (the "rapid reset" attack).
    #[arg(long, default_value_t = 20)]
    pub http2_max_pending_reset_streams: usize,
}

/// HTTP/2 flow-control window per stream: how much of a body a client may send ahead of the handler.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// ... and per connection: with the connection cap, a bound of what unread bodies can hold.
const CONNECTION_WINDOW_BYTES: u32 = 512 * 1024;

impl Args {
    /// The admission server's limits from the flags.
    pub fn server_limits(&self) -> runtime::serve::Limits {
        runtime::serve::Limits {
            max_connections: self.max_connections.max(1),
            max_connections_per_peer: self.max_connections_per_peer.max(1),
            apiserver: self.apiserver_cidrs.clone(),
            reserved_connections: self.apiserver_reserved_connections,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            max_concurrent_streams: self.http2_max_concurrent_streams.max(1),
            keep_alive_interval: self.http2_keep_alive_interval,
            keep_alive_timeout: self.http2_keep_alive_timeout,
            max_header_list_size: self.max_header_list_size,
            max_pending_reset_streams: self.http2_max_pending_reset_streams,
            stream_window_bytes: STREAM_WINDOW_BYTES,
            connection_window_bytes: CONNECTION_WINDOW_BYTES,
        }
    }
}

/// What the self-managed certificate mode needs, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfManagedArgs {
    /// The Secret holding the CA and the serving pair.
    pub secret: String,
    /// Its namespace, and the Service's.
    pub namespace: String,
    /// The names and addresses the serving certificate must carry.
    pub names: crate::certs::SubjectNames,
    /// The webhook configurations whose caBundle is kept current.
    pub validating_configuration: Option<String>,
    /// See `validating_configuration`.
    pub mutating_configuration: Option<String>,
    /// Lifetimes.
    pub lifetimes: crate::certs::Lifetimes,
}

impl Args {
    /// The self-managed certificate settings, `None` when the mode is off; an error names the
    /// missing or wrong flag.
    pub fn self_managed(&self) -> Result<Option<SelfManagedArgs>, ConfigError> {
        let Some(secret) = self.self_managed_certificate_secret.clone() else {
            return Ok(None);
        };
        let required = |value: &Option<String>, flag: &'static str| {
            value
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or(ConfigError::Missing { flag })
        };
        let namespace = required(
            &self.namespace,
            "--namespace (or the POD_NAMESPACE environment variable)",
        )?;
        let service = required(&self.service_name, "--service-name")?;
        check_dns_label("--self-managed-certificate-secret", &secret, 253)?;
        check_dns_label("--namespace", &namespace, 63)?;
        check_dns_label("--service-name", &service, 63)?;
        if self.validating_webhook_configuration.is_none() && self.mutating_webhook_configuration.is_none() {
            return Err(ConfigError::NoWebhookConfiguration);
        }
        let lifetimes = crate::certs::Lifetimes {
            validity: self.certificate_validity,
            renew_before: self.certificate_renew_before,
            ca_validity: self.ca_validity,
            ca_publish_delay: self.ca_publish_delay,
        };
        if lifetimes.renew_before >= lifetimes.validity {
            return Err(ConfigError::RenewBeforeTooLong {
                flag: "--certificate-validity",
                renew_before: lifetimes.renew_before,
                validity: lifetimes.validity,
            });
        }
        if lifetimes.renew_before >= lifetimes.ca_validity {
            return Err(ConfigError::RenewBeforeTooLong {
                flag: "--ca-validity",
                renew_before: lifetimes.renew_before,
                validity: lifetimes.ca_validity,
            });
        }
        let names = crate::certs::SubjectNames::for_service(
            &service,
            &namespace,
            &self.cluster_domain,
            &self.extra_san,
        )
        .map_err(|value| ConfigError::BadName {
            flag: "--extra-san or --cluster-domain",
            value,
        })?;
        Ok(Some(SelfManagedArgs {
            secret,
            namespace,
            names,
            validating_configuration: self.validating_webhook_configuration.clone(),
            mutating_configuration: self.mutating_webhook_configuration.clone(),
            lifetimes,
        }))
    }
}

/// A Kubernetes object name of at most `max` lowercase alphanumerics, `-` and `.`, starting and
/// ending with an alphanumeric (a DNS-1123 label when `max` is 63 and there is no dot).
fn check_dns_label(flag: &'static str, value: &str, max: usize) -> Result<(), ConfigError> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let dots_allowed = max > 63;
    let ok = !value.is_empty()
        && value.len() <= max
        && value.starts_with(alnum)
        && value.ends_with(alnum)
        && value
            .chars()
            .all(|c| alnum(c) || c == '-' || (dots_allowed && c == '.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadName {
            flag,
            value: value.to_owned(),
        })
    }
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
        assert_eq!(args.access_review_cache_ttl, Duration::from_secs(5));
        assert_eq!(args.access_review_cache_bytes, 4 * 1024 * 1024);
        assert_eq!(args.client_ca_file, None);
        assert_eq!(args.source_mode, SourceMode::Allowlist);
        assert_eq!(args.tls_reload_interval, Duration::from_secs(1));
        assert_eq!(args.self_managed_certificate_secret, None);
        assert_eq!(args.cluster_domain, "cluster.local");
        assert_eq!(args.certificate_validity, Duration::from_secs(8760 * 3600));
        assert_eq!(args.certificate_renew_before, Duration::from_secs(720 * 3600));
        assert_eq!(args.ca_validity, Duration::from_secs(87600 * 3600));
        assert!(args.extra_san.is_empty());
        assert_eq!(args.self_managed().expect("file mode"), None);
        let limits = args.server_limits();
        assert_eq!(limits.max_connections, 256);
        assert_eq!(limits.max_connections_per_peer, 64);
        assert_eq!(limits.header_timeout, Duration::from_secs(10));
        assert_eq!(limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(limits.max_concurrent_streams, 8);
        assert_eq!(args.max_in_flight_reviews, 64);
        assert_eq!(args.body_timeout, Duration::from_secs(3));
        assert!(limits.apiserver.is_empty());
        assert_eq!(limits.pools(), (256, 0), "nothing reserved for unknown addresses");
    }

    #[test]
    fn the_apiservers_addresses_get_reserved_connections() {
        let args = Args::parse_from([
            "projection-webhook",
            "--apiserver-cidrs",
            "10.0.0.0/24,198.18.0.1",
            "--apiserver-cidrs=fd00::/64",
            "--apiserver-reserved-connections=32",
        ]);
        let limits = args.server_limits();
        let cidrs: Vec<String> = limits.apiserver.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.0.0.0/24", "198.18.0.1/32", "fd00::/64"]);
        assert_eq!(limits.pools(), (224, 32));
        let err = Args::try_parse_from(["projection-webhook", "--apiserver-cidrs", "10.0.0.0/40"])
            .expect_err("a bad block is refused");
        assert!(err.to_string().contains("--apiserver-cidrs"), "{err}");
    }

    /// A self-managed command line: the required flags, with `changes` replacing (or, with an
    /// empty value, removing) some and adding others.
    fn self_managed_args(changes: &[(&str, &str)]) -> Args {
        let mut flags = vec![
            ("--self-managed-certificate-secret", "projection-webhook-tls"),
            ("--namespace", "projection-system"),
            ("--service-name", "projection-webhook"),
            ("--validating-webhook-configuration", "projection-validating"),
        ];
        for (flag, value) in changes {
            flags.retain(|(f, _)| f != flag);
            if !value.is_empty() {
                flags.push((flag, value));
            }
        }
        let argv = flags.iter().map(|(flag, value)| format!("{flag}={value}"));
        Args::parse_from(std::iter::once("projection-webhook".to_owned()).chain(argv))
    }

    #[test]
    fn self_managed_mode_collects_its_settings() {
        let args = self_managed_args(&[
            ("--mutating-webhook-configuration", "projection-mutating"),
            ("--cluster-domain", "corp.internal"),
            ("--certificate-validity", "30s"),
            ("--certificate-renew-before", "20s"),
        ]);
        let repeated = Args::parse_from([
            "projection-webhook",
            "--extra-san",
            "127.0.0.1,webhook.example.com",
            "--extra-san=::1",
        ]);
        let args = Args {
            extra_san: repeated.extra_san,
            ..args
        };
        let settings = args.self_managed().expect("valid").expect("self-managed");
        assert_eq!(settings.secret, "projection-webhook-tls");
        assert_eq!(settings.namespace, "projection-system");
        assert_eq!(
            settings.validating_configuration.as_deref(),
            Some("projection-validating")
        );
        assert_eq!(
            settings.mutating_configuration.as_deref(),
            Some("projection-mutating")
        );
        assert_eq!(settings.lifetimes.validity, Duration::from_secs(30));
        assert_eq!(settings.lifetimes.renew_before, Duration::from_secs(20));
        let dns: Vec<&str> = settings.names.dns.iter().map(String::as_str).collect();
        assert_eq!(
            dns,
            [
                "projection-webhook",
                "projection-webhook.projection-system",
                "projection-webhook.projection-system.svc",
                "projection-webhook.projection-system.svc.corp.internal",
                "webhook.example.com",
            ]
        );
        let ips: Vec<String> = settings.names.ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["127.0.0.1", "::1"]);
    }

    #[test]
    fn self_managed_mode_names_each_missing_flag() {
        for flag in [
            "--service-name",
            "--validating-webhook-configuration",
            "--namespace",
        ] {
            let args = self_managed_args(&[(flag, "")]);
            if flag == "--namespace" && args.namespace.is_some() {
                continue; // POD_NAMESPACE is set where this runs: the flag is not missing
            }
            let err = args.self_managed().expect_err("incomplete settings are refused");
            assert!(err.to_string().contains(flag), "{flag}: {err}");
        }
        // Either configuration will do.
        let args = self_managed_args(&[
            ("--validating-webhook-configuration", ""),
            ("--mutating-webhook-configuration", "m"),
        ]);
        assert!(args.self_managed().is_ok());
    }

    #[test]
    fn self_managed_mode_refuses_bad_values_naming_the_flag() {
        for (flag, value, named) in [
            ("--certificate-renew-before", "9000h", "--certificate-validity"),
            ("--certificate-renew-before", "87600h", "--certificate-validity"),
            ("--service-name", "Web_Hook", "--service-name"),
            ("--namespace", "-x", "--namespace"),
            ("--extra-san", "not a name", "--extra-san"),
            ("--cluster-domain", "bad_domain", "--cluster-domain"),
        ] {
            let args = self_managed_args(&[(flag, value)]);
            let err = args.self_managed().expect_err("refused");
            assert!(err.to_string().contains(named), "{flag}={value}: {err}");
        }
    }

    #[test]
    fn the_tls_file_flags_say_they_are_ignored_in_self_managed_mode() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert_eq!(help.matches("Ignored with").count(), 3, "{help}");
        assert!(!help.contains("--ca-validity"), "hidden");
    }

    #[test]
    fn source_access_check_can_be_turned_off() {
        let args = Args::parse_from(["projection-webhook", "--check-source-access=false"]);
        assert!(!args.check_source_access);
        let args = Args::parse_from(["projection-webhook", "--check-source-access"]);
        assert!(args.check_source_access);
    }

    #[test]
    fn the_access_review_cache_can_be_shortened_or_turned_off() {
        let args = Args::parse_from(["projection-webhook", "--access-review-cache-ttl=0"]);
        assert_eq!(args.access_review_cache_ttl, Duration::ZERO);
        let args = Args::parse_from(["projection-webhook", "--access-review-cache-ttl", "500ms"]);
        assert_eq!(args.access_review_cache_ttl, Duration::from_millis(500));
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        for bad in [
            vec!["--bind-address", "nowhere"],
            vec!["--source-mode", "open"],
            vec!["--shutdown-delay", "soon"],
            vec!["--certificate-validity", "a year"],
            vec!["--certificate-renew-before", "a fortnight"],
            vec!["--access-review-cache-ttl", "a while"],
        ] {
            let err = Args::try_parse_from(std::iter::once("projection-webhook").chain(bad.clone()))
                .expect_err("bad value must be refused");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }
}
