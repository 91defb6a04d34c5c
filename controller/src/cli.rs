//! Command-line flags. Names and defaults follow the Go operator so manifests carry over.

use crate::author_access::AuthorAccessMode;
use crate::initial_list::InitialList;
use clap::Parser;
use clap::builder::TypedValueParser;
use shared::policy::write_as::WriteCopiesAs;
use shared::{
    copy::recreate::RecreateKinds, policy::kind_policy::AllowedPowerKinds, policy::projectable::SourceMode,
};
use std::time::Duration;

/// projection-controller: mirrors namespaced objects for Projection and ClusterProjection.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// Which sources may be projected: allowlist (only sources annotated
    /// projection.sh/projectable="true") or permissive (all but those annotated "false").
    #[arg(long, default_value = "allowlist", value_parser = |s: &str| s.parse::<SourceMode>())]
    pub source_mode: SourceMode,

    /// Cap of the exponential backoff after a failed reconcile (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub requeue_interval: Duration,

    /// Maximum parallel writes of one ClusterProjection's fan-out (1 to 256).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub selector_write_concurrency: u16,

    /// Reconciles running at once (1 to 1024); each CR is still reconciled by one at a time.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_concurrent_reconciles: u16,

    /// Who checks each CR's author (recorded at admission in projection.sh/author). enforce: this
    /// controller, at every pass, before it writes: may the author get the source and create its
    /// kind where the copies go (SubjectAccessReview), whatever the webhook did. trusted (the Go
    /// operator's behaviour): no author is checked here and copies are made with the controller's
    /// own access; the only check left is the webhook's at admission (may the writer get the
    /// source), which it makes only for callers it authenticates (--client-ca-file) with
    /// --check-source-access, while it is up, for kinds served at admission. Nobody then checks
    /// that the author may create the copies. The chart refuses trusted without those.
    #[arg(long, value_enum, default_value = "enforce")]
    pub author_access: AuthorAccessMode,

    /// Who creates and updates the copies (with --author-access=enforce; trusted: the controller).
    /// author: the CR's recorded author, by constrained impersonation (Kubernetes v1.36+), so the
    /// apiserver's RBAC and every admission policy decide each write as the author's own; the
    /// controller then needs only the impersonate-on verbs for the projected kinds, not create; it
    /// does not start when the apiserver refuses. controller: its own account, after the
    /// SubjectAccessReviews. auto: author when a start-up probe shows the apiserver lets this
    /// controller impersonate, else controller. Deletions of our copies are always the controller's.
    #[arg(long, default_value = "auto", value_parser = clap::builder::PossibleValuesParser::new(["auto", "author", "controller"]).map(|v| v.parse::<WriteCopiesAs>().expect("a possible value")))]
    pub write_copies_as: WriteCopiesAs,

    /// How often every CR's recorded author is asked again (enforce only) with nothing changed,
    /// so a revoked grant removes the copies it allowed without anyone touching the CR: one
    /// SubjectAccessReview per author and question per interval (asked afresh, whatever is
    /// cached), each at a moment of its own in the interval. A revocation takes effect within this
    /// interval and one pass. 0s turns the recheck off.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub author_recheck_interval: Duration,

    /// How long an author's grant (a SubjectAccessReview that allowed) is reused before it is
    /// asked again; denials are never reused. Shorter revokes sooner, at one more
    /// SubjectAccessReview per author and question per TTL while its CRs are busy.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub author_grant_ttl: Duration,

    /// Kinds that grant power (RBAC Roles and RoleBindings, ServiceAccounts, Endpoints,
    /// EndpointSlices, ServiceAccount token Secrets) that may be projected, comma-separated, e.g.
    /// `RoleBinding.rbac.authorization.k8s.io,Secret/service-account-token`; give the webhook the
    /// same list. By default none; projection.sh kinds never.
    #[arg(long, default_value = "", value_parser = |s: &str| s.parse::<AllowedPowerKinds>())]
    pub allow_power_kinds: AllowedPowerKinds,

    /// Address of the Prometheus metrics endpoint; "0" disables it.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(long, default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// The metrics endpoint over HTTPS (`--metrics-cert-file`, `--metrics-key-file`).
    #[command(flatten)]
    pub metrics_tls: runtime::tls::MetricsTlsArgs,

    /// Elect a leader through a Lease so several replicas can run; only the leader writes.
    /// `--leader-elect` alone means true; `--leader-elect=true|false` (the Go operator's form) works.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_elect: bool,

    /// Every replica reconciles, each its part of the CRs (a consistent-hash ring of the replicas'
    /// own Leases, in the leader election namespace, of the leader Lease's duration); instead of
    /// --leader-elect.
    #[arg(long, default_value_t = false, conflicts_with = "leader_elect")]
    pub shard_by_lease: bool,

    /// Duration of the leader Lease.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// Namespace of the leader Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// The controller's namespace (defaults to the pod's): where the kubeconfig Secrets of
    /// ClusterProjections writing into other clusters are (`spec.destination.kubeConfig`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub controller_namespace: String,

    /// How long a request to the apiserver may wait for its response to begin before it is given
    /// up and retried, e.g. on a connection whose path went dead (default 65s: the apiserver ends
    /// every request but a watch after 60 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub api_response_timeout: Option<Duration>,

    /// How long a response body, a watch's included, may stay silent before its connection is
    /// given up and the watch restarted (default 150s: the apiserver sends every watch a bookmark
    /// about once a minute).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub api_read_timeout: Option<Duration>,

    /// How each watch receives the objects that exist when it starts: stream (as watch events,
    /// decoded one at a time; needs the apiserver's WatchList feature, on by default in
    /// Kubernetes 1.32 and from 1.34), list (in one response), or auto (stream, and list for a
    /// watch the apiserver refuses to stream).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<InitialList>())]
    pub initial_list: InitialList,

    /// Kinds whose copies are deleted and created anew when the apiserver refuses an update as
    /// immutable, beyond ConfigMaps and Secrets (always): Kind.group entries separated by commas,
    /// e.g. PersistentVolumeClaim,Job.batch. A copy of any other kind is left as it is and its
    /// Projection says which field is immutable. Recreating loses what the object held (a volume,
    /// a Job's run).
    #[arg(long, default_value = "", value_parser = |s: &str| s.parse::<RecreateKinds>())]
    pub recreate_on_immutable: RecreateKinds,
}

