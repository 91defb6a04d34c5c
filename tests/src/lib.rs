//! Support for tests that run against the real local control plane started by
//! `tests/control-plane/up.sh`: a client, one namespace per test, the CRDs, kubectl, and waits that
//! fail with a message saying what was awaited.
//!
//! Tests never read the user's `KUBECONFIG`: they only ever talk to the local control plane (or to
//! the kubeconfig named by `PROJECTION_TEST_KUBECONFIG`), because they create and delete objects.

pub mod attack;
pub mod black_hole;
pub mod chart;
pub mod gitops;
pub mod log_lines;
pub mod node;
pub mod prometheus;
pub mod remote;

use anyhow::Context as _;
use k8s_openapi::{
    api::core::v1::Namespace, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use std::{
    future::Future,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// Field manager of the test harness's own writes.
pub const TEST_FIELD_MANAGER: &str = "projection-tests";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root exists")
}

/// The folder of the local control plane (kubeconfig, logs, env).
pub fn testenv_dir() -> PathBuf {
    std::env::var_os("TESTENV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".testenv"))
}

/// The kubeconfig the tests use: `PROJECTION_TEST_KUBECONFIG`, else the local control plane's.
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("PROJECTION_TEST_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| testenv_dir().join("admin.kubeconfig"))
}

const HOW_TO_START: &str = "start the local control plane first: `tests/control-plane/up.sh` \
     (or run the whole suite with `scripts/test.sh`, which starts and stops it)";

/// A client for the local control plane. Panics, saying how to start it, when it is not running:
/// tests that need a cluster never pass or skip silently without one.
pub async fn client() -> Client {
    try_client()
        .await
        .unwrap_or_else(|e| panic!("no local control plane: {e:#}\n{HOW_TO_START}"))
}

/// A copy of the test kubeconfig whose server is `https://<addr>` (a proxy in front of the
/// apiserver), written as `<name>-<pid>.kubeconfig` in the test environment's folder.
pub fn kubeconfig_through(addr: std::net::SocketAddr, name: &str) -> PathBuf {
    let mut kubeconfig: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig_path()).expect("kubeconfig")).expect("YAML");
    kubeconfig["clusters"][0]["cluster"]["server"] = serde_json::json!(format!("https://{addr}"));
    let file = testenv_dir().join(format!("{name}-{}.kubeconfig", std::process::id()));
    std::fs::write(&file, kubeconfig.to_string()).expect("kubeconfig written");
    file
}

/// The apiserver's socket address, from the test kubeconfig (for a proxy placed in front of it).
pub async fn apiserver_addr() -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs as _;
    let url = test_config().await?.cluster_url;
    let host = url.host().context("the test kubeconfig's server has no host")?;
    let port = url.port_u16().unwrap_or(443);
    (host, port)
        .to_socket_addrs()?
        .next()
        .context("the apiserver's address does not resolve")
}

/// The client configuration of the test kubeconfig (for tests that build a client of their own).
pub async fn test_config() -> anyhow::Result<Config> {
    let path = kubeconfig_path();
    let kubeconfig =
        Kubeconfig::read_from(&path).with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

async fn try_client() -> anyhow::Result<Client> {
    let client = runtime::kube_client::client_for(test_config().await?)?;
    tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .context("the apiserver did not answer within 10s")?
        .context("the apiserver is not reachable")?;
    Ok(client)
}

/// The directory of the control plane binaries (kubectl, helm), linked by `up.sh`.
pub fn control_plane_bin() -> PathBuf {
    testenv_dir().join("bin")
}

/// A command for the control plane's own kubectl (same minor as the server), bound to the test
/// kubeconfig.
pub fn kubectl_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(control_plane_bin().join("kubectl"));
    // A discovery cache of its own: a CRD changed by a test is never hidden by a stale user cache.
    cmd.arg("--kubeconfig")
        .arg(kubeconfig_path())
        .arg("--cache-dir")
        .arg(testenv_dir().join("kubectl-cache"));
    cmd.args(args);
    cmd
}

