//! Black-box benchmark harness for any controller implementing `projection.sh/v1`: it creates
//! sources, Projections and ClusterProjections through the API, changes them, and measures through
//! watches how fast copies follow; it samples the controller process's memory and CPU from /proc,
//! and the apiserver's request counters. See docs/scale.md.
//!
//!     cargo run --release -p projection-tests --example bench -- --profile projections-100 \
//!         --controller-pid "$(cat .testenv/projection-controller.pid)"
//!
//! It talks to the local control plane (`.testenv/admin.kubeconfig`) unless given `--kubeconfig`
//! together with `--allow-remote`: it never picks up `$KUBECONFIG` or `~/.kube/config` by itself.

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::watcher::{self, Event},
};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, Projection};
mod fan_out_set;
mod remote;
mod replicas;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

const GROUP: &str = "bench.projection.sh";
const RUN_LABEL: &str = "bench.projection.sh/run";
const TARGET_LABEL: &str = "bench.projection.sh/target";
const STAMP: &str = "bench.projection.sh/stamp";
/// Marks the objects of the apiserver's own fan-out writes.
const LIMIT_LABEL: &str = "bench.projection.sh/limit";
const PARALLEL: usize = 32;

#[derive(Parser, Debug)]
#[command(about = "Black-box benchmark of a projection.sh/v1 controller")]
struct Args {
    /// smoke, projections-100, projections-1000, projections-10000, selector-50, selector-1000,
    /// selector-set-1000 (16 ClusterProjections to 1000 namespaces each), list-10, list-100,
    /// crowded, mixed; remote-smoke and remote (copies into another cluster:
    /// Projections and a ClusterProjection's list of namespaces there).
    #[arg(long, default_value = "smoke")]
    profile: String,
    /// Override the profile's number of Projections.
    #[arg(long)]
    projections: Option<usize>,
    /// Override the profile's number of source kinds (ConfigMap plus CRDs the harness installs).
    #[arg(long)]
    kinds: Option<usize>,
    /// Override the profile's number of destination namespaces for Projections.
    #[arg(long)]
    namespaces: Option<usize>,
    /// Override the profile's number of ClusterProjection target namespaces.
    #[arg(long)]
    fan_out: Option<usize>,
    /// Override the profile's number of ClusterProjections with the fan-out (more than one: a set,
    /// each with a source of its own, measured for throughput after the first one's figures).
    #[arg(long)]
    cluster_projections: Option<usize>,
    /// Override the profile's number of unrelated Secrets and ConfigMaps (each).
    #[arg(long)]
    unrelated: Option<usize>,
    /// Samples per latency measurement.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Length of the idle window (requests per idle minute are scaled from it).
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Start this controller binary against the local control plane for the run (its pid and
    /// metrics are then measured too).
    #[arg(long, conflicts_with_all = ["controller_pid", "controller_metrics", "kubeconfig"])]
    start_controller: Option<PathBuf>,
    /// The controller's process id, for memory and CPU from /proc.
    #[arg(long)]
    controller_pid: Option<u32>,
    /// The controller's metrics endpoint (host:port), scraped at the end.
    #[arg(long)]
    controller_metrics: Option<String>,
    /// A kubeconfig other than the local control plane's (needs --allow-remote).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Confirms that the harness may create and delete objects in the cluster of --kubeconfig.
    #[arg(long)]
    allow_remote: bool,
    /// Where to write the JSON result (default: target/bench/<profile>-<run>.json).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Keep what the run created.
    #[arg(long)]
    keep: bool,
    /// A flag for the controller that --start-controller starts (repeatable), e.g.
    /// `--controller-arg=--author-recheck-interval=60s`.
    #[arg(long, requires = "start_controller", allow_hyphen_values = true)]
    controller_arg: Vec<String>,
    /// Also run the profile against this peer, the Go operator's manager (built by
    /// `tests/bench/build-go-peer.sh`), after ours in the same run, and print both with their
    /// ratios. Needs --start-controller.
    #[arg(long, requires = "start_controller")]
    peer: Option<PathBuf>,
    /// Run ours as this many replicas with `--shard-by-lease`, each reconciling its part of the
    /// CRs; a list (`0,2,4`) runs the profile once per count, one after the other, and prints them
    /// side by side. 0 is one controller without shards (today's default). Needs
    /// --start-controller.
    #[arg(
        long,
        requires = "start_controller",
        conflicts_with = "peer",
        value_delimiter = ','
    )]
    replicas: Vec<usize>,
    /// Seconds to let the cluster settle between the two operators' runs (after the first run's
    /// namespaces are gone).
    #[arg(long, default_value_t = 10)]
    settle_seconds: u64,
    /// Concurrency of the apiserver's own fan-out writes (both operators write 16 copies at a
    /// time by default).
    #[arg(long, default_value_t = 16)]
    write_concurrency: usize,
    /// The other cluster of the remote profiles (default: the second local control plane's
    /// `.testenv-remote/admin.kubeconfig`); the harness creates and deletes objects there.
    #[arg(long)]
    remote_kubeconfig: Option<PathBuf>,
}

/// The flags the Go operator's manager needs out of the cluster, besides its metrics and probe
/// addresses: plain HTTP metrics and no leader election, as its README says.
const PEER_ARGS: [&str; 2] = ["--metrics-secure=false", "--leader-elect=false"];

/// What a profile creates.
#[derive(Clone, Debug, serde::Serialize)]
struct Plan {
    projections: usize,
    kinds: usize,
    namespaces: usize,
    /// ClusterProjection targets, by selector (`true`) or by list.
    fan_out: usize,
    by_selector: bool,
    /// ClusterProjections with that fan-out, each of its own source (more than one: a set).
    cluster_projections: usize,
    unrelated: usize,
    /// Copies go to another cluster (`spec.destination.kubeConfig`).
    remote: bool,
}

