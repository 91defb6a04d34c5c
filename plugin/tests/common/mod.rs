//! Helpers of the plugin's tests: the plugin run as a process (its stdout, stderr and exit code, as a
//! script sees them), a real controller process, and manifests applied with kubectl.
#![allow(dead_code)]

use kube::{Api, Client};
use projection_tests::{ServiceProcess, kubeconfig_path, kubectl_stdin, repo_root, wait_for};
use serde_json::Value;
use shared::api::crd::{ClusterProjection, Projection};
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, SystemTime},
};

pub const TIMEOUT: Duration = Duration::from_secs(30);

/// One run of the plugin.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with the run unless it exited with `code`.
    #[track_caller]
    pub fn expect(self, code: i32) -> Self {
        assert_eq!(self.code, code, "exit code of {self:#?}");
        self
    }

    /// Its stdout as JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// Its stdout as YAML, read into JSON values.
    #[track_caller]
    pub fn yaml(&self) -> Value {
        serde_yaml::from_str(&self.stdout).unwrap_or_else(|e| panic!("not YAML ({e}): {}", self.stdout))
    }

    /// The stdout line that contains every one of `words`.
    #[track_caller]
    pub fn line_with(&self, words: &[&str]) -> String {
        self.stdout
            .lines()
            .find(|l| words.iter().all(|w| l.contains(w)))
            .unwrap_or_else(|| panic!("no line with {words:?} in:\n{}", self.stdout))
            .to_owned()
    }
}

/// The plugin binary.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kubectl-projection"))
}

/// Runs `kubectl-projection` with the test kubeconfig (`--kubeconfig`) and `args`.
pub fn plugin(args: &[&str]) -> Run {
    plugin_with(args, None, &[])
}

/// Runs the plugin with `args` (no `--kubeconfig` added), `stdin` and environment `env`.
pub fn plugin_raw(args: &[&str], stdin: Option<&str>, env: &[(&str, &Path)]) -> Run {
    use std::io::Write as _;
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("the plugin runs");
    let mut input = child.stdin.take().expect("piped");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("the plugin reads stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("the plugin ends");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the plugin with the test kubeconfig, `args`, `stdin` and `env`.
pub fn plugin_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &Path)]) -> Run {
    let kubeconfig = kubeconfig_path();
    let mut all = vec!["--kubeconfig", kubeconfig.to_str().expect("a UTF-8 path")];
    all.extend_from_slice(args);
    plugin_raw(&all, stdin, env)
}

/// The controller binary of this workspace, built (by cargo, in this target directory and profile)
/// unless one newer than its sources is there: `cargo test --workspace` has just built it.
pub fn controller_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test knows its path");
        // target/<profile>/deps/<test>
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
        let target_dir = profile_dir.parent().expect("target");
        let binary = profile_dir.join("projection-controller");
        let root = repo_root();
        let sources = ["controller", "shared", "runtime"].map(|c| root.join(c));
        let built_at = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
        if built_at.is_none_or(|at| sources.iter().any(|dir| newest(dir).is_some_and(|n| n > at))) {
            let mut cargo = Command::new(option_env!("CARGO").unwrap_or("cargo"));
            cargo
                .current_dir(&root)
                .args([
                    "build",
                    "--locked",
                    "-p",
                    "controller",
                    "--bin",
                    "projection-controller",
                ])
                .arg("--target-dir")
                .arg(target_dir);
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("cargo runs");
            assert!(
                status.success(),
                "building projection-controller failed: {status}"
            );
        }
        binary
    })
}

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(modified) = entry.metadata().and_then(|m| m.modified()) {
                newest = newest.max(Some(modified));
            }
        }
    }
    newest
}

/// A controller process that trusts its own access (the suites that write CRs as the admin without
/// the webhook do so), with a long retry cap.
pub async fn controller() -> ServiceProcess {
    let mut process = ServiceProcess::start(
        controller_binary(),
        &["--requeue-interval", "5m", "--author-access=trusted"],
    );
    process.wait_ready().await;
    process
}

/// Applies `yaml` with kubectl; panics with its stderr unless it succeeds.
pub fn apply(yaml: &str) {
    let out = kubectl_stdin(&["apply", "-f", "-"], yaml);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until the `Ready` condition of `name` (read through `api`) has `status` and `reason`.
async fn ready<K>(api: Api<K>, name: &str, status: &str, reason: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    condition(api, name, "Ready", status, reason).await;
}

/// Waits until the controller has handled a suspension of the Projection: its `Suspended`
/// condition is `True` (the plugin's `suspended` shows `spec.suspend` at once, before that).
pub async fn projection_suspended(client: &Client, namespace: &str, name: &str) {
    let api = Api::<Projection>::namespaced(client.clone(), namespace);
    condition(api, name, "Suspended", "True", "Suspended").await;
}

/// Waits until the controller has handled a suspension of the ClusterProjection.
pub async fn cluster_suspended(client: &Client, name: &str) {
    let api = Api::<ClusterProjection>::all(client.clone());
    condition(api, name, "Suspended", "True", "Suspended").await;
}

/// Waits until the condition `type_` of `name` (read through `api`) has `status` and `reason`.
async fn condition<K>(api: Api<K>, name: &str, type_: &str, status: &str, reason: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    wait_for(&format!("{name} {type_}={status} {reason}"), TIMEOUT, || async {
        let cr = serde_json::to_value(api.get(name).await.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let conditions = &cr["status"]["conditions"];
        conditions
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_ && c["status"] == status && c["reason"] == reason)
            .map(|_| ())
            .ok_or_else(|| conditions.to_string())
    })
    .await;
}

/// Waits until the Projection's `Ready` condition has `status` and `reason`.
pub async fn projection_ready(client: &Client, namespace: &str, name: &str, status: &str, reason: &str) {
    ready(
        Api::<Projection>::namespaced(client.clone(), namespace),
        name,
        status,
        reason,
    )
    .await;
}

/// Waits until the ClusterProjection's `Ready` condition has `status` and `reason`.
pub async fn cluster_ready(client: &Client, name: &str, status: &str, reason: &str) {
    ready(
        Api::<ClusterProjection>::all(client.clone()),
        name,
        status,
        reason,
    )
    .await;
}

/// kubectl commands run when dropped, in order, each waiting (at most 60 s) for what it deletes:
/// declared after the test's controller, it runs first, while the controller still removes the
/// finalizers, also when the test panics, so no CR of a failed test is left to act in later tests.
pub struct Cleanup(Vec<Vec<String>>);

impl Cleanup {
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// Deletes the ClusterProjection `name`.
    pub fn cluster_projection(&mut self, name: &str) {
        self.0.push(
            [
                "delete",
                "clusterprojection",
                name,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
    }

    /// Deletes every Projection of `namespace`.
    pub fn projections(&mut self, namespace: &str) {
        self.0.push(
            [
                "delete",
                "projections",
                "--all",
                "-n",
                namespace,
                "--wait=true",
                "--timeout=60s",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
    }

    /// Runs `args` with kubectl.
    pub fn kubectl(&mut self, args: &[&str]) {
        self.0.push(args.iter().map(|a| (*a).to_owned()).collect());
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for args in &self.0 {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _ = projection_tests::kubectl(&args);
        }
    }
}

/// Per row of the first preview of `preview -o json|yaml`, its namespace and action, in order.
pub fn preview_actions(previews: &Value) -> Vec<(String, String)> {
    previews[0]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["namespace"].as_str().unwrap_or_default().to_owned(),
                r["action"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}