/// A boolean as Go's `strconv.ParseBool` reads it (the Go operator's flag package uses it), so
/// `--leader-elect=True` or `=1` in an existing manifest keeps working.
fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("invalid boolean {other:?} (use true or false)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::http::bind_address;

    #[test]
    fn defaults_match_the_go_operator() {
        let args = Args::parse_from(["projection-controller"]);
        assert_eq!(args.source_mode, SourceMode::Allowlist);
        assert_eq!(args.requeue_interval, Duration::from_secs(30));
        assert_eq!(args.selector_write_concurrency, 16);
        assert_eq!(args.max_concurrent_reconciles, 32);
        assert_eq!(args.initial_list, InitialList::Auto);
        assert_eq!(args.recreate_on_immutable, RecreateKinds::default());
        assert_eq!(args.leader_election_lease_duration, Duration::from_secs(15));
        assert!(!args.leader_elect);
        assert_eq!(bind_address(&args.metrics_bind_address), Ok(None));
        assert_eq!(
            bind_address(&args.health_probe_bind_address),
            Ok(Some("0.0.0.0:8081".parse().unwrap()))
        );
    }

    #[test]
    fn leader_elect_takes_an_optional_value_like_the_go_flag() {
        let parse = |extra: &[&str]| {
            Args::try_parse_from(std::iter::once("projection-controller").chain(extra.iter().copied()))
                .map(|a| a.leader_elect)
        };
        assert_eq!(parse(&[]).ok(), Some(false));
        assert_eq!(parse(&["--leader-elect"]).ok(), Some(true));
        for (flag, expected) in [
            ("--leader-elect=true", true),
            ("--leader-elect=false", false),
            ("--leader-elect=True", true),
            ("--leader-elect=1", true),
            ("--leader-elect=0", false),
            ("--leader-elect=F", false),
        ] {
            assert_eq!(parse(&[flag]).ok(), Some(expected), "{flag}");
        }
        // A flag right after it is not taken as its value.
        let args = Args::parse_from([
            "projection-controller",
            "--leader-elect",
            "--leader-election-lease-duration",
            "4s",
        ]);
        assert!(args.leader_elect);
        assert_eq!(args.leader_election_lease_duration, Duration::from_secs(4));
        let err = parse(&["--leader-elect=yes"]).expect_err("not a boolean");
        assert!(err.to_string().contains("--leader-elect"), "{err}");
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        for bad in [
            vec!["--source-mode", "open"],
            vec!["--selector-write-concurrency", "0"],
            vec!["--max-concurrent-reconciles", "0"],
            vec!["--requeue-interval", "soon"],
            vec!["--recreate-on-immutable", "jobs.batch"],
        ] {
            let err = Args::try_parse_from(std::iter::once("projection-controller").chain(bad.clone()))
                .expect_err("bad value must be refused");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }
}