fn plan(args: &Args) -> anyhow::Result<Plan> {
    let (projections, kinds, namespaces, fan_out, by_selector, unrelated) = match args.profile.as_str() {
        "smoke" => (10, 2, 2, 5, true, 0),
        "projections-100" => (100, 10, 10, 0, true, 0),
        "projections-1000" => (1000, 20, 50, 0, true, 0),
        "projections-10000" => (10000, 20, 100, 0, true, 0),
        "selector-50" => (0, 1, 0, 50, true, 0),
        "selector-1000" | "selector-set-1000" => (0, 1, 0, 1000, true, 0),
        "list-10" => (0, 1, 0, 10, false, 0),
        "list-100" => (0, 1, 0, 100, false, 0),
        "crowded" => (10, 1, 2, 0, true, 10000),
        "mixed" => (200, 5, 10, 50, true, 1000),
        "remote-smoke" => (5, 1, 1, 10, false, 0),
        "remote" => (20, 1, 1, 100, false, 0),
        other => bail!("unknown profile {other:?}"),
    };
    let remote = args.profile.starts_with("remote");
    Ok(Plan {
        projections: args.projections.unwrap_or(projections),
        kinds: args.kinds.unwrap_or(kinds).max(1),
        namespaces: args.namespaces.unwrap_or(namespaces).max(1),
        fan_out: args.fan_out.unwrap_or(fan_out),
        by_selector,
        cluster_projections: args
            .cluster_projections
            .unwrap_or(if args.profile.starts_with("selector-set") {
                16
            } else {
                1
            })
            .max(1),
        unrelated: args.unrelated.unwrap_or(unrelated),
        remote,
    })
}

async fn connect(args: &Args) -> anyhow::Result<Client> {
    let path = match (&args.kubeconfig, args.allow_remote) {
        (Some(path), true) => path.clone(),
        (Some(_), false) => {
            bail!("--kubeconfig needs --allow-remote: the harness creates and deletes objects there")
        }
        (None, _) => projection_tests::testenv_dir().join("admin.kubeconfig"),
    };
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = runtime::kube_client::client_for(config)?;
    client
        .apiserver_version()
        .await
        .context("the apiserver does not answer (is the control plane up?)")?;
    Ok(client)
}

/// Latencies in seconds, summarised.
#[derive(Debug, serde::Serialize)]
struct Summary {
    samples: usize,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

fn summarize(mut seconds: Vec<f64>) -> Option<Summary> {
    if seconds.is_empty() {
        return None;
    }
    seconds.sort_by(f64::total_cmp);
    let at =
        |q: f64| seconds[((q * seconds.len() as f64).ceil() as usize).clamp(1, seconds.len()) - 1] * 1000.0;
    Some(Summary {
        samples: seconds.len(),
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
        max_ms: at(1.0),
    })
}

/// One source kind of the run: ConfigMap, or a CRD the harness installs.
fn kind_resource(i: usize) -> ApiResource {
    if i == 0 {
        return ApiResource::erase::<ConfigMap>(&());
    }
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: format!("Bench{i}"),
        plural: format!("bench{i}s"),
    }
}

async fn install_kinds(client: &Client, kinds: usize) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for i in 1..kinds {
        let r = kind_resource(i);
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{}.{GROUP}", r.plural)},
            "spec": {"group": GROUP, "scope": "Namespaced",
                "names": {"plural": r.plural, "singular": r.kind.to_lowercase(), "kind": r.kind},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))?;
        api.patch(
            &crd.name_any(),
            &PatchParams::apply("projection-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        projection_tests::wait_crd_established(client, &crd.name_any()).await;
    }
    Ok(())
}

fn source_object(resource: &ApiResource, namespace: &str, name: &str) -> anyhow::Result<DynamicObject> {
    let body = if resource.kind == "ConfigMap" {
        json!({"data": {"value": name}})
    } else {
        json!({"spec": {"value": name}})
    };
    let mut value = json!({"apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": name, "namespace": namespace, "annotations": {"projection.sh/projectable": "true"}}});
    if let (Some(object), Some(body)) = (value.as_object_mut(), body.as_object()) {
        object.extend(body.clone());
    }
    Ok(serde_json::from_value(value)?)
}

async fn create_namespace(client: &Client, name: &str, labels: Value) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// Runs `f` over `items`, `PARALLEL` at a time, failing on the first error.
async fn in_parallel<T, F, Fut>(items: Vec<T>, f: F) -> anyhow::Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    projection_tests::in_parallel(items, PARALLEL, f).await
}

fn now_nanos() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        .to_string()
}

async fn stamp(api: &Api<DynamicObject>, name: &str, value: &str) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {STAMP: value}}})),
    )
    .await?;
    Ok(())
}

/// Watches objects (from `api`, narrowed by `config`) and records when each first satisfies
/// `done`; returns once the watch has synced.
struct Observer {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    async fn start<F>(api: Api<DynamicObject>, config: watcher::Config, done: F) -> Self
    where
        F: Fn(&Event<DynamicObject>) -> Option<String> + Send + 'static,
    {
        let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut events = std::pin::pin!(watcher::watcher(api, config));
            while let Some(Ok(event)) = events.next().await {
                if matches!(event, Event::InitDone) {
                    if let Some(tx) = synced.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                if synced.is_none()
                    && let Some(key) = done(&event)
                {
                    record
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(key)
                        .or_insert_with(Instant::now);
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(30), synced_rx).await;
        Self { seen, task }
    }

    async fn wait(&self, count: usize, limit: Duration) -> Vec<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            let seen: Vec<Instant> = self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .copied()
                .collect();
            if seen.len() >= count || Instant::now() > deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn stamped(value: String) -> impl Fn(&Event<DynamicObject>) -> Option<String> + Send + 'static {
    move |event| match event {
        Event::Apply(o) if o.annotations().get(STAMP) == Some(&value) => {
            Some(format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
        }
        _ => None,
    }
}

/// Resident memory (bytes) and CPU time (seconds) of a process, sampled in the background.
struct ProcessSampler {
    /// When sampling began.
    since: Instant,
    samples: Arc<Mutex<Vec<(Instant, f64, f64)>>>,
    task: tokio::task::JoinHandle<()>,
}

fn read_process(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some((rss_kib * 1024.0, ticks / 100.0))
}

impl ProcessSampler {
    fn start(pid: u32) -> Self {
        let samples: Arc<Mutex<Vec<(Instant, f64, f64)>>> = Arc::default();
        let record = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some((rss, cpu)) = read_process(pid) {
                    record
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), rss, cpu));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            since: Instant::now(),
            samples,
            task,
        }
    }

