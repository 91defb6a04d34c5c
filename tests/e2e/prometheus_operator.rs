//! The chart's ServiceMonitors and PrometheusRule the way kube-prometheus-stack users run them: the
//! real prometheus-operator (built from its Go module by `tests/control-plane/build-monitoring.sh`, at
//! `PROMETHEUS_OPERATOR_VERSION` of `versions.env`) turns them into the configuration and the rule
//! files of a Prometheus it runs as a StatefulSet on the local node, from the image of the Prometheus
//! server built here (`tests/control-plane/images.sh`). The chart runs on the node too, installed
//! with `helm install --wait` and our images.
//!
//! What a user would see is read from that Prometheus' API at its pod IP: every controller and
//! webhook pod a scrape target that is up, under the job the chart's alerts select; the chart's
//! alerts loaded from the operator's rule files and evaluated without error; the "down" alerts
//! quiet; `ProjectionNotReady` firing for a Projection whose source is missing, and resolving once
//! the source exists.
//!
//! The operator runs as a process on the host with the admin kubeconfig (in a cluster it runs in a
//! pod with its ClusterRole), allowed only the test's namespaces (`--namespaces`), so it touches
//! nothing else on the cluster.

use projection_tests::{
    TestNamespace,
    chart::{Release, render},
    client, control_plane_bin, exclusive, http_get_from, install_crds, kubeconfig_path, kubectl, kubectl_ok,
    kubectl_stdin,
    node::{node_with_cert_manager, pod_name, pods},
    prometheus::{Alert, PrometheusApi, Scratch, percent_encode},
    repo_root, wait_crd_established, wait_for,
};
use serde_json::{Value, json};
use std::{
    cell::RefCell,
    collections::BTreeSet,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const RELEASE: &str = "projection-po";
/// The Prometheus custom resource; the operator names its StatefulSet `prometheus-<name>`.
const PROMETHEUS: &str = "kps";
/// What kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by
/// (`release: <its release name>`), and what its users therefore put on ours.
const SELECTED_BY: &str = "kube-prometheus-stack";
/// How long the operator's Prometheus may take to serve (a StatefulSet, an init container, the
/// server), to scrape every target, and an alert to fire or resolve.
const START: Duration = Duration::from_secs(180);
const SCRAPE: Duration = Duration::from_secs(90);
const FIRE: Duration = Duration::from_secs(90);

/// A variable of `tests/control-plane/versions.env`.
fn pinned(name: &str) -> String {
    let path = repo_root().join("tests/control-plane/versions.env");
    let text = std::fs::read_to_string(&path).expect("versions.env");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{} sets no {name}", path.display()))
        .trim()
        .to_owned()
}

/// The Prometheus release of the module version `PROMETHEUS_VERSION` (v0.316.0 is 3.16.0), as
/// `prometheus_release` of `tests/control-plane/common.sh` tags the image.
fn prometheus_release() -> String {
    let module = pinned("PROMETHEUS_VERSION");
    let rest = module
        .strip_prefix("v0.3")
        .unwrap_or_else(|| panic!("PROMETHEUS_VERSION {module} is not a 3.x release's module version"));
    let (minor, patch) = rest.split_once('.').expect("v0.3MM.P");
    format!("v3.{}.{patch}", minor.parse::<u32>().expect("a minor version"))
}

/// prometheus-operator running on the host; killed when dropped.
struct Operator {
    /// In a cell: the waits' probes check it is still running through a shared reference.
    child: RefCell<Child>,
    log: PathBuf,
}

impl Operator {
    /// Starts the operator watching `namespaces` only, its Prometheus' config reloader from the image
    /// built here.
    fn start(scratch: &Scratch, namespaces: &[&str]) -> Self {
        let binary = control_plane_bin().join("prometheus-operator");
        assert!(
            binary.exists(),
            "{} is missing: run tests/control-plane/build-monitoring.sh (it builds prometheus-operator from its \
             Go module) and tests/control-plane/up.sh",
            binary.display()
        );
        let log = scratch.dir.join("operator.log");
        let port = projection_tests::free_port();
        let child = Command::new(binary)
            .env("KUBECONFIG", kubeconfig_path())
            .arg(format!("--namespaces={}", namespaces.join(",")))
            .arg(format!(
                "--prometheus-config-reloader=local.test/prometheus-config-reloader:{}",
                pinned("PROMETHEUS_OPERATOR_VERSION")
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log-level=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("prometheus-operator starts");
        Self {
            child: RefCell::new(child),
            log,
        }
    }

    /// The last lines of its log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Fails with its log if it has exited.
    fn assert_running(&self) {
        if let Ok(Some(status)) = self.child.borrow_mut().try_wait() {
            panic!("prometheus-operator exited ({status}):\n{}", self.log_tail());
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// prometheus-operator's CRDs (from its Go module, cached by `tests/control-plane/build.sh`); the
/// ones this test added are deleted when dropped.
struct OperatorCrds {
    added: Vec<String>,
}

impl OperatorCrds {
    async fn install(client: &kube::Client) -> Self {
        let monitoring_crds = || -> BTreeSet<String> {
            kubectl_ok(&["get", "crd", "-o", "name"])
                .lines()
                .filter_map(|l| l.strip_prefix("customresourcedefinition.apiextensions.k8s.io/"))
                .filter(|n| n.ends_with(".monitoring.coreos.com"))
                .map(str::to_owned)
                .collect()
        };
        let before = monitoring_crds();
        // The trailing slash makes kubectl follow the link to the folder.
        let dir = format!(
            "{}/",
            control_plane_bin().join("prometheus-operator-all-crds").display()
        );
        kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", &dir]);
        let after = monitoring_crds();
        for name in &after {
            wait_crd_established(client, name).await;
        }
        assert!(
            after.contains("prometheuses.monitoring.coreos.com"),
            "no Prometheus CRD among {after:?}"
        );
        Self {
            added: after.difference(&before).cloned().collect(),
        }
    }
}

impl Drop for OperatorCrds {
    fn drop(&mut self) {
        for name in &self.added {
            let _ = kubectl(&["delete", "crd", name, "--wait=false", "--ignore-not-found"]);
        }
    }
}

fn apply(object: &Value) {
    let out = kubectl_stdin(&["apply", "-f", "-"], &object.to_string());
    assert!(
        out.status.success(),
        "kubectl apply refused {object}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What kube-prometheus-stack gives its Prometheus: a ServiceAccount that may discover the targets
/// (here a Role in the release's namespace only, where the ServiceMonitors point).
fn prometheus_service_account(monitoring: &str, release_namespace: &str) {
    apply(&json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "prometheus", "namespace": monitoring},
    }));
    apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "prometheus-discovery", "namespace": release_namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ],
    }));
    apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "prometheus-discovery", "namespace": release_namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prometheus-discovery"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": monitoring}],
    }));
}

