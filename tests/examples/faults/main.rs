//! Black-box fault injection for any controller implementing `projection.sh/v1`: it drives the
//! controller through the API only, breaks things around it (the controller process SIGKILLed, the
//! kube-apiserver or etcd of the local control plane SIGKILLed and started again, the leader of two
//! replicas SIGKILLed mid fan-out, the controller's path to the apiserver black-holed) and checks that
//! everything converges with nothing lost, nothing orphaned and nothing not ours touched. See
//! docs/reliability.md.
//!
//!     cargo build -p controller
//!     cargo run -p projection-tests --example faults -- \
//!         --controller target/debug/projection-controller --profile short
//!
//! The controller is started (and SIGKILLed) by the harness; the control plane is the local one
//! (`tests/control-plane/up.sh`, `TESTENV_DIR`), whose processes it restarts from their recorded
//! pid files with the same command line, environment and log.

mod black_hole;
mod leader_kill;

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use projection_tests::{ServiceProcess, in_parallel};
use serde_json::{Value, json};
use shared::{
    api::crd::{ClusterProjection, Projection},
    api::keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION, PROJECTABLE},
};
use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

const RUN_LABEL: &str = "faults.projection.sh/run";
const SELECTED_LABEL: &str = "faults.projection.sh/selected";
const COPY: &str = "settings-copy";
const PARALLEL: usize = 32;
/// How long a scenario may take to converge before it counts as failed.
const CONVERGE_LIMIT: Duration = Duration::from_secs(180);

#[derive(Parser, Debug)]
#[command(about = "Fault injection against a projection.sh/v1 controller on the local control plane")]
struct Args {
    /// The controller binary (started with the metrics and probe addresses, on two ports, and
    /// KUBECONFIG, plus `--controller-arg`s).
    #[arg(long)]
    controller: PathBuf,
    /// An extra flag for every controller the harness starts (repeatable), e.g. the Go operator's
    /// `--controller-arg=--metrics-secure=false --controller-arg=--leader-elect=false`.
    #[arg(long, allow_hyphen_values = true)]
    controller_arg: Vec<String>,
    /// Leave out the leader scenario (for a controller without our leader-election flags).
    #[arg(long)]
    no_leader: bool,
    /// short (CI: 100 namespaces, 3 kills, one apiserver restart) or full (1000 namespaces, 20
    /// kills, three apiserver restarts and one etcd restart).
    #[arg(long, default_value = "short")]
    profile: String,
    /// Override the profile's number of namespaces in the fan-out.
    #[arg(long)]
    namespaces: Option<usize>,
    /// Override the profile's number of controller kills.
    #[arg(long)]
    kills: Option<usize>,
    /// Override the profile's control-plane restarts, e.g. `kube-apiserver,etcd`.
    #[arg(long, value_delimiter = ',')]
    restart: Option<Vec<String>>,
    /// Override the profile's black-hole duration in seconds (short: 25, full: 160, past the
    /// default 150 s read timeout of our controller); 0 skips that scenario.
    #[arg(long)]
    black_hole_seconds: Option<u64>,
    /// An extra flag for the controller of the black-hole scenario (repeatable), e.g.
    /// `--black-hole-controller-arg=--api-read-timeout=20s` so that a short black hole outlasts
    /// the controller's timeouts.
    #[arg(long, allow_hyphen_values = true)]
    black_hole_controller_arg: Vec<String>,
    /// Seed of the random kill points and label flips (default: the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Where to write the JSON result (default: target/faults/<profile>-<run>.json).
    #[arg(long)]
    output: Option<PathBuf>,
}

struct Plan {
    namespaces: usize,
    kills: usize,
    restarts: Vec<String>,
    /// How long the controller's path stays black-holed; zero skips the scenario.
    black_hole: Duration,
}