    /// Peak RSS, median RSS and CPU seconds used between `from` and `to`.
    fn window(&self, from: Instant, to: Instant) -> Option<(f64, f64, f64)> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let inside: Vec<&(Instant, f64, f64)> = samples
            .iter()
            .filter(|(t, _, _)| *t >= from && *t <= to)
            .collect();
        let (first, last) = (inside.first()?, inside.last()?);
        let mut rss: Vec<f64> = inside.iter().map(|s| s.1).collect();
        rss.sort_by(f64::total_cmp);
        Some((rss[rss.len() - 1], rss[rss.len() / 2], last.2 - first.2))
    }
}

impl Drop for ProcessSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `apiserver_request_total` summed by "VERB resource[/subresource]".
async fn request_counts(client: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap_or_default();
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let (verb, resource, sub) = (label("verb"), label("resource"), label("subresource"));
        if resource.is_empty() {
            continue;
        }
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *counts.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(counts)
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(k, v)| *v > 0.0 && !k.ends_with(" leases") && !k.starts_with("WATCH"))
        .collect()
}

/// The apiserver requests (all clients) in the 3 s after one stamp of the ConfigMap `name`, minus
/// the stamp itself.
async fn requests_for_one_edit(
    client: &Client,
    sources: &Api<DynamicObject>,
    name: &str,
) -> anyhow::Result<BTreeMap<String, f64>> {
    let before = request_counts(client).await?;
    stamp(sources, name, &now_nanos()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut per_edit = delta(&before, &request_counts(client).await?);
    if let Some(v) = per_edit.get_mut("PATCH configmaps") {
        *v -= 1.0;
    }
    per_edit.retain(|_, v| *v > 0.0);
    Ok(per_edit)
}

/// Sets (`Some`) or removes (`None`) the target label of a namespace.
async fn set_target_label(
    namespaces: &Api<Namespace>,
    name: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"labels": {TARGET_LABEL: value}}});
    namespaces
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut probe: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if probe().await? {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("{what} not reached within {limit:?}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runtime::crypto::install_crypto_provider();
    let args = Args::parse();
    let plan = plan(&args)?;
    let client = connect(&args).await?;
    let run = format!(
        "b{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            % 100_000_000
    );
    eprintln!("run {run}: {plan:?}");
    // The projection.sh/v1 CRDs (ours, a superset of the Go operator's: both operators run on them).
    projection_tests::install_crds(&client).await;
    // An earlier run's namespaces still being deleted would load the apiserver during this one.
    settle(&client, None, Duration::ZERO, &plan).await?;
    let output = args.output.clone().unwrap_or_else(|| {
        projection_tests::repo_root()
            .join("target/bench")
            .join(format!("{}-{run}.json", args.profile))
    });
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if !args.replicas.is_empty() {
        replicas::check_counts(&args.replicas)?;
        let mut reports = Vec::new();
        for (i, &count) in args.replicas.iter().enumerate() {
            if i > 0 {
                let earlier = format!("{run}r{}", args.replicas[i - 1]);
                settle(
                    &client,
                    Some(&earlier),
                    Duration::from_secs(args.settle_seconds),
                    &plan,
                )
                .await?;
            }
            let this = format!("{run}r{count}");
            reports.push((
                count,
                run_once(&client, &args, &plan, &this, Operator::Ours(count)).await?,
            ));
        }
        let by_count: BTreeMap<String, &Value> = reports.iter().map(|(n, r)| (n.to_string(), r)).collect();
        let report = json!({"profile": args.profile, "run": run, "replicas": by_count});
        std::fs::write(&output, serde_json::to_string_pretty(&report)?)?;
        replicas::print_side_by_side(&args.profile, &reports);
        eprintln!("JSON written to {}", output.display());
        return Ok(());
    }
    let Some(peer) = &args.peer else {
        let report = run_once(&client, &args, &plan, &run, Operator::Ours(0)).await?;
        std::fs::write(&output, serde_json::to_string_pretty(&report)?)?;
        print_table(&args.profile, &report);
        eprintln!("JSON written to {}", output.display());
        return Ok(());
    };
    // Side by side: ours, then the peer, on the same control plane with the same plan, each
    // removing what it created before the other starts.
    let ours = run_once(&client, &args, &plan, &format!("{run}o"), Operator::Ours(0)).await?;
    settle(
        &client,
        Some(&format!("{run}o")),
        Duration::from_secs(args.settle_seconds),
        &plan,
    )
    .await?;
    let go = run_once(&client, &args, &plan, &format!("{run}g"), Operator::Peer(peer)).await?;
    let report = json!({"profile": args.profile, "run": run, "ours": ours, "go": go});
    std::fs::write(&output, serde_json::to_string_pretty(&report)?)?;
    print_side_by_side(&args.profile, &ours, &go);
    eprintln!("JSON written to {}", output.display());
    Ok(())
}

/// Which controller a run measures.
#[derive(Clone, Copy)]
enum Operator<'a> {
    /// Ours: started from --start-controller (as this many replicas with shards; 0 for one
    /// without), or the one given by --controller-pid and --controller-metrics, or none.
    Ours(usize),
    /// The Go operator's manager at this path.
    Peer(&'a std::path::Path),
}

/// Runs the profile once against one controller (started for the run when a binary is given),
/// removes what it created, and returns the report.
async fn run_once(
    client: &Client,
    args: &Args,
    plan: &Plan,
    run: &str,
    operator: Operator<'_>,
) -> anyhow::Result<Value> {
    let mut controllers = Vec::new();
    match (operator, &args.start_controller) {
        (Operator::Peer(binary), _) => {
            controllers.push(projection_tests::ServiceProcess::start_split(binary, &PEER_ARGS));
        }
        (Operator::Ours(0), Some(binary)) => {
            let extra: Vec<&str> = args.controller_arg.iter().map(String::as_str).collect();
            controllers.push(projection_tests::ServiceProcess::start(binary, &extra));
        }
        (Operator::Ours(count), Some(binary)) => {
            // The member Leases live in a namespace of the run's, removed with it.
            let members = format!("{run}-members");
            create_namespace(client, &members, json!({RUN_LABEL: run})).await?;
            let extra: Vec<&str> = args.controller_arg.iter().map(String::as_str).collect();
            controllers = replicas::start(client, binary, &extra, &members, count).await?;
        }
        (Operator::Ours(_), None) => {}
    }
    for process in &mut controllers {
        process.wait_ready().await;
    }
    let (pids, metrics_ports): (Vec<u32>, Vec<u16>) = if controllers.is_empty() {
        let port = args
            .controller_metrics
            .as_deref()
            .and_then(|endpoint| endpoint.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok());
        (
            args.controller_pid.into_iter().collect(),
            port.into_iter().collect(),
        )
    } else {
        controllers.iter().map(|p| (p.pid(), p.metrics_port)).unzip()
    };
    eprintln!(
        "run {run}: {}",
        match operator {
            Operator::Ours(count) if count > 0 => format!("ours, {}", replicas::label(count)),
            Operator::Ours(_) => "ours".to_owned(),
            Operator::Peer(binary) => format!("peer {}", binary.display()),
        }
    );
    let samplers: Vec<ProcessSampler> = pids.into_iter().map(ProcessSampler::start).collect();
    let started = Instant::now();
    let other = match plan.remote {
        true => Some(remote::connect(args).await?),
        false => None,
    };
    let result = measure((client, other.as_ref()), args, plan, run, &samplers).await;
    if !args.keep {
        cleanup(client, run).await;
        if let Some(other) = &other {
            remote::cleanup((client, other), run).await;
        }
    }
    let mut report = result?;
    report["elapsed_seconds"] = json!(started.elapsed().as_secs_f64().round());
    let bodies: Vec<String> = metrics_ports
        .iter()
        .filter_map(|&port| match projection_tests::http_get(port, "/metrics") {
            Some((200, body)) => Some(body),
            _ => None,
        })
        .collect();
    if !bodies.is_empty() {
        let ours: Vec<Vec<&str>> = bodies
            .iter()
            .map(|body| {
                body.lines()
                    .filter(|l| l.starts_with("projection_") && !l.contains("_bucket"))
                    .collect()
            })
            .collect();
        report["controller_metrics"] = match ours.len() {
            1 => json!(ours[0]),
            _ => json!(ours),
        };
        // The replicas' counters summed: what the deployment as a whole did.
        report["controller_runtime"] = controller_runtime_figures(&bodies.join("\n"));
        if bodies.len() > 1 {
            for key in ["reconciles", "rest_client_requests"] {
                let busiest = bodies
                    .iter()
                    .filter_map(|body| controller_runtime_figures(body)[key].as_f64())
                    .fold(0.0, f64::max);
                report["controller_runtime"][format!("{key}_busiest_replica")] = json!(busiest);
            }
        }
    }
    drop(controllers);
    Ok(report)
}

/// Waits until the namespaces of `run` (of any run: `None`) are gone, then lets the cluster rest
/// for `rest`. The wait grows with the plan's namespaces: the namespace controller removed about 6
/// a second here, so 5000 fan-out targets take over 10 minutes to go.
async fn settle(client: &Client, run: Option<&str>, rest: Duration, plan: &Plan) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let lp = ListParams::default().labels(&match run {
        Some(run) => format!("{RUN_LABEL}={run}"),
        None => RUN_LABEL.to_owned(),
    });
    let gone = wait_until(
        "earlier runs' namespaces to be gone",
        Duration::from_secs(600 + (plan.namespaces + plan.fan_out) as u64),
        || async { Ok(namespaces.list(&lp).await?.items.is_empty()) },
    )
    .await;
    if let Err(e) = gone {
        eprintln!("settling: {e}; going on");
    }
    tokio::time::sleep(rest).await;
    Ok(())
}