/// Runs kubectl and returns its output; panics, saying how to start the control plane, when
/// kubectl is not there.
pub fn kubectl(args: &[&str]) -> Output {
    kubectl_command(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {}/kubectl: {e}\n{HOW_TO_START}",
            control_plane_bin().display()
        )
    })
}

/// Like [`kubectl`], but panics with its stderr unless it succeeds; returns stdout.
pub fn kubectl_ok(args: &[&str]) -> String {
    let out = kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs kubectl with `input` on its stdin (e.g. `apply -f -`) and returns its output.
pub fn kubectl_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = kubectl_command(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}\n{HOW_TO_START}"));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin
        .write_all(input.as_bytes())
        .expect("kubectl reads its stdin");
    drop(stdin);
    child.wait_with_output().expect("kubectl runs")
}

/// Polls `probe` until it yields a value, or panics after `timeout` naming what was awaited and the
/// last observation.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(20);
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(last) if start.elapsed() >= timeout => {
                panic!("timed out after {timeout:?} waiting for {what}; last observation: {last}")
            }
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Runs `f` over `items`, `parallel` at a time, failing on the first error (the harnesses' bulk
/// creations).
pub async fn in_parallel<T, F, Fut>(items: Vec<T>, parallel: usize, f: F) -> anyhow::Result<()>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    use futures::{StreamExt, TryStreamExt};
    futures::stream::iter(items)
        .map(f)
        .buffer_unordered(parallel)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// A namespace of its own for one test, deleted when dropped (also when the test panics).
pub struct TestNamespace {
    name: String,
}

static NAMESPACE_COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestNamespace {
    /// Creates `t-<prefix>-<pid>-<n>`; `prefix` should name the test.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let n = NAMESPACE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix: String = prefix
            .chars()
            .take(30)
            .collect::<String>()
            .trim_end_matches('-')
            .to_owned();
        let name = format!("t-{prefix}-{}-{n}", std::process::id());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"projection.test/suite": "true"}}
        }))
        .expect("namespace object");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("cannot create namespace {name}: {e}"));
        Self { name }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot await and the test's runtime may be gone: delete through kubectl, without
        // waiting for the namespace controller to finish.
        let _ = kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=false",
            "--ignore-not-found",
        ]);
    }
}

/// Installs (server-side apply) the committed CRDs from `charts/projection/crd-manifests/` and waits until
/// they are Established. Idempotent; every test that needs the CRDs calls it.
pub async fn install_crds(client: &Client) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let dir = repo_root().join(codegen::crds::CRD_DIR);
    let params = PatchParams::apply(TEST_FIELD_MANAGER).force();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("CRD folder exists") {
        let path = entry.expect("directory entry").path();
        let text = std::fs::read_to_string(&path).expect("CRD file readable");
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{} is not a CRD: {e}", path.display()));
        let name = crd.metadata.name.clone().expect("CRD has a name");
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("the apiserver refused {}: {e}", path.display()));
        names.push(name);
    }
    for name in names {
        wait_crd_established(client, &name).await;
    }
}

/// Waits until the CRD `name` is Established (its API is served).
pub async fn wait_crd_established(client: &Client, name: &str) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    wait_for(
        &format!("CRD {name} to be Established"),
        Duration::from_secs(30),
        || async {
            let crd = api.get(name).await.map_err(|e| e.to_string())?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established
                .then_some(())
                .ok_or_else(|| "not Established yet".to_owned())
        },
    )
    .await;
}

/// Deletes a cluster-scoped object by name when dropped (e.g. a ClusterProjection a test created).
pub struct ClusterScopedGuard {
    resource: String,
    name: String,
}

