//! What GitOps tools make of our CRs: the real kstatus library (`sigs.k8s.io/cli-utils`, through
//! the program in `tests/kstatus`), the verdict Flux's health checks and Helm 4's `--wait` act on,
//! and Helm 4 itself. Both are built from the Go module proxy by
//! `tests/control-plane/build-gitops.sh` and linked into the control plane's bin folder.

use crate::{control_plane_bin, kubeconfig_path, testenv_dir};
use serde::Deserialize;
use serde_json::Value;
use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

/// The path of `kstatus` or `helm4` in the control plane's bin folder; panics saying how to build
/// it when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = control_plane_bin().join(name);
    assert!(
        path.exists(),
        "{} is missing: run tests/control-plane/build-gitops.sh (it builds kstatus and Helm 4 from the Go \
         module proxy and links them there)",
        path.display()
    );
    path
}

/// What kstatus computed for one object.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Verdict {
    /// The object's name.
    pub name: String,
    /// `Current`, `InProgress`, `Failed`, `Terminating`, ...
    pub status: String,
    /// kstatus's message (a `Reconciling` or `Stalled` condition's message, or its own).
    pub message: String,
    /// An error computing it (a malformed object).
    #[serde(default)]
    pub error: Option<String>,
}

/// kstatus's verdict on each of `objects` (whole objects as the apiserver returns them), in order.
pub fn kstatus(objects: &[Value]) -> Vec<Verdict> {
    let mut child = Command::new(tool("kstatus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kstatus runs");
    {
        let mut stdin = child.stdin.take().expect("kstatus stdin");
        for object in objects {
            writeln!(stdin, "{object}").expect("object written to kstatus");
        }
    }
    let out = child.wait_with_output().expect("kstatus ends");
    assert!(
        out.status.success(),
        "kstatus failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<Verdict> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a kstatus verdict"))
        .collect();
    assert_eq!(verdicts.len(), objects.len(), "one verdict per object");
    verdicts
}

/// Runs Helm 4 with `args` against the test cluster, with folders of its own (`home`).
pub fn helm4(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(tool("helm4"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm4 runs")
}

/// The folder Helm 4's state and test charts go in, under the test environment.
pub fn helm4_home(name: &str) -> PathBuf {
    testenv_dir().join(format!("helm4-{name}-{}", std::process::id()))
}

/// The Argo CD health script of `docs/observability.md` (the `lua` block of its GitOps section),
/// so that the tests run the very text users copy.
pub fn argocd_health_script() -> String {
    let doc = std::fs::read_to_string(crate::repo_root().join("docs/observability.md"))
        .expect("docs/observability.md");
    let section = doc
        .split("**Argo CD.**")
        .nth(1)
        .expect("docs/observability.md has an Argo CD paragraph");
    let script = section
        .split("```lua\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the Argo CD paragraph has a lua block");
    script.to_owned()
}

/// What Argo CD's health check makes of `object` with `script`: (status, message), computed by
/// running the script under Lua (`lua5.4`, from scripts/prereqs.sh) with `obj` bound to the
/// object, as Argo CD does.
pub fn argocd_health(script: &str, object: &Value) -> (String, String) {
    let program = format!(
        "local obj = {}\nlocal function health(obj)\n{script}\nend\nlocal hs = health(obj)\n\
         io.write(hs.status, \"\\n\", hs.message or \"\", \"\\n\")\n",
        lua_literal(object)
    );
    let out = Command::new("lua5.4")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .expect("lua stdin")
                .write_all(program.as_bytes())?;
            child.wait_with_output()
        })
        .expect("lua5.4 runs (scripts/prereqs.sh installs it)");
    assert!(
        out.status.success(),
        "the Argo CD health script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.splitn(2, '\n');
    let status = lines.next().unwrap_or_default().to_owned();
    let message = lines.next().unwrap_or_default().trim_end().to_owned();
    (status, message)
}

/// `value` as a Lua table constructor, the way Argo CD hands an object to a health script.
fn lua_literal(value: &Value) -> String {
    match value {
        Value::Null => "nil".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lua_string(s),
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua_literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(fields) => format!(
            "{{{}}}",
            fields
                .iter()
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\{}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