/// What the controller-runtime metrics (the classic text format both operators serve) say about
/// the whole run: reconciles, errors, mean reconcile time, work-queue adds and retries.
fn controller_runtime_figures(exposition: &str) -> Value {
    let sum = |prefix: &str| -> f64 {
        exposition
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let count = sum("controller_runtime_reconcile_time_seconds_count{");
    json!({
        "reconciles": sum("controller_runtime_reconcile_total{"),
        "reconcile_errors": sum("controller_runtime_reconcile_errors_total{"),
        "reconcile_mean_ms": if count > 0.0 {
            sum("controller_runtime_reconcile_time_seconds_sum{") / count * 1000.0
        } else {
            0.0
        },
        "workqueue_adds": sum("workqueue_adds_total{"),
        "workqueue_retries": sum("workqueue_retries_total{"),
        "rest_client_requests": sum("rest_client_requests_total{"),
    })
}

async fn measure(
    (client, other): (&Client, Option<&Client>),
    args: &Args,
    plan: &Plan,
    run: &str,
    samplers: &[ProcessSampler],
) -> anyhow::Result<Value> {
    let mut report = json!({"profile": args.profile, "plan": plan, "run": run});
    let source_ns = format!("{run}-src");
    create_namespace(client, &source_ns, json!({RUN_LABEL: run})).await?;
    install_kinds(client, plan.kinds).await?;

    // The floor: how long the apiserver takes to deliver a write to a watcher, with no controller
    // involved. Propagation through a controller costs at least two of these.
    // Watches here, as below, are namespace-wide without field selectors: a field-selected watch
    // took about 40 ms longer to deliver on the local control plane.
    report["apiserver_write_to_watch"] = json!(write_to_watch_floor(client, run, args.samples).await?);

    // Unrelated objects: the controller must not pay for them.
    if plan.unrelated > 0 {
        let unrelated_ns = format!("{run}-unrelated");
        create_namespace(client, &unrelated_ns, json!({RUN_LABEL: run})).await?;
        let t = Instant::now();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &unrelated_ns);
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &unrelated_ns);
        in_parallel((0..plan.unrelated).collect(), |i| {
            let (secrets, configmaps) = (secrets.clone(), configmaps.clone());
            async move {
                let s: Secret = serde_json::from_value(
                    json!({"metadata": {"name": format!("u-{i}")}, "stringData": {"k": "v"}}),
                )?;
                secrets.create(&PostParams::default(), &s).await?;
                let c: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": format!("u-{i}")}, "data": {"k": "v"}}),
                )?;
                configmaps.create(&PostParams::default(), &c).await?;
                Ok(())
            }
        })
        .await?;
        report["unrelated_created_seconds"] = json!(t.elapsed().as_secs_f64());
    }

    // Copies into another cluster: the remote profiles measure only those (and the idle window).
    if let Some(other) = other {
        remote::measure((client, other), args, plan, (run, &source_ns), &mut report).await?;
    }
    // Projections: source i of kind i % kinds, copied into destination namespace i % namespaces.
    if plan.projections > 0 && !plan.remote {
        let dest: Vec<String> = (0..plan.namespaces).map(|i| format!("{run}-d{i}")).collect();
        for ns in &dest {
            create_namespace(client, ns, json!({RUN_LABEL: run})).await?;
        }
        let t = Instant::now();
        // Written straight to the apiserver, as the webhook would record their author.
        let author = projection_tests::author_annotation(client).await?;
        in_parallel((0..plan.projections).collect(), |i| {
            let (client, source_ns, dest) = (client.clone(), source_ns.clone(), dest[i % dest.len()].clone());
            let author = author.clone();
            async move {
                let resource = kind_resource(i % plan.kinds);
                let name = format!("s-{i}");
                let api = Api::<DynamicObject>::namespaced_with(client.clone(), &source_ns, &resource);
                api.create(&PostParams::default(), &source_object(&resource, &source_ns, &name)?).await?;
                let p: Projection = serde_json::from_value(json!({"metadata": {"name": name, "labels": {RUN_LABEL: run}, "annotations": author},
                    "spec": {"source": {"group": resource.group, "kind": resource.kind, "namespace": source_ns, "name": name}}}))?;
                Api::<Projection>::namespaced(client, &dest).create(&PostParams::default(), &p).await?;
                Ok(())
            }
        })
        .await?;
        let ready_after = all_ready(&Api::all(client.clone()), run, plan.projections).await?;
        report["projections_ready_seconds"] = json!((t.elapsed().max(ready_after)).as_secs_f64());

        // Source edit -> copy updated, and copy deleted -> restored.
        let (edits, heals) = edit_and_heal_times(args.samples, |sample| {
            let i = (sample * 7919) % plan.projections;
            let resource = kind_resource(i % plan.kinds);
            let dest_ns = &dest[i % dest.len()];
            (
                Api::namespaced_with(client.clone(), &source_ns, &resource),
                Api::namespaced_with(client.clone(), dest_ns, &resource),
                format!("s-{i}"),
            )
        })
        .await?;
        report["source_edit_to_copy"] = json!(summarize(edits));
        report["copy_deleted_to_restored"] = json!(summarize(heals));

        // Requests caused by one source edit.
        let resource = kind_resource(0);
        let sources = Api::<DynamicObject>::namespaced_with(client.clone(), &source_ns, &resource);
        report["requests_per_source_edit"] = json!(requests_for_one_edit(client, &sources, "s-0").await?);
    }

    // ClusterProjection fan-out.
    if plan.fan_out > 0 && !plan.remote {
        measure_fan_out(client, args, plan, run, &source_ns, &mut report).await?;
    }

    // Idle: nothing changes; the controller should make no request. Let the last changes settle
    // first (reconciles of the last namespace events, kube-controller-manager seeding namespaces).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_start = Instant::now();
    let before = request_counts(client).await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle = delta(&before, &request_counts(client).await?);
    let minutes = args.idle_seconds as f64 / 60.0;
    report["requests_per_idle_minute_all_clients"] = json!(
        idle.iter()
            .map(|(k, v)| (k.clone(), v / minutes))
            .collect::<BTreeMap<_, _>>()
    );
    let idle_end = Instant::now();
    let per_process: Option<Vec<(f64, f64, f64, f64)>> = samplers
        .iter()
        .map(|sampler| {
            let (_, steady, idle_cpu) = sampler.window(idle_start, idle_end)?;
            let (peak, _, total_cpu) = sampler.window(sampler.since, idle_end)?;
            Some((steady, peak, idle_cpu, total_cpu))
        })
        .collect();
    if let Some(per_process) = per_process.filter(|p| !p.is_empty()) {
        report["controller"] = replicas::controller_figures(&per_process);
    }
    Ok(report)
}