fn plan(args: &Args) -> anyhow::Result<Plan> {
    let (namespaces, kills, restarts, black_hole): (usize, usize, &[&str], u64) = match args.profile.as_str()
    {
        "short" => (100, 3, &["kube-apiserver"], 25),
        "full" => (
            1000,
            20,
            &["kube-apiserver", "kube-apiserver", "kube-apiserver", "etcd"],
            160,
        ),
        other => bail!("unknown profile {other:?} (short, full)"),
    };
    Ok(Plan {
        namespaces: args.namespaces.unwrap_or(namespaces).max(2),
        kills: args.kills.unwrap_or(kills),
        // `--restart=` (empty) restarts nothing.
        restarts: args
            .restart
            .clone()
            .unwrap_or_else(|| restarts.iter().map(|s| (*s).to_owned()).collect())
            .into_iter()
            .filter(|component| !component.is_empty())
            .collect(),
        black_hole: Duration::from_secs(args.black_hole_seconds.unwrap_or(black_hole)),
    })
}

/// xorshift64*: reproducible kill points and flips from `--seed`.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runtime::crypto::install_crypto_provider();
    let args = Args::parse();
    let plan = plan(&args)?;
    ensure!(
        args.controller.is_file(),
        "no controller binary at {}",
        args.controller.display()
    );
    let client = projection_tests::client().await;
    projection_tests::install_crds(&client).await;
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let seed = args.seed.unwrap_or(clock.as_nanos() as u64 | 1);
    let run = format!("f{}", clock.as_secs() % 100_000_000);
    eprintln!(
        "run {run}, seed {seed}: {} namespaces, {} kills, restarts {:?}, black hole {:?}",
        plan.namespaces, plan.kills, plan.restarts, plan.black_hole
    );
    let mut random = Random(seed);
    let started = Instant::now();
    let mut controller = Controller::start(&args.controller, &args.controller_arg).await;
    let outcome = async {
        let kills = controller_kills(&client, &run, &plan, &mut random, &mut controller).await?;
        let restarts = control_plane_restarts(&client, &run, &plan, &mut controller).await?;
        anyhow::Ok(json!({"controller_kills": kills, "control_plane_restarts": restarts}))
    }
    .await;
    let controller_log = controller.log_paths();
    // The next scenarios run controllers of their own: this one would write beside them, and the
    // leader scenario's replicas must not be busy with other CRs (their writes would be counted).
    drop(controller);
    cleanup(&client, &run).await;
    let outcome = async {
        let mut report = outcome?;
        if !plan.black_hole.is_zero() {
            let controller_args = [&args.controller_arg[..], &args.black_hole_controller_arg[..]].concat();
            report["black_hole"] =
                black_hole::black_hole(&client, &run, &plan, &args.controller, &controller_args).await?;
            cleanup(&client, &run).await;
        }
        if !args.no_leader {
            report["leader_kill"] = leader_kill::leader_kill(
                &client,
                &run,
                &plan,
                &mut random,
                &args.controller,
                &args.controller_arg,
            )
            .await?;
        }
        anyhow::Ok(report)
    }
    .await;
    cleanup(&client, &run).await;
    let mut report = outcome?;
    report["run"] = json!(run);
    report["seed"] = json!(seed);
    report["profile"] = json!(args.profile);
    report["controller"] = json!(args.controller.display().to_string());
    report["controller_logs"] = json!(controller_log);
    report["elapsed_seconds"] = json!(started.elapsed().as_secs());
    let output = args.output.clone().unwrap_or_else(|| {
        projection_tests::repo_root()
            .join("target/faults")
            .join(format!("{}-{run}.json", args.profile))
    });
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&output, serde_json::to_string_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!("JSON written to {}", output.display());
    Ok(())
}

/// The controller process under test, restarted after each kill.
struct Controller {
    binary: PathBuf,
    args: Vec<String>,
    process: ServiceProcess,
    logs: Vec<PathBuf>,
}

/// Starts `binary` with `args` against the test kubeconfig.
fn start_controller(binary: &Path, args: &[String]) -> ServiceProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServiceProcess::start_split_as(binary, &args, &projection_tests::kubeconfig_path(), &[])
}

impl Controller {
    async fn start(binary: &Path, args: &[String]) -> Self {
        let mut process = start_controller(binary, args);
        process.wait_ready().await;
        let logs = vec![process.log.clone()];
        Self {
            binary: binary.to_owned(),
            args: args.to_vec(),
            process,
            logs,
        }
    }