impl ClusterScopedGuard {
    /// Deletes `<resource>/<name>` on drop.
    pub fn new(resource: &str, name: &str) -> Self {
        Self {
            resource: resource.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl Drop for ClusterScopedGuard {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            &self.resource,
            &self.name,
            "--wait=false",
            "--ignore-not-found",
        ]);
    }
}

/// Deletes an object and ignores "not found".
pub async fn delete_ignoring_absent<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => panic!("cannot delete {name}: {e}"),
    }
}

/// Starts `binary` with `args`, waits until it has logged `ready_line`, sends SIGTERM and returns
/// how it exited. Proves that a service shuts down cleanly when Kubernetes stops its pod.
pub fn run_until_sigterm(binary: &Path, args: &[&str], ready_line: &str) -> std::process::ExitStatus {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(binary)
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready_line.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&ready) {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(20)).is_err() {
        let _ = child.kill();
        panic!("{} never logged {ready_line:?}", binary.display());
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait works") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not exit within 10s of SIGTERM", binary.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where [`free_port`] looks: below Linux's ephemeral range (32768 and up by default), which the
/// kernel hands to outgoing connections. A port asked of the kernel (`bind` to port 0) comes from
/// that range, so under a suite's connection churn an outgoing connection could take it before the
/// service it was meant for binds it (the likely cause of a controller of the faults harness that
/// never served `/readyz` in a CI run, 2026-11-28). The control planes' ports are below 20000.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A free TCP port on 127.0.0.1 for a service a test starts (the listener is closed again: the
/// service binds it next). Picked at random in [`TEST_PORTS`], so that test processes running side
/// by side rarely try the same, and checked by binding it.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    static PICKS: AtomicU32 = AtomicU32::new(0);
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    for _ in 0..1000 {
        let pick = RandomState::new().hash_one((std::process::id(), PICKS.fetch_add(1, Ordering::Relaxed)));
        let port = TEST_PORTS.start + u16::try_from(pick % span).expect("within the range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?} after 1000 tries")
}

/// A plain HTTP/1.0 GET on 127.0.0.1; returns the status code and body, or `None` if nothing
/// answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_accepting(port, path, None).map(|(code, _, body)| (code, body))
}

/// A plain HTTP/1.0 GET on 127.0.0.1 with an optional `Accept` header; returns the status code,
/// the `Content-Type` and the body, or `None` if nothing answers.
pub fn http_get_accepting(port: u16, path: &str, accept: Option<&str>) -> Option<(u16, String, String)> {
    http_get_from("127.0.0.1", port, path, accept)
}

/// Like [`http_get_accepting`], to `host` (an IP address, e.g. a pod's on the local node).
pub fn http_get_from(
    host: &str,
    port: u16,
    path: &str,
    accept: Option<&str>,
) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let address: std::net::SocketAddr = format!("{host}:{port}").parse().ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{accept}\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Some((code, content_type, body.to_owned()))
}

/// The value of one sample in an OpenMetrics/Prometheus text exposition, e.g.
/// `metric_value(&text, "projection_reconcile_total{kind=\"Projection\",result=\"success\"}")`.
pub fn metric_value(exposition: &str, sample: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.split_whitespace().next()?.parse().ok())
}

/// The path of a binary of this workspace (`projection-controller` of package `controller`,
/// `projection-webhook` of `webhook`) in the target folder of the running test, for tests outside
/// the binary's own package. `cargo test --workspace` builds it before any test runs; run alone, a
/// test needs `cargo build -p <package>` first. Panics when it is missing or older than a source
/// it is built from, rather than testing a stale binary.
pub fn workspace_binary(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // <target>/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in <target>/<profile>/deps");
    let path = profile_dir.join(name);
    let build = format!("cargo build -p {package} (cargo test --workspace builds it)");
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {build}", path.display()));
    fn newest(path: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(path).ok()?;
        if meta.is_dir() {
            std::fs::read_dir(path)
                .ok()?
                .filter_map(|e| newest(&e.ok()?.path()))
                .max()
        } else {
            meta.modified().ok()
        }
    }
    let root = repo_root();
    let package_sources = format!("{package}/src");
    for source in [
        package_sources.as_str(),
        "shared/src",
        "runtime/src",
        "Cargo.lock",
    ] {
        if let Some(changed) = newest(&root.join(source)) {
            assert!(
                changed <= built,
                "{} is older than {source}: {build}",
                path.display()
            );
        }
    }
    path
}