/// The watch of a ClusterProjection's copies (by its UID label).
fn copies_of(cp: &ClusterProjection) -> watcher::Config {
    let uid = cp.uid().unwrap_or_default();
    watcher::Config::default().labels(&format!("projection.sh/owned-by-cluster-projection-uid={uid}"))
}

/// Per sample, `name` of `source` is stamped and the times until the first and the last of its
/// `expected` copies (watched through `copies` with `config`) show the stamp are recorded.
async fn fan_out_edit_times(
    (source, name): (&Api<DynamicObject>, &str),
    (copies, config): (&Api<DynamicObject>, &watcher::Config),
    expected: usize,
    samples: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut first, mut last) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let value = now_nanos();
        let observer = Observer::start(copies.clone(), config.clone(), stamped(value.clone())).await;
        let t = Instant::now();
        stamp(source, name, &value).await?;
        let seen = observer.wait(expected, Duration::from_secs(120)).await;
        if seen.len() < expected {
            bail!("only {} of {} copies were updated", seen.len(), expected);
        }
        let since = |at: Option<&Instant>| {
            at.map(|at| at.duration_since(t).as_secs_f64())
                .unwrap_or_default()
        };
        first.push(since(seen.iter().min()));
        last.push(since(seen.iter().max()));
    }
    Ok((first, last))
}

/// Waits until the `expected` Projections of `run` that `projections` lists are Ready; returns how
/// long that took.
async fn all_ready(projections: &Api<Projection>, run: &str, expected: usize) -> anyhow::Result<Duration> {
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    wait_until("every Projection Ready", Duration::from_secs(600), || async {
        let list = projections.list(&lp).await?;
        let ready = list
            .items
            .iter()
            .filter(|p| is_ready(p.status.as_ref().map(|s| &s.copy.conditions[..])))
            .count();
        Ok(ready == expected)
    })
    .await
}

