//! The command line: kubectl's conventions (`-n`, `-A`, `--context`, `--kubeconfig`, `-o`), one
//! subcommand per question.

use clap::{Args, Parser, Subcommand, ValueEnum};
use shared::policy::{kind_policy::AllowedPowerKinds, projectable::SourceMode};
use std::{path::PathBuf, time::Duration};

/// kubectl projection: why a copy is what it is, what mirrors an object, what a Projection or
/// ClusterProjection would write, and their status and lifecycle.
#[derive(Parser, Debug)]
#[command(name = "kubectl-projection", bin_name = "kubectl projection", version, about)]
#[command(
    after_help = "Exit codes: 0 done (current, Ready, nothing to act on); 1 error (cluster, \
    input); 2 usage; 3 not found; 4 needs attention (a stale copy, a conflict, a CR not Ready); 5 \
    not managed (why: no CR owns the object); 6 invalid (preview: admission would refuse the \
    manifest); 7 timed out (sync --wait)."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's global flags.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace (default: the context's, else "default").
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,

    /// Output format: table, wide, json, yaml, name (status: resource/name, as kubectl -o name),
    /// or jsonpath=TEMPLATE (kubectl's template syntax over what -o json prints, e.g.
    /// jsonpath='{[*].name}').
    #[arg(short = 'o', long, global = true, default_value = "table", value_parser = parse_output)]
    pub output: Output,
    /// Act as this user, as kubectl --as (needs the right to impersonate it).
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Act as a member of this group, as kubectl --as-group; repeatable; needs --as.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_groups: Vec<String>,
    /// How long to wait for each answer of the apiserver, as kubectl --request-timeout: 30s, 1m,
    /// or a number of seconds; 0 waits without limit.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_request_timeout)]
    pub request_timeout: Option<Duration>,
}

/// `-o` as kubectl takes it.
fn parse_output(text: &str) -> Result<Output, String> {
    Ok(match text {
        "table" => Output::Table,
        "wide" => Output::Wide,
        "json" => Output::Json,
        "yaml" => Output::Yaml,
        "name" => Output::Name,
        other => match other.strip_prefix("jsonpath=") {
            Some(template) if !template.is_empty() => Output::JsonPath(template.to_owned()),
            _ => {
                return Err(format!(
                    "unknown output format {other:?}: use table, wide, json, yaml, name or jsonpath=TEMPLATE"
                ));
            }
        },
    })
}

/// `--request-timeout` as kubectl takes it: a duration (`30s`, `1m`) or a number of seconds; `0`
/// is no limit (`Duration::ZERO`).
fn parse_request_timeout(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration: {e}")),
    }
}

/// The controller's `--author-access`, as `preview` takes it.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorAccess {
    /// The CR's author must be allowed to read the source and create the copies.
    Enforce,
    /// No author checks.
    Trusted,
}