    /// SIGKILL, then a new process (ready).
    async fn kill_and_restart(&mut self) {
        self.process.kill_hard();
        let mut process = start_controller(&self.binary, &self.args);
        process.wait_ready().await;
        self.logs.push(process.log.clone());
        self.process = process;
    }

    fn log_paths(&self) -> Vec<String> {
        self.logs.iter().map(|p| p.display().to_string()).collect()
    }
}

// ------------------------------------------------------------------------------------------------
// Scenario 1: the controller SIGKILLed at random points of a fan-out with edits and label flips.
// ------------------------------------------------------------------------------------------------

async fn controller_kills(
    client: &Client,
    run: &str,
    plan: &Plan,
    random: &mut Random,
    controller: &mut Controller,
) -> anyhow::Result<Value> {
    let source_ns = format!("{run}-src");
    create_namespace(client, &source_ns, BTreeMap::new(), run).await?;
    let sources = create_source(client, &source_ns).await?;

    // Half the namespaces selected to begin with; a stranger (a ConfigMap of the copy's name that
    // is not ours) in one namespace out of 25, selected or not.
    let names: Vec<String> = (0..plan.namespaces).map(|i| format!("{run}-n{i}")).collect();
    let mut selected: BTreeSet<String> = names.iter().filter(|_| random.below(2) == 0).cloned().collect();
    let strangers: BTreeSet<String> = names.iter().step_by(25).cloned().collect();
    in_parallel(names.clone(), PARALLEL, |name| {
        let labels = BTreeMap::from([(SELECTED_LABEL.to_owned(), selected.contains(&name).to_string())]);
        async move { create_namespace(client, &name, labels, run).await }
    })
    .await?;
    in_parallel(strangers.iter().cloned().collect(), PARALLEL, |ns| async move {
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": COPY}, "data": {"owner": "someone else"}}),
                )?,
            )
            .await?;
        Ok(())
    })
    .await?;
    let stranger_versions = stranger_versions(client, &strangers).await?;

    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let author = projection_tests::author_annotation(client).await?;
    cps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
            "metadata": {"name": run, "labels": {RUN_LABEL: run}, "annotations": author},
            "spec": {
                "source": {"version": "v1", "kind": "ConfigMap", "namespace": source_ns, "name": "settings"},
                "destination": {
                    "namespaceSelector": {"matchLabels": {SELECTED_LABEL: "true", RUN_LABEL: run}},
                    "name": COPY,
                },
            },
        }))?,
    )
    .await?;

    let mut value = 0;
    let mut kill_delays = Vec::new();
    let mut last_kill = Instant::now();
    for _ in 0..plan.kills {
        value += 1;
        edit_source(&sources, value).await?;
        let flips = flip_labels(client, &names, &mut selected, random, plan.namespaces / 10).await?;
        // The kill lands anywhere in the fan-out that the edit and the flips started.
        let delay = Duration::from_millis(random.below(1500));
        tokio::time::sleep(delay).await;
        last_kill = Instant::now();
        controller.kill_and_restart().await;
        kill_delays.push(delay.as_millis() as u64);
        eprintln!("kill after {delay:?} (value {value}, {flips} label flips); restarted");
    }
    let restarted = Instant::now();
    let expect = Expected {
        run,
        value,
        selected: &selected,
        strangers: &strangers,
        stranger_versions: &stranger_versions,
    };
    let converged = wait_converged(client, &expect).await?;
    let seconds = restarted.elapsed().as_secs_f64();
    let since_kill = last_kill.elapsed();
    eprintln!(
        "converged {seconds:.2} s after the last restart was ready, {since_kill:?} after the last kill"
    );
    Ok(json!({
        "namespaces": plan.namespaces,
        "kills": plan.kills,
        "kill_delays_ms": kill_delays,
        "selected_at_end": selected.len(),
        "strangers": strangers.len(),
        "converged_seconds_after_last_restart": (seconds * 100.0).round() / 100.0,
        "converged_seconds_after_last_kill": round2(since_kill),
        "final": converged,
    }))
}

async fn edit_source(sources: &Api<ConfigMap>, value: u64) -> anyhow::Result<()> {
    sources
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": value.to_string()}})),
        )
        .await?;
    Ok(())
}

