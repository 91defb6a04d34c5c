//! The local node (`tests/control-plane/node-up.sh`): our images and the real cert-manager run there
//! as pods. Tests that need it call [`node_with_cert_manager`], which fails, saying why, when the
//! node cannot start; they never fall back to running our services as host processes.

use crate::{kubectl, kubectl_ok, repo_root, testenv_dir};
use serde_json::{Value, json};
use std::{process::Command, sync::OnceLock};

/// The node's name and IP, and the pods' network (tests/control-plane/common.sh).
pub const NODE_NAME: &str = "projection-node";
pub const NODE_IP: &str = "198.19.255.1";
pub const POD_CIDR: &str = "198.18.0.0/16";
pub const POD_BRIDGE: &str = "prjbr0";
/// The comment of the iptables rule that drops pod traffic leaving by any other interface.
pub const GUARD_RULE_COMMENT: &str = "projection-node-guard";

/// Starts (or reuses) the node with our images imported and cert-manager installed, once per test
/// binary, through `tests/control-plane/cert-manager.sh`; panics with its output when it fails.
pub fn node_with_cert_manager() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        let out = Command::new(repo_root().join("tests/control-plane/cert-manager.sh"))
            .env("TESTENV_DIR", testenv_dir())
            .output()
            .map_err(|e| format!("cannot run tests/control-plane/cert-manager.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cert_manager_available()
    });
    if let Err(why) = ready {
        panic!(
            "the local node (kubelet, containerd, cert-manager) could not start; the node is a real \
             part of these tests, nothing stands in for it:\n{why}"
        );
    }
}

/// cert-manager's Deployments, which the chart's cert-manager mode needs answering.
const CERT_MANAGER_DEPLOYMENTS: [&str; 3] =
    ["cert-manager", "cert-manager-webhook", "cert-manager-cainjector"];

/// Waits (up to three minutes) until the node is Ready and cert-manager's Deployments are
/// Available: the release cert-manager.sh keeps from an earlier step may have lost its pods since
/// (a node that was not Ready for a while). Says what the node and the pods look like when not.
fn cert_manager_available() -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let node = String::from_utf8_lossy(
            &kubectl(&[
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            ])
            .stdout,
        )
        .into_owned();
        let unavailable: Vec<&str> = CERT_MANAGER_DEPLOYMENTS
            .into_iter()
            .filter(|d| deployment_available("cert-manager", d) != "True")
            .collect();
        if node == "True" && unavailable.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            let diagnosis = Command::new(repo_root().join("tests/control-plane/diagnose.sh"))
                .env("TESTENV_DIR", testenv_dir())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("tests/control-plane/diagnose.sh did not run: {e}"));
            return Err(format!(
                "after 180s the node's Ready is {node:?} and these cert-manager Deployments are not \
                 Available: {unavailable:?}\n{diagnosis}"
            ));
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

/// Chart values that run the images built here (`tests/control-plane/images.sh`); nothing can be
/// pulled, so the pull policy is Never.
pub fn local_image_values() -> Vec<(&'static str, Value)> {
    vec![
        (
            "controller.image.repository",
            json!("local.test/projection-controller"),
        ),
        ("controller.image.tag", json!("dev")),
        ("controller.image.pullPolicy", json!("Never")),
        ("webhook.image.repository", json!("local.test/projection-webhook")),
        ("webhook.image.tag", json!("dev")),
        ("webhook.image.pullPolicy", json!("Never")),
    ]
}

/// The pods in `namespace` matching `selector`, as JSON.
pub fn pods(namespace: &str, selector: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(&kubectl_ok(&[
        "get", "pods", "-n", namespace, "-l", selector, "-o", "json",
    ]))
    .expect("kubectl prints JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// A pod's name.
pub fn pod_name(pod: &Value) -> String {
    pod["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

/// The host PID of a pod's first container, as the node's containerd reports it.
pub fn container_pid(pod: &Value) -> u32 {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("pod {} has no running container", pod_name(pod)));
    let out = ctr(&["tasks", "ls"]);
    out.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == id).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("containerd runs no task {id}:\n{out}"))
}

/// Runs the node's `ctr` (its own containerd socket, the CRI namespace); returns stdout.
pub fn ctr(args: &[&str]) -> String {
    let socket = testenv_dir().join("node/containerd.sock");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .expect("ctr (Debian's containerd, installed by scripts/prereqs.sh) runs");
    assert!(
        out.status.success(),
        "ctr {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `command` in the network namespace of process `pid` (nsenter, from the host); returns
/// stdout and stderr together.
pub fn in_network_of(pid: u32, command: &[&str]) -> String {
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n"])
        .args(command)
        .output()
        .expect("nsenter runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The certificate (PEM) a TLS server on this machine serves at `address:port` for `server_name`.
pub fn served_certificate(address: &str, port: u16, server_name: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {address}:{port} -servername {server_name} </dev/null 2>/dev/null \
             | openssl x509"
        ))
        .output()
        .expect("openssl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `Available` condition of Deployment `namespace/name` ("True", "False" or "").
pub fn deployment_available(namespace: &str, name: &str) -> String {
    let out = kubectl(&[
        "get",
        "deployment",
        name,
        "-n",
        namespace,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Available')].status}",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