/// `-o`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Columns (the default).
    Table,
    /// Columns with the reasons and messages.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// `resource/name` per CR, as kubectl prints them (`status` only).
    Name,
    /// kubectl's JSONPath template over what `-o json` prints.
    JsonPath(String),
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Which Projection or ClusterProjection owns this copy, its source, whether the copy is
    /// current, the CR's conditions and last events; for an object no CR owns, the CRs that would
    /// write it or left it.
    Why {
        /// The object, as KIND/NAME (e.g. configmap/settings, deployments.apps/web).
        reference: String,
        /// Events shown (the latest).
        #[arg(long, default_value_t = 10)]
        events: usize,
        /// For a copy written from another cluster (it carries projection.sh/source-cluster): the
        /// kubeconfig context of the cluster its CR lives in, where the CR, its source and its
        /// events are read (checked to be the cluster the copy names).
        #[arg(long, value_name = "NAME")]
        source_context: Option<String>,
    },
    /// Every Projection and ClusterProjection that reads this object, where their copies are and
    /// whether each is current.
    Sources {
        /// The object, as KIND/NAME.
        reference: String,
    },
    /// What a Projection or ClusterProjection manifest would write now, per namespace (create,
    /// update, unchanged, conflict, skipped), by the controller's own plan; nothing is written.
    Preview {
        /// A manifest file, or - for standard input; repeatable; YAML or JSON, several documents
        /// allowed.
        #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// The controller's --source-mode.
        #[arg(long, default_value = "allowlist", value_parser = |s: &str| s.parse::<SourceMode>())]
        source_mode: SourceMode,
        /// The controller's --allow-power-kinds.
        #[arg(long, default_value = "", value_parser = |s: &str| s.parse::<AllowedPowerKinds>())]
        allow_power_kinds: AllowedPowerKinds,
        /// The controller's --author-access: enforce makes the controller's author checks (asked
        /// as you, who become the CR's author by applying it); trusted makes none.
        #[arg(long, value_enum, default_value = "enforce")]
        author_access: AuthorAccess,
        /// Ask the author checks as the author recorded on the CR in the cluster (else on the
        /// manifest), impersonating them: what the controller does for the CR as it stands. Needs
        /// the right to impersonate that user and its groups.
        #[arg(long)]
        as_author: bool,
        /// The controller's namespace (its --controller-namespace), where a ClusterProjection's
        /// kubeconfig Secret is read from for copies that go to another cluster.
        #[arg(long, default_value = "projection-system", value_name = "NAMESPACE")]
        controller_namespace: String,
    },
    /// Every Projection (in the namespace, or all with -A) and ClusterProjection with its outcome,
    /// copies written and failed, suspension and last change.
    Status {
        /// Only the CRs matching this label selector (of both kinds).
        #[arg(short = 'l', long, value_name = "SELECTOR")]
        selector: Option<String>,
        /// The controller's namespace, where replicas that run sharded (`--shard-by-lease`) hold
        /// their Leases: an OWNER column then names the replica that reconciles each CR.
        #[arg(long, default_value = "projection-system", value_name = "NAMESPACE")]
        controller_namespace: String,
    },
    /// Every projection controller of the cluster: whether it is ready, and who writes its copies
    /// (their author, impersonated, or the controller), as its flags, the cluster's version and its
    /// RBAC predict its start-up probe. `check api`: whether the installation answers.
    Check {
        #[command(subcommand)]
        what: Option<CheckWhat>,
    },
    /// Sets spec.suspend: no copy is written or updated until resumed (a veto or a lost grant still withdraws them).
    Suspend(Select),
    /// Clears spec.suspend: a full reconcile follows.
    Resume(Select),
    /// Requests a full reconcile (annotation projection.sh/requested-at), and with --wait waits
    /// until status.lastHandledReconcileAt echoes it.
    Sync {
        #[command(flatten)]
        select: Select,
        /// Wait until the controller has handled the request.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (e.g. 30s, 2m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Prints a shell completion script.
    Completion {
        /// The shell.
        shell: Shell,
    },
}

/// What `check` checks besides the controllers.
#[derive(Subcommand, Debug)]
pub enum CheckWhat {
    /// The installation's API, as `cmctl check api` does for cert-manager: the CRDs served, the
    /// webhook admitting a valid Projection (recording its author) and refusing one that would copy
    /// onto its own source (both dry runs in the namespace: nothing is written), a controller
    /// leading and renewing its Lease, its author access mode, and each other cluster CRs write
    /// into answering. Exit 0 when all hold, 4 when one does not, 7 when --wait gave up.
    Api {
        /// Check again every 2 s until all hold or this long has passed (e.g. 2m).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        /// The controller's namespace (its --controller-namespace), where ClusterProjections'
        /// kubeconfig Secrets are read from.
        #[arg(long, default_value = "projection-system", value_name = "NAMESPACE")]
        controller_namespace: String,
    },
}

/// The shells completion is generated for.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Which CRs a lifecycle command acts on.
#[derive(Args, Debug, Clone)]
pub struct Select {
    /// KIND/NAME for one CR (projection/NAME, clusterprojection/NAME, proj/..., cproj/...), or
    /// KIND alone with -l or --all.
    pub target: Option<String>,
    /// The CRs matching this label selector.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Every CR: the Projections of the namespace, or with -A every Projection and
    /// ClusterProjection.
    #[arg(long)]
    pub all: bool,
}