/// Flips the selection label of `count` random namespaces; returns how many were flipped.
async fn flip_labels(
    client: &Client,
    names: &[String],
    selected: &mut BTreeSet<String>,
    random: &mut Random,
    count: usize,
) -> anyhow::Result<usize> {
    let picked: BTreeSet<String> = (0..count.max(1))
        .map(|_| names[random.below(names.len() as u64) as usize].clone())
        .collect();
    let mut flips = Vec::new();
    for name in &picked {
        let now = !selected.contains(name);
        if now {
            selected.insert(name.clone());
        } else {
            selected.remove(name);
        }
        flips.push((name.clone(), now));
    }
    let flipped = flips.len();
    in_parallel(flips, PARALLEL, |(name, now)| async move {
        Api::<Namespace>::all(client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {SELECTED_LABEL: now.to_string()}}})),
            )
            .await?;
        Ok(())
    })
    .await?;
    Ok(flipped)
}

struct Expected<'a> {
    run: &'a str,
    value: u64,
    selected: &'a BTreeSet<String>,
    strangers: &'a BTreeSet<String>,
    stranger_versions: &'a BTreeMap<String, String>,
}

async fn stranger_versions(
    client: &Client,
    strangers: &BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut versions = BTreeMap::new();
    for ns in strangers {
        let cm = Api::<ConfigMap>::namespaced(client.clone(), ns).get(COPY).await?;
        versions.insert(ns.clone(), cm.resource_version().unwrap_or_default());
    }
    Ok(versions)
}