/// A Prometheus custom resource as kube-prometheus-stack writes one: it selects ServiceMonitors and
/// PrometheusRules labelled `release: kube-prometheus-stack` in every namespace (the operator is
/// allowed only the test's). The image is the one built here; scrapes and evaluations every 2 s.
fn prometheus_resource(monitoring: &str) -> Value {
    let release = prometheus_release();
    let selector = json!({"matchLabels": {"release": SELECTED_BY}});
    json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS, "namespace": monitoring},
        "spec": {
            "image": format!("local.test/prometheus:{release}"),
            "version": release,
            "imagePullPolicy": "Never",
            "replicas": 1,
            "serviceAccountName": "prometheus",
            "serviceMonitorSelector": selector,
            "serviceMonitorNamespaceSelector": {},
            "ruleSelector": selector,
            "ruleNamespaceSelector": {},
            "scrapeInterval": "2s",
            "evaluationInterval": "2s",
            "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": true, "fsGroup": 65534},
            "resources": {"requests": {"cpu": "50m", "memory": "100Mi"}, "limits": {"memory": "1Gi"}},
        },
    })
}

/// The chart's values: ServiceMonitors and PrometheusRule labelled for that Prometheus, scraped
/// every 2 s over HTTPS (the metrics certificate issued by cert-manager); `ProjectionNotReady`
/// after 5 s (15 m by default); metrics reachable from the monitoring namespace under the chart's
/// NetworkPolicy (not enforced by the node's bridge plugin, but what a user must set).
fn chart_values(monitoring: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("webhook.certificate.mode", json!("cert-manager")),
        ("metrics.tls.enabled", json!(true)),
        ("metrics.serviceMonitor.enabled", json!(true)),
        ("metrics.serviceMonitor.labels", json!({"release": SELECTED_BY})),
        ("metrics.serviceMonitor.interval", json!("2s")),
        ("metrics.serviceMonitor.scrapeTimeout", json!("1s")),
        ("metrics.prometheusRule.enabled", json!(true)),
        ("metrics.prometheusRule.labels", json!({"release": SELECTED_BY})),
        (
            "metrics.prometheusRule.runbookBaseUrl",
            json!("https://runbooks.example.com/projection/troubleshooting.html"),
        ),
        ("metrics.prometheusRule.alerts.notReady.for", json!("5s")),
        (
            "networkPolicy.metricsFrom",
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring}}}]),
        ),
    ]
}