/// Per sample, `at(sample)` names a source (its API), the API its copy is in and their name: the
/// source is stamped and the time until its copy shows the stamp recorded, then the copy is deleted
/// and the time until it is back. Returns both lists of seconds.
async fn edit_and_heal_times<F>(samples: usize, at: F) -> anyhow::Result<(Vec<f64>, Vec<f64>)>
where
    F: Fn(usize) -> (Api<DynamicObject>, Api<DynamicObject>, String),
{
    let (mut edits, mut heals) = (Vec::new(), Vec::new());
    for sample in 0..samples {
        let (sources, copies, name) = at(sample);
        let value = now_nanos();
        let config = watcher::Config::default();
        let observer = Observer::start(copies.clone(), config.clone(), stamped(value.clone())).await;
        let t = Instant::now();
        stamp(&sources, &name, &value).await?;
        if let Some(at) = observer.wait(1, Duration::from_secs(30)).await.first() {
            edits.push(at.duration_since(t).as_secs_f64());
        }
        drop(observer);
        let old_uid = copies.get(&name).await?.uid();
        let wanted = name.clone();
        let observer = Observer::start(copies.clone(), config, move |event| match event {
            Event::Apply(o) if o.name_any() == wanted && o.uid() != old_uid => Some(o.name_any()),
            _ => None,
        })
        .await;
        let t = Instant::now();
        copies.delete(&name, &DeleteParams::default()).await?;
        if let Some(at) = observer.wait(1, Duration::from_secs(30)).await.first() {
            heals.push(at.duration_since(t).as_secs_f64());
        }
    }
    Ok((edits, heals))
}

/// The floor of a cluster (`client`'s): how long its apiserver takes to deliver a write to a
/// watcher, with no controller involved, over `samples` writes to an object of the run's `-probe`
/// namespace there.
async fn write_to_watch_floor(client: &Client, run: &str, samples: usize) -> anyhow::Result<Option<Summary>> {
    let probe_ns = format!("{run}-probe");
    create_namespace(client, &probe_ns, json!({RUN_LABEL: run})).await?;
    let probes: Api<DynamicObject> = Api::namespaced_with(client.clone(), &probe_ns, &kind_resource(0));
    probes
        .create(
            &PostParams::default(),
            &source_object(&kind_resource(0), &probe_ns, "round-trip")?,
        )
        .await?;
    let mut round_trips = Vec::new();
    for _ in 0..samples {
        let value = now_nanos();
        let observer =
            Observer::start(probes.clone(), watcher::Config::default(), stamped(value.clone())).await;
        let t = Instant::now();
        stamp(&probes, "round-trip", &value).await?;
        if let Some(at) = observer.wait(1, Duration::from_secs(30)).await.first() {
            round_trips.push(at.duration_since(t).as_secs_f64());
        }
    }
    Ok(summarize(round_trips))
}

async fn measure_fan_out(
    client: &Client,
    args: &Args,
    plan: &Plan,
    run: &str,
    source_ns: &str,
    report: &mut Value,
) -> anyhow::Result<()> {
    let targets: Vec<String> = (0..plan.fan_out).map(|i| format!("{run}-t{i:04}")).collect();
    let t = Instant::now();
    in_parallel(targets.clone(), |ns| async move {
        create_namespace(client, &ns, json!({RUN_LABEL: run, TARGET_LABEL: run})).await
    })
    .await?;
    report["target_namespaces_created_seconds"] = json!(t.elapsed().as_secs_f64());
    // kube-controller-manager seeds every new namespace (its `default` ServiceAccount and the
    // `kube-root-ca.crt` ConfigMap): wait until it is done, so neither operator is measured
    // while it still writes (at 1000 namespaces it takes tens of seconds).
    let seeded = wait_until(
        "the target namespaces to be seeded",
        Duration::from_secs(600),
        || async {
            let accounts = Api::<ServiceAccount>::all(client.clone())
                .list_metadata(&ListParams::default().fields("metadata.name=default"))
                .await?;
            let prefix = format!("{run}-t");
            let done = accounts
                .items
                .iter()
                .filter(|a| {
                    a.metadata
                        .namespace
                        .as_deref()
                        .is_some_and(|ns| ns.starts_with(&prefix))
                })
                .count();
            Ok(done >= plan.fan_out)
        },
    )
    .await?;
    report["target_namespaces_seeded_seconds"] = json!(seeded.as_secs_f64());
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), source_ns);
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "fanout", "annotations": {"projection.sh/projectable": "true"}},
        "data": {"k": "v"}}),
    )?;
    sources.create(&PostParams::default(), &cm).await?;
    let destination = if plan.by_selector {
        json!({"namespaceSelector": {"matchLabels": {TARGET_LABEL: run}}})
    } else {
        json!({"namespaces": targets})
    };
    let author = projection_tests::author_annotation(client).await?;
    let cp: ClusterProjection = serde_json::from_value(
        json!({"metadata": {"name": run, "labels": {RUN_LABEL: run}, "annotations": author},
        "spec": {"source": {"kind": "ConfigMap", "namespace": source_ns, "name": "fanout"}, "destination": destination}}),
    )?;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let t = Instant::now();
    let created = cps.create(&PostParams::default(), &cp).await?;
    let expected = plan.fan_out as i32;
    wait_until("the fan-out to complete", Duration::from_secs(600), || async {
        let cp = cps.get(run).await?;
        Ok(cp.status.is_some_and(|s| s.counts.namespaces_written == expected))
    })
    .await?;
    report["fan_out_initial_seconds"] = json!(t.elapsed().as_secs_f64());

    let copies = Api::<DynamicObject>::all_with(client.clone(), &kind_resource(0));
    let config = copies_of(&created);
    let source = Api::<DynamicObject>::namespaced_with(client.clone(), source_ns, &kind_resource(0));
    let (first, last) = fan_out_edit_times(
        (&source, "fanout"),
        (&copies, &config),
        plan.fan_out,
        args.samples.min(10),
    )
    .await?;
    report["fan_out_edit_first_copy"] = json!(summarize(first));
    report["fan_out_edit_last_copy"] = json!(summarize(last));
    apiserver_fan_out(client, args, run, &targets, report).await?;

    report["fan_out_requests_per_source_edit"] =
        json!(requests_for_one_edit(client, &source, "fanout").await?);

    if plan.by_selector {
        // Label flips and a new namespace.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let (mut removed, mut added, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..args.samples.min(5) {
            let ns = targets[i % targets.len()].clone();
            let scoped = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &kind_resource(0));
            let gone = Observer::start(scoped.clone(), config.clone(), |e| match e {
                Event::Delete(o) => Some(o.name_any()),
                _ => None,
            })
            .await;
            let t = Instant::now();
            set_target_label(&namespaces, &ns, None).await?;
            if let Some(at) = gone.wait(1, Duration::from_secs(30)).await.first() {
                removed.push(at.duration_since(t).as_secs_f64());
            }
            let back = Observer::start(scoped, config.clone(), |e| match e {
                Event::Apply(o) => Some(o.name_any()),
                _ => None,
            })
            .await;
            let t = Instant::now();
            set_target_label(&namespaces, &ns, Some(run)).await?;
            if let Some(at) = back.wait(1, Duration::from_secs(30)).await.first() {
                added.push(at.duration_since(t).as_secs_f64());
            }
            let new_ns = format!("{run}-n{i}");
            let wanted = new_ns.clone();
            let appears = Observer::start(copies.clone(), config.clone(), move |e| match e {
                Event::Apply(o) if o.namespace().as_deref() == Some(wanted.as_str()) => Some(o.name_any()),
                _ => None,
            })
            .await;
            let t = Instant::now();
            create_namespace(client, &new_ns, json!({RUN_LABEL: run, TARGET_LABEL: run})).await?;
            if let Some(at) = appears.wait(1, Duration::from_secs(30)).await.first() {
                fresh.push(at.duration_since(t).as_secs_f64());
            }
        }
        report["label_removed_to_copy_gone"] = json!(summarize(removed));
        report["label_added_to_copy_present"] = json!(summarize(added));
        report["namespace_created_to_copy_present"] = json!(summarize(fresh));
    }
    if plan.cluster_projections > 1 {
        let set = (plan.cluster_projections, args.samples.min(5));
        fan_out_set::measure(client, (run, source_ns), set, report).await?;
    }
    Ok(())
}