static PROCESS_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A service binary running against the local control plane, stopped with SIGTERM when dropped.
/// Its log goes to `.testenv/logs/<name>-<pid>-<n>.log`.
pub struct ServiceProcess {
    child: std::process::Child,
    /// Port of `/healthz`, `/readyz` and (unless started with [`ServiceProcess::start_split`])
    /// `/metrics`.
    pub http_port: u16,
    /// Port of `/metrics`.
    pub metrics_port: u16,
    /// Where its log is.
    pub log: PathBuf,
}

impl ServiceProcess {
    /// Starts `binary` with `args` plus the test kubeconfig and an HTTP port for probes and
    /// metrics (passed as `--metrics-bind-address` and `--health-probe-bind-address`).
    pub fn start(binary: &Path, args: &[&str]) -> Self {
        Self::start_as(binary, args, &kubeconfig_path(), &[])
    }

    /// Like [`ServiceProcess::start`], authenticated by `kubeconfig` (e.g. a ServiceAccount's) and
    /// with extra environment variables.
    pub fn start_as(binary: &Path, args: &[&str], kubeconfig: &Path, env: &[(&str, &str)]) -> Self {
        let http_port = free_port();
        Self::start_on(binary, args, kubeconfig, env, http_port, http_port)
    }

    /// Like [`ServiceProcess::start`], with `/metrics` on a port of its own (a controller-runtime
    /// manager, such as the Go operator's, cannot serve metrics and probes on one port).
    pub fn start_split(binary: &Path, args: &[&str]) -> Self {
        Self::start_split_as(binary, args, &kubeconfig_path(), &[])
    }

    /// [`ServiceProcess::start_split`] with [`ServiceProcess::start_as`]'s kubeconfig and
    /// environment: what a harness uses when the binary may be any controller.
    pub fn start_split_as(binary: &Path, args: &[&str], kubeconfig: &Path, env: &[(&str, &str)]) -> Self {
        let http_port = free_port();
        let mut metrics_port = free_port();
        while metrics_port == http_port {
            metrics_port = free_port();
        }
        Self::start_on(binary, args, kubeconfig, env, http_port, metrics_port)
    }