/// Polls until the cluster is as expected; the last difference on timeout.
async fn wait_converged(client: &Client, expect: &Expected<'_>) -> anyhow::Result<Value> {
    let deadline = Instant::now() + CONVERGE_LIMIT;
    loop {
        match check_converged(client, expect).await {
            Ok(summary) => return Ok(summary),
            Err(difference) if Instant::now() > deadline => {
                bail!("not converged after {CONVERGE_LIMIT:?}: {difference:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn check_converged(client: &Client, expect: &Expected<'_>) -> anyhow::Result<Value> {
    let run = expect.run;
    let all = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={COPY}")))
        .await?;
    let mut written = 0;
    let mut orphans = Vec::new();
    let mut missing_or_stale = Vec::new();
    let mut present = BTreeSet::new();
    for cm in &all.items {
        let ns = cm.namespace().unwrap_or_default();
        if !ns.starts_with(&format!("{run}-n")) {
            continue;
        }
        present.insert(ns.clone());
        if expect.strangers.contains(&ns) {
            let version = cm.resource_version().unwrap_or_default();
            ensure!(
                expect.stranger_versions.get(&ns) == Some(&version),
                "the stranger in {ns} was touched (resourceVersion {version})"
            );
            continue;
        }
        let ours = cm
            .annotations()
            .get(OWNED_BY_CLUSTER_PROJECTION)
            .map(String::as_str)
            == Some(run);
        ensure!(ours, "a copy in {ns} does not name {run} as its owner");
        if !expect.selected.contains(&ns) {
            orphans.push(ns);
        } else if cm.data.as_ref().and_then(|d| d.get("value")) == Some(&expect.value.to_string()) {
            written += 1;
        } else {
            missing_or_stale.push(ns);
        }
    }
    for ns in expect.strangers {
        ensure!(present.contains(ns), "the stranger in {ns} was deleted");
    }
    let wanted: Vec<&String> = expect
        .selected
        .iter()
        .filter(|ns| !expect.strangers.contains(*ns) && !present.contains(*ns))
        .collect();
    ensure!(
        orphans.is_empty(),
        "{} orphaned copies, e.g. {:?}",
        orphans.len(),
        orphans.first()
    );
    ensure!(
        missing_or_stale.is_empty() && wanted.is_empty(),
        "{} stale and {} missing copies",
        missing_or_stale.len(),
        wanted.len()
    );
    let conflicts = expect.selected.intersection(expect.strangers).count();
    let cp = Api::<ClusterProjection>::all(client.clone()).get(run).await?;
    let status = cp.status.context("no status yet")?;
    ensure!(
        status.counts.namespaces_written as usize == written
            && status.counts.namespaces_failed as usize == conflicts,
        "status counts {} written / {} failed, expected {written} / {conflicts}",
        status.counts.namespaces_written,
        status.counts.namespaces_failed
    );
    Ok(json!({
        "copies": written,
        "orphans": 0,
        "strangers_touched": 0,
        "status_written": status.counts.namespaces_written,
        "status_failed": status.counts.namespaces_failed,
        "conflicts_expected": conflicts,
    }))
}

// ------------------------------------------------------------------------------------------------
// Scenario 2: kube-apiserver (or etcd) SIGKILLed and started again while a source is edited.
// ------------------------------------------------------------------------------------------------

async fn control_plane_restarts(
    client: &Client,
    run: &str,
    plan: &Plan,
    controller: &mut Controller,
) -> anyhow::Result<Value> {
    let (source_ns, dest_ns) = (format!("{run}-rsrc"), format!("{run}-rdst"));
    create_namespace(client, &source_ns, BTreeMap::new(), run).await?;
    create_namespace(client, &dest_ns, BTreeMap::new(), run).await?;
    let sources = create_source(client, &source_ns).await?;
    let (copies, owner) = create_projection(client, run, &source_ns, &dest_ns).await?;
    let pid = controller.process.pid();

    // Edits every 250 ms for the whole scenario, each recorded once the apiserver accepted it.
    let accepted = Arc::new(AtomicU64::new(0));
    let edits = {
        let (sources, accepted) = (sources.clone(), accepted.clone());
        tokio::spawn(async move {
            let mut value = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if edit_source(&sources, value + 1).await.is_ok() {
                    value += 1;
                    accepted.store(value, Ordering::SeqCst);
                }
            }
        })
    };
    let mut rounds = Vec::new();
    for component in &plan.restarts {
        // Steady state first: the copy follows the edits.
        let before = accepted.load(Ordering::SeqCst).max(1);
        wait_copy_at_least(&copies, &owner, before, Duration::from_secs(60)).await?;
        let killed = Instant::now();
        restart_component(component).await?;
        let down = killed.elapsed();
        wait_api_ready(client).await?;
        let ready = killed.elapsed();
        // The first edit accepted after the restart, and how long its copy took.
        let first = accepted.load(Ordering::SeqCst) + 1;
        while accepted.load(Ordering::SeqCst) < first {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let written = Instant::now();
        wait_copy_at_least(&copies, &owner, first, CONVERGE_LIMIT).await?;
        let propagated = written.elapsed();
        ensure!(
            controller.process.is_running() && controller.process.pid() == pid,
            "the controller exited during the {component} restart (log {})",
            controller.process.log.display()
        );
        eprintln!(
            "{component} restarted in {down:?}, API ready after {ready:?}; the next edit propagated in {propagated:?}"
        );
        rounds.push(json!({
            "component": component,
            "api_ready_seconds_after_kill": round2(ready),
            "first_edit_after_ready_propagated_seconds": round2(propagated),
            "edit_to_copy_after_kill_seconds": round2(killed.elapsed()),
        }));
    }
    edits.abort();
    let _ = edits.await;
    let last = accepted.load(Ordering::SeqCst);
    wait_copy_at_least(&copies, &owner, last, Duration::from_secs(60)).await?;
    let copy = copies.get(COPY).await?;
    let final_value = copy_value(&copy, &owner);
    ensure!(
        final_value == Some(last),
        "the copy holds {final_value:?}, the last accepted edit was {last}"
    );
    Ok(json!({"rounds": rounds, "edits_accepted": last, "copy_final_value": last, "controller_restarts": 0}))
}

fn round2(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}

fn copy_value(copy: &ConfigMap, owner: &str) -> Option<u64> {
    if copy.annotations().get(OWNED_BY_PROJECTION).map(String::as_str) != Some(owner) {
        return None;
    }
    copy.data.as_ref()?.get("value")?.parse().ok()
}

/// Polls (every 50 ms) until the copy holds `value` or a later one.
async fn wait_copy_at_least(
    copies: &Api<ConfigMap>,
    owner: &str,
    value: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let current = copies.get_opt(COPY).await.ok().flatten();
        let seen = current.as_ref().and_then(|c| copy_value(c, owner));
        if seen.is_some_and(|v| v >= value) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the copy still holds {seen:?} after {limit:?}; waiting for {value}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_api_ready(client: &Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_secs(2),
            Api::<Namespace>::all(client.clone()).list(&ListParams::default().limit(1)),
        )
        .await
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the apiserver did not answer within 180 s of its restart")
}

/// SIGKILLs the control-plane process recorded in `$TESTENV_DIR/<name>.pid` and starts it again
/// with the same command line, environment and working directory, appending to its log; the pid
/// file then names the new process, so `down.sh` stops it as usual.
async fn restart_component(name: &str) -> anyhow::Result<()> {
    let dir = projection_tests::testenv_dir();
    let pid_file = dir.join(format!("{name}.pid"));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .parse()?;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let split = |bytes: Vec<u8>| -> Vec<String> {
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    let argv = split(
        std::fs::read(proc.join("cmdline")).with_context(|| format!("{name} (pid {pid}) is not running"))?,
    );
    let environ = split(std::fs::read(proc.join("environ"))?);
    let cwd = std::fs::read_link(proc.join("cwd"))?;
    ensure!(!argv.is_empty(), "{name} has no command line");
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    // Gone from /proc only once reaped, which its parent can do only after every thread has exited
    // and so closed its listening sockets (a zombie leader may still have threads holding them).
    let deadline = Instant::now() + Duration::from_secs(30);
    while proc.exists() {
        ensure!(
            Instant::now() < deadline,
            "{name} (pid {pid}) still exists 30 s after SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("logs").join(format!("{name}.log")))?;
    let child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: it outlives the harness, like the process it replaces.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name} again"))?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    // Reaped when it exits (the next restart kills it), so that it leaves /proc.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(())
}

// ------------------------------------------------------------------------------------------------

async fn create_namespace(
    client: &Client,
    name: &str,
    mut labels: BTreeMap<String, String>,
    run: &str,
) -> anyhow::Result<()> {
    labels.insert(RUN_LABEL.to_owned(), run.to_owned());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// The source every scenario projects: an opted-in ConfigMap `settings` with `value: "0"`.
async fn create_source(client: &Client, namespace: &str) -> anyhow::Result<Api<ConfigMap>> {
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    sources
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "settings", "annotations": {PROJECTABLE: "true"}},
                "data": {"value": "0"},
            }))?,
        )
        .await?;
    Ok(sources)
}

/// A Projection `settings` in `dest_ns` of the source in `source_ns`, its copy named [`COPY`];
/// returns the copies' API and the owner the copy names.
async fn create_projection(
    client: &Client,
    run: &str,
    source_ns: &str,
    dest_ns: &str,
) -> anyhow::Result<(Api<ConfigMap>, String)> {
    let author = projection_tests::author_annotation(client).await?;
    Api::<Projection>::namespaced(client.clone(), dest_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "projection.sh/v1", "kind": "Projection",
                "metadata": {"name": "settings", "labels": {RUN_LABEL: run}, "annotations": author},
                "spec": {
                    "source": {"version": "v1", "kind": "ConfigMap", "namespace": source_ns, "name": "settings"},
                    "destination": {"name": COPY},
                },
            }))?,
        )
        .await?;
    Ok((
        Api::namespaced(client.clone(), dest_ns),
        format!("{dest_ns}/settings"),
    ))
}

/// Deletes what the run created. The controller is gone by now, so the CRs' finalizers are dropped
/// rather than waited for; the copies go with their namespaces.
async fn cleanup(client: &Client, run: &str) {
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    if let Ok(list) = cps.list(&lp).await {
        for cp in list.items {
            let _ = cps.patch(&cp.name_any(), &PatchParams::default(), &strip).await;
            let _ = cps.delete(&cp.name_any(), &DeleteParams::default()).await;
        }
    }
    if let Ok(list) = Api::<Projection>::all(client.clone()).list(&lp).await {
        for p in list.items {
            let api: Api<Projection> = Api::namespaced(client.clone(), &p.namespace().unwrap_or_default());
            let _ = api.patch(&p.name_any(), &PatchParams::default(), &strip).await;
            let _ = api.delete(&p.name_any(), &DeleteParams::default()).await;
        }
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete_collection(&DeleteParams::default(), &lp)
        .await;
}