/// The physical limit of a fan-out: the apiserver's own throughput for the same writes. One
/// ConfigMap per target namespace, owned by no controller; per sample, a client that does nothing
/// else sends one merge PATCH of an annotation to each, `--write-concurrency` at a time (what both
/// operators do for their copies), and a watch records when the first and the last are delivered.
async fn apiserver_fan_out(
    client: &Client,
    args: &Args,
    run: &str,
    targets: &[String],
    report: &mut Value,
) -> anyhow::Result<()> {
    in_parallel(targets.to_vec(), |ns| async move {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "limit", "labels": {LIMIT_LABEL: run}}, "data": {"k": "v"}}))?;
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &cm)
            .await?;
        Ok(())
    })
    .await?;
    let objects = Api::<DynamicObject>::all_with(client.clone(), &kind_resource(0));
    let config = watcher::Config::default().labels(&format!("{LIMIT_LABEL}={run}"));
    let (mut first, mut last, mut answered) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.samples.min(10) {
        let value = now_nanos();
        let observer = Observer::start(objects.clone(), config.clone(), stamped(value.clone())).await;
        let t = Instant::now();
        projection_tests::in_parallel(targets.to_vec(), args.write_concurrency.max(1), |ns| {
            let (client, value) = (client.clone(), value.clone());
            async move {
                let api = Api::<DynamicObject>::namespaced_with(client, &ns, &kind_resource(0));
                stamp(&api, "limit", &value).await
            }
        })
        .await?;
        answered.push(t.elapsed().as_secs_f64());
        let seen = observer.wait(targets.len(), Duration::from_secs(120)).await;
        if seen.len() < targets.len() {
            bail!("only {} of {} writes were seen", seen.len(), targets.len());
        }
        let since = |at: Option<&Instant>| {
            at.map(|at| at.duration_since(t).as_secs_f64())
                .unwrap_or_default()
        };
        first.push(since(seen.iter().min()));
        last.push(since(seen.iter().max()));
    }
    report["apiserver_fan_out_first_write"] = json!(summarize(first));
    report["apiserver_fan_out_last_write"] = json!(summarize(last));
    report["apiserver_fan_out_all_answered"] = json!(summarize(answered));
    Ok(())
}

fn is_ready(conditions: Option<&[shared::api::crd::Condition]>) -> bool {
    conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.r#type == "Ready" && c.status == "True")
}

/// Deletes what the run created: ClusterProjections and Projections first (their finalizers need a
/// running controller), then the namespaces and the CRDs.
async fn cleanup(client: &Client, run: &str) {
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let _ = cps.delete_collection(&DeleteParams::default(), &lp).await;
    let projections: Api<Projection> = Api::all(client.clone());
    if let Ok(list) = projections.list(&lp).await {
        let _ = in_parallel(list.items, |p| {
            let client = client.clone();
            async move {
                let api: Api<Projection> = Api::namespaced(client, &p.namespace().unwrap_or_default());
                api.delete(&p.name_any(), &DeleteParams::default()).await?;
                Ok(())
            }
        })
        .await;
    }
    let _ = wait_until("Projections deleted", Duration::from_secs(300), || async {
        Ok(projections.list(&lp).await?.items.is_empty() && cps.list(&lp).await?.items.is_empty())
    })
    .await;
    delete_namespaces(client, &lp).await;
}

/// Deletes the namespaces `lp` selects in `client`'s cluster (namespaces have no
/// `deletecollection`: one DELETE each).
async fn delete_namespaces(client: &Client, lp: &ListParams) {
    let namespaces = Api::<Namespace>::all(client.clone());
    if let Ok(list) = namespaces.list(lp).await {
        let _ = in_parallel(list.items, |ns| {
            let namespaces = namespaces.clone();
            async move {
                namespaces
                    .delete(&ns.name_any(), &DeleteParams::default())
                    .await?;
                Ok(())
            }
        })
        .await;
    }
}

/// The latency figures of a report, in the order they are printed.
const LATENCIES: [&str; 18] = [
    "apiserver_write_to_watch",
    "remote_apiserver_write_to_watch",
    "remote_source_edit_to_copy",
    "remote_copy_deleted_to_restored",
    "remote_fan_out_edit_first_copy",
    "remote_fan_out_edit_last_copy",
    "source_edit_to_copy",
    "copy_deleted_to_restored",
    "fan_out_edit_first_copy",
    "fan_out_edit_last_copy",
    "apiserver_fan_out_first_write",
    "apiserver_fan_out_last_write",
    "apiserver_fan_out_all_answered",
    "fan_out_set_edit_first_copy",
    "fan_out_set_edit_last_copy",
    "label_removed_to_copy_gone",
    "label_added_to_copy_present",
    "namespace_created_to_copy_present",
];

