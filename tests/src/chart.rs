//! Support for the Helm chart's tests: rendering the chart, installing it on the local node with
//! the images built here, user certificates for the provided mode, and SubjectAccessReviews.

use crate::{
    control_plane_bin, kubeconfig_path, kubectl, kubectl_stdin, node::local_image_values, repo_root,
    testenv_dir,
};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde_json::{Value, json};

fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// The chart's folder.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/projection")
}

/// A command for the control plane's helm, bound to the test kubeconfig, with its caches and
/// configuration in the test environment (never the user's).
///
/// `helm template` renders for the Kubernetes version of the local control plane (`K8S_VERSION` of
/// `tests/control-plane/versions.env`) unless `args` name one: with no cluster to ask, helm
/// assumes a version of its own (v1.20.0 for a helm built from source), which the chart's
/// `kubeVersion` refuses.
pub fn helm_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(control_plane_bin().join("helm"));
    let home = testenv_dir().join("helm");
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(args);
    if args.first() == Some(&"template") && !args.iter().any(|a| a.starts_with("--kube-version")) {
        cmd.arg("--kube-version").arg(control_plane_version());
    }
    cmd
}

/// The Kubernetes version of the local control plane (`K8S_VERSION` in
/// `tests/control-plane/versions.env`), e.g. `v1.36.3`.
pub fn control_plane_version() -> String {
    let path = repo_root().join("tests/control-plane/versions.env");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("K8S_VERSION="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .expect("K8S_VERSION in versions.env")
}

/// Runs helm and returns its output.
pub fn helm(args: &[&str]) -> Output {
    helm_command(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run helm (built by tests/control-plane/build.sh): {e}"))
}

/// Like [`helm`], but panics with its stderr unless it succeeds; returns stdout.
pub fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `--set`-style values, each passed as `--set-json key=json` so types are exact.
pub type Values<'a> = &'a [(&'a str, Value)];

fn value_args(values: Values<'_>) -> Vec<String> {
    values
        .iter()
        .flat_map(|(key, value)| ["--set-json".to_owned(), format!("{key}={value}")])
        .collect()
}

/// The objects `helm template` renders, or helm's error text.
pub fn render(release: &str, namespace: &str, values: Values<'_>) -> Result<Rendered, String> {
    render_with(release, namespace, values, &[])
}

/// Like [`render`], for a cluster of Kubernetes `version` (e.g. `1.35.0`).
pub fn render_for_version(
    release: &str,
    namespace: &str,
    values: Values<'_>,
    version: &str,
) -> Result<Rendered, String> {
    render_with(release, namespace, values, &["--kube-version", version])
}

fn render_with(
    release: &str,
    namespace: &str,
    values: Values<'_>,
    extra: &[&str],
) -> Result<Rendered, String> {
    let chart = chart_dir();
    let mut args = vec![
        "template".to_owned(),
        release.to_owned(),
        chart.to_string_lossy().into_owned(),
        "--namespace".to_owned(),
        namespace.to_owned(),
    ];
    args.extend(value_args(values));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = helm(&args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(Rendered::parse(&String::from_utf8_lossy(&out.stdout)))
}

/// The chart's NOTES rendered for `values`, without a cluster: `helm template` does not print
/// NOTES.txt, so a copy of the chart gets a template that renders the same text into a ConfigMap.
pub fn notes(release: &str, namespace: &str, values: Values<'_>) -> Result<String, String> {
    let copy = std::env::temp_dir().join(format!(
        "projection-chart-notes-{}-{}",
        std::process::id(),
        NOTES_COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    copy_dir(&chart_dir(), &copy).map_err(|e| format!("copying the chart: {e}"))?;
    let text = std::fs::read_to_string(chart_dir().join("templates/NOTES.txt"))
        .map_err(|e| format!("templates/NOTES.txt: {e}"))?;
    std::fs::write(
        copy.join("templates/zz-rendered-notes.yaml"),
        format!(
            "{{{{- define \"rendered-notes\" }}}}{text}{{{{- end }}}}\napiVersion: v1\nkind: ConfigMap\n\
             metadata:\n  name: rendered-notes\ndata:\n  notes: |\n{{{{ include \"rendered-notes\" . | indent 4 }}}}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut args = vec![
        "template".to_owned(),
        release.to_owned(),
        copy.to_string_lossy().into_owned(),
        "--namespace".to_owned(),
        namespace.to_owned(),
        "--show-only".to_owned(),
        "templates/zz-rendered-notes.yaml".to_owned(),
    ];
    args.extend(value_args(values));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = helm(&args);
    let _ = std::fs::remove_dir_all(&copy);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let rendered = Rendered::parse(&String::from_utf8_lossy(&out.stdout));
    rendered.0[0]["data"]["notes"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no notes in {rendered:?}"))
}

static NOTES_COPIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Copies the folder `from` into `to` (created), recursively.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Rendered manifests, as JSON values.
#[derive(Debug, Clone)]
pub struct Rendered(pub Vec<Value>);

impl Rendered {
    /// Parses a multi-document YAML stream (empty documents dropped).
    pub fn parse(yaml: &str) -> Self {
        use serde::Deserialize;
        let objects = serde_yaml::Deserializer::from_str(yaml)
            .map(|doc| Value::deserialize(doc).expect("helm renders valid YAML"))
            .filter(|v| !v.is_null())
            .collect();
        Self(objects)
    }

    /// Every object of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The object of `kind` named `name`; panics naming what is there otherwise.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.0
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| {
                let names: Vec<_> = self
                    .of_kind(kind)
                    .iter()
                    .map(|o| o["metadata"]["name"].clone())
                    .collect();
                panic!("no {kind} {name} rendered; the {kind}s are {names:?}")
            })
    }

    /// Whether an object of `kind` named `name` is rendered.
    pub fn has(&self, kind: &str, name: &str) -> bool {
        self.0
            .iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }
}

/// The first container of a rendered Deployment.
pub fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// A container's args as strings.
pub fn args_of(deployment: &Value) -> Vec<String> {
    container(deployment)["args"]
        .as_array()
        .expect("the container has args")
        .iter()
        .map(|a| a.as_str().expect("args are strings").to_owned())
        .collect()
}

/// The value of `--flag=value` among a Deployment's args.
pub fn flag_value(deployment: &Value, flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    args_of(deployment)
        .into_iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}

/// A Helm release installed by a test, uninstalled when dropped. Its pods run the images built
/// here (`node::local_image_values`, ahead of the test's own values).
pub struct Release {
    /// The release name.
    pub name: String,
    /// The release namespace.
    pub namespace: String,
    uninstalled: bool,
}

/// Values every test release gets ahead of its own: `crds.install=false`. The tests share the
/// CRDs that [`crate::install_crds`] applies (no release owns them), and Helm refuses to install
/// a release whose templates include objects that exist without its ownership metadata; a
/// release that owned them would also take them along when uninstalled with `crds.keep=false`.
/// The CRD templates themselves are tested by `tests/e2e/chart_crds.rs` on a cluster of their own.
pub fn release_crds_values() -> Vec<(&'static str, Value)> {
    vec![("crds.install", json!(false))]
}

/// How long `helm --wait` may take for our chart on the local node.
const HELM_WAIT: &str = "3m";

impl Release {
    /// `helm install` of the chart, not waiting for its pods.
    pub fn install(name: &str, namespace: &str, values: Values<'_>) -> Self {
        Self::install_with(name, namespace, values, &[])
    }

    /// `helm install --wait`: returns once every Deployment is Available (their real probes passed).
    pub fn install_and_wait(name: &str, namespace: &str, values: Values<'_>) -> Self {
        Self::install_with(name, namespace, values, &["--wait", "--timeout", HELM_WAIT])
    }

    fn install_with(name: &str, namespace: &str, values: Values<'_>, flags: &[&str]) -> Self {
        let release = Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uninstalled: false,
        };
        release.run("install", values, flags);
        release
    }

    /// `helm upgrade --wait` with new values (replacing the previous ones).
    pub fn upgrade_and_wait(&self, values: Values<'_>) {
        self.run("upgrade", values, &["--wait", "--timeout", HELM_WAIT]);
    }

    /// `helm upgrade` with new values (replacing the previous ones), not waiting for its pods.
    pub fn upgrade(&self, values: Values<'_>) {
        self.run("upgrade", values, &[]);
    }

    fn run(&self, verb: &str, values: Values<'_>, flags: &[&str]) {
        let chart = chart_dir();
        let mut args = vec![
            verb.to_owned(),
            self.name.clone(),
            chart.to_string_lossy().into_owned(),
            "--namespace".to_owned(),
            self.namespace.clone(),
        ];
        args.extend(flags.iter().map(|f| (*f).to_owned()));
        let mut all = local_image_values();
        all.extend(release_crds_values());
        all.extend(values.iter().cloned());
        args.extend(value_args(&all));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        helm_ok(&args);
    }

    /// What `helm template` renders for this release with `values`: the objects it installed
    /// (its CRD values ahead of `values`, as [`Release::install`] passes them).
    pub fn render(&self, values: Values<'_>) -> Result<Rendered, String> {
        let mut all = release_crds_values();
        all.extend(values.iter().cloned());
        render(&self.name, &self.namespace, &all)
    }

    /// `helm uninstall --wait`, asserting it succeeds.
    pub fn uninstall(mut self) {
        self.uninstalled = true;
        helm_ok(&["uninstall", &self.name, "--namespace", &self.namespace, "--wait"]);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.uninstalled {
            let _ = helm(&["uninstall", &self.name, "--namespace", &self.namespace]);
        }
    }
}

/// Writes (or replaces) a `kubernetes.io/tls` Secret.
pub fn write_tls_secret(namespace: &str, name: &str, cert_pem: &str, key_pem: &str, ca_pem: &str) {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace},
        "data": {
            "tls.crt": encode(cert_pem.as_bytes()),
            "tls.key": encode(key_pem.as_bytes()),
            "ca.crt": encode(ca_pem.as_bytes()),
        },
    });
    let out = kubectl_stdin(&["apply", "-f", "-"], &secret.to_string());
    assert!(
        out.status.success(),
        "cannot write Secret {namespace}/{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed ECDSA P-256 serving certificate for `dns_names`, made with openssl (a user's own
/// certificate, for the provided mode); returns the certificate and key PEM.
pub fn self_signed(work_dir: &Path, dns_names: &[String]) -> (String, String) {
    std::fs::create_dir_all(work_dir).expect("work folder");
    let key = work_dir.join("tls.key");
    let cert = work_dir.join("tls.crt");
    let san = dns_names
        .iter()
        .map(|n| format!("DNS:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args(["-days", "2", "-subj", &format!("/CN={}", dns_names[0])])
        .args(["-addext", &format!("subjectAltName={san}")])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,digitalSignature,keyCertSign"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl could not make the certificate");
    (
        std::fs::read_to_string(cert).expect("certificate written"),
        std::fs::read_to_string(key).expect("key written"),
    )
}

/// Whether `user` (with `groups`) may `verb` `resource` (`plural` or `plural/subresource`,
/// optionally in `namespace`, and only the object `name` when given, for RBAC `resourceNames`), as
/// the apiserver's authorizer answers a SubjectAccessReview.
pub fn can(
    user: &str,
    groups: &[&str],
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": groups,
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource, "subresource": subresource,
                "namespace": namespace.unwrap_or(""), "name": name.unwrap_or(""),
            },
        },
    });
    let out = kubectl_stdin(&["create", "-f", "-", "-o", "json"], &review.to_string());
    assert!(
        out.status.success(),
        "SubjectAccessReview failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("kubectl prints JSON");
    answer["status"]["allowed"] == true
}

/// Whether an object exists (`kubectl get` succeeds).
pub fn exists(kind: &str, name: &str, namespace: Option<&str>) -> bool {
    let mut args = vec!["get", kind, name, "-o", "name"];
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    kubectl(&args).status.success()
}

/// `value` with every number as a float (`0` and `0.0` alike), for comparing objects across YAML
/// round trips (Helm's `toYaml` writes the float `0.0` as `0`: the same JSON number).
pub fn numbers_as_floats(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().expect("a finite number")),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, numbers_as_floats(v))).collect())
        }
        other => other,
    }
}