/// The alert names of the chart's PrometheusRule rendered with `values`.
fn chart_alerts(namespace: &str, values: &[(&str, Value)]) -> BTreeSet<String> {
    let objects = render(RELEASE, namespace, values).expect("the chart renders");
    let rule = objects.get("PrometheusRule", RELEASE);
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| r["alert"].as_str().expect("alerting rules").to_owned())
        .collect()
}

/// Waits until the operator's Prometheus pod answers `/-/ready` at its pod IP; returns its API.
async fn wait_prometheus_serving(operator: &Operator, monitoring: &str) -> PrometheusApi {
    let pod = format!("prometheus-{PROMETHEUS}-0");
    let ip = wait_for("the operator's Prometheus to serve", START, || async {
        operator.assert_running();
        let out = kubectl(&["get", "pod", &pod, "-n", monitoring, "-o", "json"]);
        let Ok(pod) = serde_json::from_slice::<Value>(&out.stdout) else {
            return Err(format!(
                "no pod {pod} yet; statefulsets: {}; operator log:\n{}",
                String::from_utf8_lossy(&kubectl(&["get", "statefulset", "-n", monitoring]).stdout),
                operator.log_tail()
            ));
        };
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        match http_get_from(&ip, 9090, "/-/ready", None) {
            Some((200, _, _)) => Ok(ip),
            other => Err(format!(
                "/-/ready at {ip}:9090: {other:?}; pod status: {}",
                pod["status"]
            )),
        }
    })
    .await;
    PrometheusApi { host: ip, port: 9090 }
}

/// The running pods of the release's `component`.
fn component_pods(namespace: &str, component: &str) -> Vec<String> {
    pods(
        namespace,
        &format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"),
    )
    .iter()
    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    .map(pod_name)
    .collect()
}