    /// Like [`ServiceProcess::start_as`], on the given ports (the same ports again when a test
    /// restarts a service that something, e.g. a Prometheus, keeps scraping).
    pub fn start_on(
        binary: &Path,
        args: &[&str],
        kubeconfig: &Path,
        env: &[(&str, &str)],
        http_port: u16,
        metrics_port: u16,
    ) -> Self {
        let address = format!("127.0.0.1:{http_port}");
        let metrics_address = format!("127.0.0.1:{metrics_port}");
        let name = binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let logs = testenv_dir().join("logs");
        std::fs::create_dir_all(&logs).expect("log folder");
        let n = PROCESS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let log = logs.join(format!("{name}-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary)
            .args([
                "--metrics-bind-address",
                &metrics_address,
                "--health-probe-bind-address",
                &address,
            ])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        Self {
            child,
            http_port,
            metrics_port,
            log,
        }
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) {
        let port = self.http_port;
        let log = self.log.clone();
        let mut exited = None;
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().expect("wait works") {
                exited = Some(status);
                break;
            }
            if http_get(port, "/readyz").is_some_and(|(code, _)| code == 200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        panic!(
            "service on port {port} never became ready (exited: {exited:?}); log {}:\n{tail}",
            log.display()
        );
    }

    /// The current `/metrics` text (retried: a loaded machine can be slow to answer).
    pub fn metrics(&self) -> String {
        for _ in 0..5 {
            if let Some((200, body)) = http_get(self.metrics_port, "/metrics") {
                return body;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        String::new()
    }

    /// The `/metrics` text once every one of `samples` is above zero. A pass counts itself after
    /// it wrote what a test waits for (a condition, an event), so a count read right after that
    /// may not be there yet.
    pub async fn metrics_once_counted(&self, samples: &[&str]) -> String {
        wait_for(
            &format!("{samples:?} above zero"),
            Duration::from_secs(30),
            || {
                let text = self.metrics();
                async move {
                    match samples
                        .iter()
                        .all(|s| metric_value(&text, s).is_some_and(|v| v > 0.0))
                    {
                        true => Ok(text),
                        false => Err(text),
                    }
                }
            },
        )
        .await
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the process (SIGSTOP), as a node too busy to schedule it would, until
    /// [`ServiceProcess::resume`].
    pub fn pause(&mut self) {
        assert!(self.signal("-STOP"), "kill -STOP {}", self.child.id());
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&mut self) {
        assert!(self.signal("-CONT"), "kill -CONT {}", self.child.id());
    }

    /// Sends `signal` (`kill`'s form, e.g. `-TERM`); whether it was delivered.
    fn signal(&self, signal: &str) -> bool {
        Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and waits (up to 10 s) for the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        // Failing only when the process is gone already, which the wait below sees.
        let _ = self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_hard();
        None
    }
}

impl Drop for ServiceProcess {
    /// Stops the process, then holds its log to what log pipelines parse (`log_lines`): every test
    /// that runs one of our services checks every JSON line it wrote. Not while the test is already
    /// failing.
    fn drop(&mut self) {
        self.terminate();
        if std::thread::panicking() {
            return;
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        // Ours only: a peer run beside them (the Go operator) logs as it likes.
        let ours = self
            .log
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("projection-"));
        let problems = if ours {
            log_lines::problems(&log)
        } else {
            Vec::new()
        };
        assert!(
            problems.is_empty(),
            "{} wrote log lines a pipeline cannot parse as one JSON object with unique keys:\n{}",
            self.log.display(),
            problems.join("\n")
        );
    }
}

/// The `events.k8s.io/v1` events in `namespace` about the object named `regarding`.
pub async fn events_about(
    client: &Client,
    namespace: &str,
    regarding: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    api.list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding))
        .collect()
}

/// Waits for an event with `reason` about `regarding` in `namespace`; returns its note.
pub async fn wait_for_event(client: &Client, namespace: &str, regarding: &str, reason: &str) -> String {
    wait_for(
        &format!("event {reason} about {namespace}/{regarding}"),
        Duration::from_secs(20),
        || async {
            let events = events_about(client, namespace, regarding).await;
            events
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .map(|e| e.note.clone().unwrap_or_default())
                .ok_or_else(|| {
                    format!(
                        "events so far: {:?}",
                        events
                            .iter()
                            .map(|e| e.reason.clone().unwrap_or_default())
                            .collect::<Vec<_>>()
                    )
                })
        },
    )
    .await
}

/// Whether the apiserver of `client` has sharded list and watch (feature gate
/// `ShardedListAndWatch`, on in the second local control plane), from its own metrics.
pub async fn sharded_list_and_watch(client: &Client) -> bool {
    client
        .request_text(http::Request::get("/metrics").body(Vec::new()).expect("request"))
        .await
        .expect("the apiserver's metrics")
        .lines()
        .any(|line| line == "kubernetes_feature_enabled{name=\"ShardedListAndWatch\",stage=\"ALPHA\"} 1")
}

/// The machine's cores, shared by the test binaries that `scripts/test.sh` runs side by side (in
/// three lanes, each on clusters of its own): held through a lock on a file of the machine's
/// temporary folder until dropped.
pub struct Cores {
    _lock: std::fs::File,
}

/// Takes the machine's cores alone, for a test that loads them on purpose (an attack on the
/// webhook, thousands of CRs) and asserts on time under that load: it waits until no other such
/// test and no test of [`cores_timed`] runs in any test binary on the machine. Take it before
/// [`exclusive`] (or anything that takes it), never after, so that no two tests wait on each other.
pub async fn cores_alone() -> Cores {
    cores(true).await
}

/// Takes the machine's cores with other tests of its kind, for a test whose assertions are about
/// time (a takeover within the Lease, a pass cut within seconds): it waits while a test of
/// [`cores_alone`] runs anywhere on the machine, so that the load is not another test's attack.
/// Take it before [`exclusive`], as [`cores_alone`].
pub async fn cores_timed() -> Cores {
    cores(false).await
}

async fn cores(alone: bool) -> Cores {
    let path = std::env::temp_dir().join("projection-tests-cores.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if alone { file.lock() } else { file.lock_shared() }
            .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
        Cores { _lock: file }
    })
    .await
    .expect("the lock is taken")
}

/// Serialises tests that each run their own controller: two controllers on one cluster would both
/// reconcile every object.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

impl TestNamespace {
    /// Deletes the namespace and waits until it is gone (its objects' finalizers included), so a
    /// controller still running can clean up after the test.
    pub async fn delete_and_wait(self, client: &Client) {
        let api = Api::<Namespace>::all(client.clone());
        let name = self.name.clone();
        let _ = api.delete(&name, &DeleteParams::default()).await;
        // kube-controller-manager's namespace controller empties namespaces a few at a time, each
        // with a request per resource type: behind the dozens an earlier suite deleted, on cores
        // the other lanes share, one took over 60 s in a CI run, gone once that backlog was through.
        wait_for(
            &format!("namespace {name} to be deleted"),
            Duration::from_secs(180),
            || async {
                match api.get_opt(&name).await {
                    Ok(None) => Ok(()),
                    Ok(Some(ns)) => Err(format!("phase {:?}", ns.status.and_then(|s| s.phase))),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
    }
}

/// Namespaces a test creates by the dozen, all labelled `projection.test/run=<run>` and deleted
/// together (without waiting) when dropped.
pub struct NamespaceSet {
    /// The label value shared by the set.
    pub run: String,
    names: Vec<String>,
}

impl NamespaceSet {
    /// An empty set for a test named `prefix`.
    pub fn new(prefix: &str) -> Self {
        let n = NAMESPACE_COUNTER.fetch_add(1, Ordering::Relaxed);
        Self {
            run: format!("{prefix}-{}-{n}", std::process::id()),
            names: Vec::new(),
        }
    }

    /// The name the set gives to its member `suffix`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.run)
    }

    /// Creates the member `suffix` with `labels` (plus the run label); returns its name.
    pub async fn create(&mut self, client: &Client, suffix: &str, labels: &[(&str, &str)]) -> String {
        let name = self.name(suffix);
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &self.namespace_object(&name, labels))
            .await
            .unwrap_or_else(|e| panic!("cannot create namespace {name}: {e}"));
        self.names.push(name.clone());
        name
    }

    /// Creates `count` members named `<prefix>-<i>`, 16 at a time.
    pub async fn create_many(
        &mut self,
        client: &Client,
        prefix: &str,
        count: usize,
        labels: &[(&str, &str)],
    ) -> Vec<String> {
        use futures::StreamExt;
        let names: Vec<String> = (0..count)
            .map(|i| self.name(&format!("{prefix}-{i:04}")))
            .collect();
        let api = Api::<Namespace>::all(client.clone());
        let results: Vec<Result<Namespace, kube::Error>> = futures::stream::iter(&names)
            .map(|name| {
                let (api, ns) = (api.clone(), self.namespace_object(name, labels));
                async move { api.create(&PostParams::default(), &ns).await }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for r in results {
            r.unwrap_or_else(|e| panic!("cannot create namespace: {e}"));
        }
        self.names.extend(names.iter().cloned());
        names
    }

    fn namespace_object(&self, name: &str, labels: &[(&str, &str)]) -> Namespace {
        let mut all: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
            .collect();
        all.insert("projection.test/run".into(), self.run.clone().into());
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": all}}))
            .expect("namespace object")
    }
}

impl Drop for NamespaceSet {
    fn drop(&mut self) {
        let selector = format!("projection.test/run={}", self.run);
        let _ = kubectl_command(&[
            "delete",
            "namespace",
            "-l",
            &selector,
            "--wait=false",
            "--ignore-not-found",
        ])
        .output();
    }
}

static KUBECONFIG_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Writes a kubeconfig that authenticates as ServiceAccount `namespace/name` with a token from
/// `kubectl create token` (the TokenRequest API, as a pod's projected token), against the local
/// control plane; returns its path.
pub fn service_account_kubeconfig(namespace: &str, name: &str) -> PathBuf {
    let token = kubectl_ok(&["create", "token", name, "-n", namespace, "--duration=2h"]);
    let admin: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(kubeconfig_path()).expect("the test kubeconfig is readable"),
    )
    .expect("the test kubeconfig is YAML");
    let cluster = admin["clusters"][0]["cluster"].clone();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token.trim()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": name, "namespace": namespace}}],
        "current-context": "sa",
    });
    let n = KUBECONFIG_COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = testenv_dir().join(format!(
        "sa-{namespace}-{name}-{}-{n}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(
        &path,
        serde_json::to_string(&config).expect("kubeconfig serialises"),
    )
    .expect("kubeconfig written");
    path
}

/// The annotation recording the user of `client` as the author of a CR (`projection.sh/author`),
/// as the webhook records it: for tools that write CRs straight to the apiserver (the benchmark,
/// fault injection), so a controller that checks authors (its default) copies for them.
pub async fn author_annotation(client: &Client) -> anyhow::Result<serde_json::Value> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("asking the apiserver who we are (SelfSubjectReview)")?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    let author = shared::policy::author::Author::of(
        user.username.as_deref().unwrap_or_default(),
        user.groups.as_deref().unwrap_or_default(),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(serde_json::json!({shared::policy::author::AUTHOR: author.record()}))
}

/// A client acting as `user` in `groups`: the test's admin impersonating them, as `kubectl --as`.
pub async fn client_as(user: &str, groups: &[&str]) -> Client {
    let mut config = test_config().await.expect("test kubeconfig");
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
    Client::try_from(config).expect("impersonating client")
}

/// A client with the identity of `kubeconfig` (e.g. a ServiceAccount's token from
/// [`service_account_kubeconfig`]).
pub async fn client_from(kubeconfig: &Path) -> Client {
    let file = Kubeconfig::read_from(kubeconfig).expect("a readable kubeconfig");
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

/// Merge-patches the webhook configuration `name` (`plural`: `validatingwebhookconfigurations` or
/// `mutatingwebhookconfigurations`) as `client`'s user, with no read first (the webhook's
/// ServiceAccount may patch its configurations but not get them); the apiserver's refusal as its
/// message.
pub async fn patch_webhook_configuration(
    client: &Client,
    plural: &str,
    name: &str,
    patch: &serde_json::Value,
    dry_run: bool,
) -> Result<(), String> {
    use kube::{api::DynamicObject, discovery::ApiResource};
    let kind = if plural.starts_with("validating") {
        "ValidatingWebhookConfiguration"
    } else {
        "MutatingWebhookConfiguration"
    };
    let resource = ApiResource {
        group: "admissionregistration.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "admissionregistration.k8s.io/v1".to_owned(),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let params = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(e) => Err(e.to_string()),
    }
}