fn print_table(profile: &str, report: &Value) {
    println!("\n### {profile}\n");
    println!("| measurement | samples | p50 ms | p95 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for key in LATENCIES {
        if let Some(s) = report.get(key).filter(|v| !v.is_null()) {
            println!(
                "| {key} | {} | {:.1} | {:.1} | {:.1} |",
                s["samples"],
                s["p50_ms"].as_f64().unwrap_or(0.0),
                s["p95_ms"].as_f64().unwrap_or(0.0),
                s["p99_ms"].as_f64().unwrap_or(0.0)
            );
        }
    }
    for key in [
        "projections_ready_seconds",
        "fan_out_initial_seconds",
        "fan_out_set",
        "fan_out_set_initial_seconds",
        "fan_out_set_initial_copies_per_second",
        "fan_out_set_copies_per_second",
        "remote_projections_ready_seconds",
        "remote_fan_out_initial_seconds",
        "requests_per_source_edit",
        "fan_out_requests_per_source_edit",
        "requests_per_idle_minute_all_clients",
        "controller",
        "controller_runtime",
    ] {
        if let Some(v) = report.get(key) {
            println!("\n{key}: {v}");
        }
    }
    if let Some(fraction) = fraction_of_limit(report) {
        println!("\nfan-out last copy / apiserver's own last write (p50): {fraction:.2}");
    }
    if let Some(fraction) = fan_out_set::fraction_of_limit(report) {
        println!(
            "\nClusterProjection set's copies per second / apiserver's own writes per second: {fraction:.2}"
        );
    }
}

/// Every figure of a report as (name, value), latencies in ms, request counts summed.
fn figures(report: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for key in LATENCIES {
        if let Some(s) = report.get(key).filter(|v| !v.is_null()) {
            for p in ["p50", "p95", "p99"] {
                out.push((
                    format!("{key} {p} ms"),
                    s[format!("{p}_ms")].as_f64().unwrap_or(0.0),
                ));
            }
        }
    }
    // `+ 0.0`: an empty sum of f64 is -0.0.
    let total = |v: &Value| {
        v.as_object()
            .map(|m| m.values().filter_map(Value::as_f64).sum::<f64>() + 0.0)
    };
    for (key, name) in [
        ("projections_ready_seconds", "all Projections Ready s"),
        ("fan_out_initial_seconds", "ClusterProjection first fan-out s"),
        (
            "fan_out_set_initial_seconds",
            "ClusterProjection set, first fan-out s",
        ),
        (
            "fan_out_set_initial_copies_per_second",
            "ClusterProjection set, first fan-out copies/s",
        ),
        (
            "fan_out_set_copies_per_second",
            "ClusterProjection set, copies/s after every source's edit (p50)",
        ),
    ] {
        if let Some(v) = report.get(key).and_then(Value::as_f64) {
            out.push((name.to_owned(), v));
        }
    }
    for (key, name) in [
        (
            "requests_per_source_edit",
            "requests per source edit (all clients)",
        ),
        (
            "fan_out_requests_per_source_edit",
            "requests per fan-out source edit (all clients)",
        ),
        (
            "requests_per_idle_minute_all_clients",
            "requests per idle minute (all clients)",
        ),
    ] {
        if let Some(v) = report.get(key).and_then(total) {
            out.push((name.to_owned(), v));
        }
    }
    for (group, keys) in [
        (
            "controller",
            &[
                "rss_steady_mib",
                "rss_peak_mib",
                "rss_steady_mib_all_replicas",
                "cpu_seconds_whole_run",
                "cpu_seconds_whole_run_busiest_replica",
                "cpu_seconds_idle_window",
            ][..],
        ),
        (
            "controller_runtime",
            &[
                "reconciles",
                "reconcile_errors",
                "reconcile_mean_ms",
                "workqueue_adds",
                "workqueue_retries",
                "rest_client_requests",
                "rest_client_requests_busiest_replica",
                "reconciles_busiest_replica",
            ][..],
        ),
    ] {
        for key in keys {
            if let Some(v) = report.get(group).and_then(|g| g.get(key)).and_then(Value::as_f64) {
                out.push((format!("{group} {key}"), v));
            }
        }
    }
    if let Some(fraction) = fan_out_set::fraction_of_limit(report) {
        out.push((
            "ClusterProjection set's copies/s / apiserver's own writes/s".to_owned(),
            fraction,
        ));
    }
    out
}

/// The fan-out's last copy against the apiserver's own last write, within one operator's run.
fn fraction_of_limit(report: &Value) -> Option<f64> {
    let p50 = |key: &str| report.get(key)?.get("p50_ms")?.as_f64();
    let limit = p50("apiserver_fan_out_last_write")?;
    (limit > 0.0).then(|| p50("fan_out_edit_last_copy").map(|last| last / limit))?
}

fn print_side_by_side(profile: &str, ours: &Value, go: &Value) {
    println!("\n### {profile}: ours and the Go operator, one after the other in one run\n");
    println!("| figure | ours | Go | ours / Go |");
    println!("|---|---|---|---|");
    let theirs: HashMap<String, f64> = figures(go).into_iter().collect();
    for (name, value) in figures(ours) {
        let other = theirs.get(&name).copied();
        let ratio = match other {
            Some(o) if o > 0.0 => format!("{:.2}", value / o),
            _ => "–".to_owned(),
        };
        let other = other.map_or("–".to_owned(), |o| format!("{o:.1}"));
        println!("| {name} | {value:.1} | {other} | {ratio} |");
    }
    if let (Some(a), Some(b)) = (fraction_of_limit(ours), fraction_of_limit(go)) {
        println!(
            "| fan-out last copy / apiserver's own last write (p50, same run) | {a:.2} | {b:.2} | {:.2} |",
            a / b
        );
    }
    for (name, report) in [("ours", ours), ("Go", go)] {
        for key in ["requests_per_source_edit", "fan_out_requests_per_source_edit"] {
            if let Some(v) = report.get(key) {
                println!("\n{name} {key}: {v}");
            }
        }
    }
}