/// An instant query's result vector.
fn query(prometheus: &PrometheusApi, expr: &str) -> Result<Vec<Value>, String> {
    let data = prometheus.api(&format!("/api/v1/query?query={}", percent_encode(expr)))?;
    data["result"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no result vector: {data}"))
}

fn summary(alert: &Alert) -> String {
    format!("{:?} {} {:?}", alert.labels, alert.state, alert.annotations)
}

#[tokio::test]
async fn the_real_prometheus_operator_scrapes_the_chart_and_fires_its_alerts() {
    node_with_cert_manager();
    let _serial = exclusive().await;
    let started = Instant::now();
    let client = client().await;
    install_crds(&client).await;
    let crds = OperatorCrds::install(&client).await;
    let monitoring = TestNamespace::create(&client, "po-monitoring").await;
    let system = TestNamespace::create(&client, "po-system").await;
    let (mon, ns) = (monitoring.name().to_owned(), system.name().to_owned());

    // The chart first, as on a cluster where kube-prometheus-stack already runs: its ServiceMonitors
    // and PrometheusRule exist when the operator configures Prometheus.
    let values = chart_values(&mon);
    let release = Release::install_and_wait(RELEASE, &ns, &values);
    let team = TestNamespace::create(&client, "po-team").await;
    let source = TestNamespace::create(&client, "po-source").await;

    prometheus_service_account(&mon, &ns);
    apply(&prometheus_resource(&mon));
    let scratch = Scratch::new("prometheus-operator");
    let operator = Operator::start(&scratch, &[&mon, &ns]);
    let prometheus = wait_prometheus_serving(&operator, &mon).await;
    println!("the operator's Prometheus serves after {:?}", started.elapsed());

    // The configuration Prometheus runs is the operator's: a scrape job per ServiceMonitor endpoint
    // and the rule files of the operator's ConfigMap.
    let config = prometheus.api("/api/v1/status/config").expect("config");
    let config = config["yaml"].as_str().expect("the config as YAML");
    for component in ["controller", "webhook"] {
        let job = format!("job_name: serviceMonitor/{ns}/{RELEASE}-{component}-metrics/0");
        assert!(config.contains(&job), "no `{job}` in the config:\n{config}");
    }
    let rule_files = format!("/etc/prometheus/rules/prometheus-{PROMETHEUS}-rulefiles-0/");
    assert!(
        config.contains(&rule_files),
        "the config loads no rule files from {rule_files}:\n{config}"
    );

    // Every controller and webhook pod is a target that is up, scraped over HTTPS, under the job
    // the alerts select: the ServiceMonitor's Service name, and the release's namespace.
    let expected: Vec<(String, Vec<String>)> = ["controller", "webhook"]
        .iter()
        .map(|c| (format!("{RELEASE}-{c}-metrics"), component_pods(&ns, c)))
        .collect();
    assert!(expected.iter().all(|(_, pods)| !pods.is_empty()), "{expected:?}");
    wait_for(
        "Prometheus to scrape every controller and webhook pod",
        SCRAPE,
        || async {
            let data = prometheus.api("/api/v1/targets?state=active")?;
            let targets = data["activeTargets"].as_array().cloned().unwrap_or_default();
            for (job, pods) in &expected {
                let mine: Vec<&Value> = targets
                    .iter()
                    .filter(|t| t["labels"]["job"] == job.as_str() && t["labels"]["namespace"] == ns.as_str())
                    .collect();
                let up: BTreeSet<&str> = mine
                    .iter()
                    .filter(|t| t["health"] == "up")
                    .filter(|t| t["scrapeUrl"].as_str().is_some_and(|u| u.starts_with("https://")))
                    .filter_map(|t| t["labels"]["pod"].as_str())
                    .collect();
                let want: BTreeSet<&str> = pods.iter().map(String::as_str).collect();
                if up != want {
                    let seen: Vec<String> = mine
                        .iter()
                        .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
                        .collect();
                    return Err(format!("{job}: up {up:?}, want {want:?}; targets {seen:?}"));
                }
            }
            Ok(())
        },
    )
    .await;
    println!("every target up after {:?}", started.elapsed());

    // The chart's alerts, from the operator's rule file, evaluated without error; the "down" alerts
    // (absent(up == 1) and the leader gauge, by the chart's default selectors) quiet.
    let alerts = chart_alerts(&ns, &values);
    assert_eq!(alerts.len(), 9, "{alerts:?}");
    let quiet = [
        "ProjectionControllerDown",
        "ProjectionWebhookDown",
        "ProjectionNoLeader",
    ];
    wait_for(
        "the chart's alerts loaded, evaluated and the down alerts quiet",
        SCRAPE,
        || async {
            let data = prometheus.api("/api/v1/rules?type=alert")?;
            let mut loaded = BTreeSet::new();
            for group in data["groups"].as_array().cloned().unwrap_or_default() {
                let file = group["file"].as_str().unwrap_or_default();
                if !file.starts_with(&rule_files) {
                    return Err(format!("a rule group from {file}, not the operator's rule files"));
                }
                for rule in group["rules"].as_array().cloned().unwrap_or_default() {
                    let name = rule["name"].as_str().unwrap_or_default().to_owned();
                    if rule["health"] != "ok" {
                        return Err(format!("{name}: health {} {}", rule["health"], rule["lastError"]));
                    }
                    if quiet.contains(&name.as_str()) && rule["state"] != "inactive" {
                        return Err(format!("{name} is {}", rule["state"]));
                    }
                    loaded.insert(name);
                }
            }
            (loaded == alerts)
                .then_some(())
                .ok_or(format!("loaded {loaded:?}, the chart has {alerts:?}"))
        },
    )
    .await;
    // What those alerts read, under the operator's labels.
    let controller_job = format!(r#"job="{RELEASE}-controller-metrics",namespace="{ns}""#);
    let leaders = query(
        &prometheus,
        &format!(
            r#"max(leader_election_master_status{{{controller_job},name="projection-controller-leader"}})"#
        ),
    )
    .expect("query");
    assert_eq!(leaders.len(), 1, "no leader gauge: {leaders:?}");
    assert_eq!(leaders[0]["value"][1], "1", "{leaders:?}");

    // ProjectionNotReady fires for a Projection whose source is missing, then resolves. Named,
    // and in the Projection's own namespace (the scraped label arrives as exported_namespace); the
    // CRs others left on the cluster (the demo's) may fire it for themselves.
    let (team_ns, source_ns) = (team.name().to_owned(), source.name().to_owned());
    let labels = [
        ("kind", "Projection"),
        ("namespace", team_ns.as_str()),
        ("name", "settings"),
    ];
    prometheus
        .wait_inactive("ProjectionNotReady", &labels, FIRE)
        .await;
    apply(&json!({
        "apiVersion": "projection.sh/v1", "kind": "Projection",
        "metadata": {"name": "settings", "namespace": team_ns},
        "spec": {
            "source": {"version": "v1", "kind": "ConfigMap", "namespace": source_ns, "name": "settings"},
        },
    }));
    let alert = prometheus.wait_firing("ProjectionNotReady", &labels, FIRE).await;
    println!(
        "ProjectionNotReady fired after {:?}: {}",
        started.elapsed(),
        summary(&alert)
    );
    assert_eq!(alert.labels.get("severity").map(String::as_str), Some("warning"));
    assert_eq!(alert.value.parse::<f64>().ok(), Some(1.0), "{}", summary(&alert));
    assert_eq!(
        alert.annotations.get("runbook_url").map(String::as_str),
        Some("https://runbooks.example.com/projection/troubleshooting.html#projectionnotready")
    );
    apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": source_ns, "annotations": {"projection.sh/projectable": "true"}},
        "data": {"key": "value"},
    }));
    prometheus
        .wait_inactive("ProjectionNotReady", &labels, FIRE)
        .await;
    println!("ProjectionNotReady resolved after {:?}", started.elapsed());

    // Clean up while the controller and the operator run: the Projection (its finalizer), the
    // Prometheus (its StatefulSet goes with it), then the operator, the namespaces and the release.
    kubectl_ok(&[
        "delete",
        "projection",
        "settings",
        "-n",
        &team_ns,
        "--timeout=60s",
    ]);
    kubectl_ok(&["delete", "prometheus", PROMETHEUS, "-n", &mon, "--timeout=60s"]);
    operator.assert_running();
    drop(operator);
    team.delete_and_wait(&client).await;
    source.delete_and_wait(&client).await;
    monitoring.delete_and_wait(&client).await;
    release.uninstall();
    system.delete_and_wait(&client).await;
    drop(crds);
    println!("done after {:?}", started.elapsed());
}
