//! The chart's PrometheusRule and Grafana dashboard, checked by the real promtool and a real
//! Prometheus (both built from the Prometheus Go module by `tests/control-plane/build-monitoring.sh`).
//!
//! Without a cluster: `promtool check rules` on the rendered rules, `promtool test rules` on
//! `tests/alerts/rules.test.yaml` (each alert's thresholds and `for:` at the chart's defaults), a
//! runbook section per alert, and every dashboard query parsed by promtool.
//!
//! On the local control plane: the dashboard and the rules name only metrics that a running
//! controller and webhook export; and every alert fires on our real metrics and resolves again.
//! Each firing test runs a Prometheus on loopback that scrapes a controller (two for the leader
//! test) and a webhook started by the test, with the rules rendered from the chart with short
//! `for:` durations and windows, induces the alert's condition on the cluster, polls
//! `/api/v1/alerts` until the alert fires, removes the cause and polls until it is gone.
//!
//! The services are the workspace's binaries as `cargo test --workspace` builds them; run alone,
//! build them first: `cargo build -p controller -p webhook && cargo test -p projection-tests --test alerts`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, TestNamespace,
    black_hole::BlackHoleProxy,
    chart::render,
    client, exclusive, free_port, install_crds, kubeconfig_path, kubectl, kubectl_ok, kubectl_stdin,
    metric_value,
    prometheus::{Alert, Job, PrometheusServer, Scratch, exposed_names, promtool_in},
    repo_root, service_account_kubeconfig, testenv_dir, wait_for, workspace_binary,
};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, Projection};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

/// The release and namespace the rules are rendered for: the chart's default selectors then name
/// the jobs below and this namespace, which the test's scrape configuration gives its targets.
const RELEASE: &str = "projection";
const NAMESPACE: &str = "projection-system";
const CONTROLLER_JOB: &str = "projection-controller-metrics";
const WEBHOOK_JOB: &str = "projection-webhook-metrics";

/// Every alert of the chart.
const ALERTS: [&str; 9] = [
    "ProjectionControllerDown",
    "ProjectionWebhookDown",
    "ProjectionNoLeader",
    "ProjectionNotReady",
    "ProjectionFanOutFailures",
    "ProjectionReconcileErrors",
    "ProjectionWebhookErrors",
    "ProjectionWebhookLatency",
    "ProjectionWebhookCertificateExpiry",
];

/// How long an alert may take to fire once its condition holds (`for: 3s`, 1 s scrapes and
/// evaluations, on a loaded machine), and to go once it no longer does (20 s windows).
const FIRE: Duration = Duration::from_secs(60);
const RESOLVE: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// Rendering

fn rendered(values: &[(&str, Value)]) -> projection_tests::chart::Rendered {
    render(RELEASE, NAMESPACE, values).unwrap_or_else(|e| panic!("helm template failed: {e}"))
}

/// What makes the chart's targets scraped, so that every alert is rendered: its ServiceMonitors,
/// and a Prometheus let through the NetworkPolicy.
fn scraped() -> Vec<(&'static str, Value)> {
    vec![
        ("metrics.serviceMonitor.enabled", json!(true)),
        (
            "networkPolicy.metricsFrom",
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]),
        ),
    ]
}

/// The rule file of the chart's PrometheusRule (its `spec`) rendered with `values` (after
/// [`scraped`]), as YAML.
fn rules_yaml(values: &[(&str, Value)]) -> String {
    let mut all = vec![("metrics.prometheusRule.enabled", json!(true))];
    all.extend(scraped());
    all.extend_from_slice(values);
    let objects = rendered(&all);
    let rule = objects.get("PrometheusRule", RELEASE);
    serde_yaml::to_string(&rule["spec"]).expect("the spec serialises")
}

/// The rules of a rule file, as JSON.
fn rules_of(yaml: &str) -> Vec<Value> {
    let file: Value = serde_yaml::from_str(yaml).expect("a rule file is YAML");
    file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Values that make every alert quick to fire and to resolve: what the firing tests load.
fn quick_values() -> Vec<(&'static str, Value)> {
    let mut values: Vec<(&'static str, Value)> = [
        "metrics.prometheusRule.alerts.controllerDown.for",
        "metrics.prometheusRule.alerts.webhookDown.for",
        "metrics.prometheusRule.alerts.noLeader.for",
        "metrics.prometheusRule.alerts.notReady.for",
        "metrics.prometheusRule.alerts.fanOutFailures.for",
        "metrics.prometheusRule.alerts.reconcileErrors.for",
        "metrics.prometheusRule.alerts.webhookErrors.for",
        "metrics.prometheusRule.alerts.webhookLatency.for",
        "metrics.prometheusRule.alerts.certificateExpiry.for",
    ]
    .map(|key| (key, json!("3s")))
    .to_vec();
    values.extend([
        (
            "metrics.prometheusRule.alerts.reconcileErrors.window",
            json!("20s"),
        ),
        ("metrics.prometheusRule.alerts.webhookErrors.window", json!("20s")),
        (
            "metrics.prometheusRule.alerts.webhookLatency.window",
            json!("20s"),
        ),
        ("metrics.prometheusRule.alerts.certificateExpiry.days", json!(2)),
        ("metrics.prometheusRule.runbookBaseUrl", json!(RUNBOOKS)),
    ]);
    values
}

/// Where a team serves docs/troubleshooting.md, as a user sets `runbookBaseUrl`.
const RUNBOOKS: &str = "https://docs.example.com/projection/troubleshooting";

// ---------------------------------------------------------------------------------------------
// Without a cluster

#[test]
fn promtool_checks_the_rules_in_every_configuration() {
    let configurations: Vec<Vec<(&str, Value)>> = vec![
        vec![],
        quick_values(),
        vec![
            (
                "metrics.prometheusRule.controllerSelector",
                json!(r#"app_kubernetes_io_component="controller",namespace=~"ops|platform""#),
            ),
            (
                "metrics.prometheusRule.webhookSelector",
                json!(r#"app_kubernetes_io_component="webhook""#),
            ),
            (
                "metrics.prometheusRule.additionalLabels",
                json!({"team": "platform"}),
            ),
            (
                "metrics.prometheusRule.alerts.webhookLatency.quantile",
                json!(0.9),
            ),
            (
                "metrics.prometheusRule.alerts.webhookLatency.threshold",
                json!(0.25),
            ),
            (
                "metrics.prometheusRule.alerts.reconcileErrors.threshold",
                json!(5),
            ),
            ("metrics.prometheusRule.alerts.certificateExpiry.days", json!(0.5)),
        ],
    ];
    for values in configurations {
        let rules = rules_yaml(&values);
        let out = promtool_in(&[("rules.yaml", &rules)], &["check", "rules", "{rules.yaml}"]);
        assert!(
            out.status.success(),
            "promtool check rules failed for {values:?}:\n{}{}\n{rules}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let alerts: Vec<String> = rules_of(&rules)
            .iter()
            .map(|r| r["alert"].as_str().expect("only alerting rules").to_owned())
            .collect();
        assert_eq!(alerts, ALERTS, "the chart's alerts");
    }
    // An alert can be turned off on its own.
    let rules = rules_yaml(&[("metrics.prometheusRule.alerts.notReady.enabled", json!(false))]);
    assert!(!rules.contains("ProjectionNotReady") && rules.contains("ProjectionFanOutFailures"));
}

#[test]
fn down_alerts_are_rendered_only_where_the_targets_are_scraped_and_notes_say_why() {
    let alerts_with = |values: &[(&str, Value)]| -> (Vec<String>, String) {
        let mut all = vec![("metrics.prometheusRule.enabled", json!(true))];
        all.extend_from_slice(values);
        let objects = rendered(&all);
        let rule = objects.get("PrometheusRule", RELEASE);
        let alerts = rule["spec"]["groups"][0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["alert"].as_str().map(str::to_owned))
            .filter(|a| a.ends_with("Down"))
            .collect();
        (alerts, notes(&all))
    };
    let down = ["ProjectionControllerDown", "ProjectionWebhookDown"];
    // The PrometheusRule alone (no ServiceMonitor): nothing scrapes the targets.
    let (alerts, notes_text) = alerts_with(&[]);
    assert!(alerts.is_empty(), "{alerts:?}");
    assert!(
        notes_text.contains("set metrics.serviceMonitor.enabled=true"),
        "{notes_text}"
    );
    // ServiceMonitors, but the default NetworkPolicy keeps Prometheus out.
    let (alerts, notes_text) = alerts_with(&[("metrics.serviceMonitor.enabled", json!(true))]);
    assert!(alerts.is_empty(), "{alerts:?}");
    assert!(
        notes_text.contains("set networkPolicy.metricsFrom"),
        "{notes_text}"
    );
    assert!(
        !notes_text.contains("set metrics.serviceMonitor.enabled=true"),
        "{notes_text}"
    );
    // Both: the alerts are there, NOTES is silent about them.
    let (alerts, notes_text) = alerts_with(&scraped());
    assert_eq!(alerts, down);
    assert!(!notes_text.contains("are not installed"), "{notes_text}");
    // A scrape of the user's own, no NetworkPolicy: the selectors say where the targets are.
    let (alerts, _) = alerts_with(&[
        ("networkPolicy.enabled", json!(false)),
        (
            "metrics.prometheusRule.controllerSelector",
            json!(r#"job="ops-controller""#),
        ),
        (
            "metrics.prometheusRule.webhookSelector",
            json!(r#"job="ops-webhook""#),
        ),
    ]);
    assert_eq!(alerts, down);
}

/// The chart's NOTES rendered with `values`.
fn notes(values: &[(&str, Value)]) -> String {
    projection_tests::chart::notes(RELEASE, NAMESPACE, values)
        .unwrap_or_else(|e| panic!("rendering NOTES failed: {e}"))
}

#[test]
fn rules_carry_severity_runbook_and_selectors_from_the_values() {
    let rules = rules_of(&rules_yaml(&[
        (
            "metrics.prometheusRule.runbookBaseUrl",
            json!("https://runbooks.example.com/projection.md"),
        ),
        (
            "metrics.prometheusRule.additionalLabels",
            json!({"team": "platform"}),
        ),
        ("metrics.prometheusRule.alerts.noLeader.severity", json!("page")),
        ("metrics.prometheusRule.alerts.notReady.for", json!("42m")),
        (
            "metrics.prometheusRule.controllerSelector",
            json!(r#"job="mine""#),
        ),
    ]));
    for rule in &rules {
        let name = rule["alert"].as_str().expect("alert name");
        assert_eq!(
            rule["annotations"]["runbook_url"],
            format!(
                "https://runbooks.example.com/projection.md#{}",
                name.to_lowercase()
            ),
            "{name}"
        );
        assert_eq!(rule["labels"]["team"], "platform", "{name}");
        assert!(rule["labels"]["severity"].is_string(), "{name}");
        let expr = rule["expr"].as_str().expect("expr");
        let component_selector = if name.contains("Webhook") {
            format!(r#"job="{WEBHOOK_JOB}",namespace="{NAMESPACE}""#)
        } else {
            r#"job="mine""#.to_owned()
        };
        assert!(expr.contains(&component_selector), "{name}: {expr}");
    }
    let by_name = |n: &str| rules.iter().find(|r| r["alert"] == n).expect("rendered").clone();
    assert_eq!(by_name("ProjectionNoLeader")["labels"]["severity"], "page");
    assert_eq!(by_name("ProjectionNotReady")["for"], "42m");
    assert_eq!(
        by_name("ProjectionControllerDown")["labels"]["severity"],
        "critical"
    );

    // No runbook_url unless runbookBaseUrl says where the runbooks are served.
    for rule in rules_of(&rules_yaml(&[])) {
        assert!(
            rule["annotations"].get("runbook_url").is_none(),
            "the default guesses a runbook URL: {rule}"
        );
        assert!(rule["annotations"]["description"].is_string(), "{rule}");
    }

    // Off by default, and refused with a bad duration or an unknown key.
    assert!(rendered(&[]).of_kind("PrometheusRule").is_empty());
    for (key, value, expected) in [
        (
            "metrics.prometheusRule.alerts.notReady.for",
            json!("soon"),
            "/metrics/prometheusRule/alerts/notReady/for",
        ),
        (
            "metrics.prometheusRule.alerts.webhookErrors.threshold",
            json!(5),
            "threshold",
        ),
        (
            "metrics.prometheusRule.alerts.webhookLatency.quantile",
            json!(0),
            "quantile",
        ),
        ("metrics.prometheusRule.alerts.notReadyy", json!({}), "notReadyy"),
        (
            "metrics.prometheusRule.controllerSelector",
            json!("job=x"),
            "controllerSelector",
        ),
        (
            "metrics.prometheusRule.runbookBaseUrl",
            json!("docs#x"),
            "runbookBaseUrl",
        ),
    ] {
        let err = render(RELEASE, NAMESPACE, &[(key, value.clone())])
            .expect_err(&format!("{key}={value} must be refused"));
        assert!(
            err.contains(expected),
            "{key}={value}: expected {expected:?} in:\n{err}"
        );
    }
}

#[test]
fn rules_select_the_jobs_of_the_chart_s_service_monitors() {
    // prometheus-operator names a ServiceMonitor's targets' job after their Service, and gives
    // them the Service's namespace.
    let objects = rendered(&[
        ("metrics.prometheusRule.enabled", json!(true)),
        ("metrics.serviceMonitor.enabled", json!(true)),
    ]);
    let rules = serde_json::to_string(&objects.get("PrometheusRule", RELEASE)["spec"]).expect("JSON");
    for monitor in objects.of_kind("ServiceMonitor") {
        let name = monitor["metadata"]["name"].as_str().expect("name");
        assert!(
            objects.has("Service", name),
            "the ServiceMonitor {name} selects the Service {name}"
        );
        let selector = format!(r#"job=\"{name}\",namespace=\"{NAMESPACE}\""#);
        assert!(rules.contains(&selector), "no rule selects {selector}: {rules}");
    }
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_section_and_is_documented() {
    let troubleshooting = std::fs::read_to_string(repo_root().join("docs/troubleshooting.md"))
        .expect("docs/troubleshooting.md");
    let anchors: BTreeSet<String> = troubleshooting
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let observability =
        std::fs::read_to_string(repo_root().join("docs/observability.md")).expect("docs/observability.md");
    let base_url = [("metrics.prometheusRule.runbookBaseUrl", json!(RUNBOOKS))];
    for rule in rules_of(&rules_yaml(&base_url)) {
        let name = rule["alert"].as_str().expect("alert");
        let url = rule["annotations"]["runbook_url"].as_str().expect("runbook_url");
        assert!(url.starts_with(&format!("{RUNBOOKS}#")), "{name}: {url}");
        let fragment = url.rsplit_once('#').expect("the runbook URL has a fragment").1;
        assert!(
            anchors.contains(fragment),
            "{name}: docs/troubleshooting.md has no section #{fragment} (add a heading `### {name}`)"
        );
        assert!(
            observability.contains(&format!("`{name}`")),
            "docs/observability.md does not name {name}"
        );
    }
}

#[test]
fn promtool_unit_tests_hold_for_every_alert_threshold_and_duration() {
    let rules = rules_yaml(&[]);
    let tests_path = repo_root().join("tests/alerts/rules.test.yaml");
    let tests = std::fs::read_to_string(&tests_path).expect("tests/alerts/rules.test.yaml");
    let out = promtool_in(
        &[("rules.yaml", &rules), ("rules.test.yaml", &tests)],
        &["test", "rules", "{rules.test.yaml}"],
    );
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Each alert is tested both ways: an evaluation where it fires and one where it does not yet
    // (before its `for:` or below its threshold).
    let parsed: Value = serde_yaml::from_str(&tests).expect("the unit tests are YAML");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for group in parsed["tests"].as_array().expect("tests") {
        for case in group["alert_rule_test"].as_array().cloned().unwrap_or_default() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    for name in ALERTS {
        assert!(fires.contains(name), "no unit test sees {name} fire");
        assert!(quiet.contains(name), "no unit test sees {name} stay quiet");
    }
}

/// The dashboard the chart ships, as rendered into its ConfigMap.
fn dashboard(values: &[(&str, Value)]) -> (Value, Value) {
    let mut all = vec![("metrics.dashboard.enabled", json!(true))];
    all.extend_from_slice(values);
    let objects = rendered(&all);
    let config_map = objects.get("ConfigMap", &format!("{RELEASE}-dashboard")).clone();
    let text = config_map["data"]["projection.json"]
        .as_str()
        .expect("projection.json");
    let dashboard = serde_json::from_str(text).expect("the dashboard is JSON");
    (config_map, dashboard)
}

/// Every PromQL query of the dashboard with Grafana's variables replaced by values (`$__rate_interval`
/// by a duration, the namespace and job variables by the names of the firing tests): each panel
/// target's `expr`, and the selector inside each `label_values(...)` variable query.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<Value>) {
        for p in list.as_array().cloned().unwrap_or_default() {
            panels(&p["panels"], out);
            out.push(p);
        }
    }
    let mut all = Vec::new();
    panels(&dashboard["panels"], &mut all);
    let mut queries = Vec::new();
    for panel in &all {
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            let title = panel["title"].as_str().unwrap_or_default();
            queries.push((
                title.to_owned(),
                target["expr"].as_str().expect("a target has an expr").to_owned(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().expect("variables") {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .expect("a query variable has a query");
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _)| selector.to_owned())
            .unwrap_or_else(|| panic!("variable query {query} is not label_values(<selector>, <label>)"));
        queries.push((format!("variable {}", variable["name"]), inner));
    }
    let substitutions = [
        ("$__rate_interval", "2m".to_owned()),
        ("$cluster", ".*".to_owned()),
        ("$namespace", NAMESPACE.to_owned()),
        ("$controller_job", CONTROLLER_JOB.to_owned()),
        ("$webhook_job", WEBHOOK_JOB.to_owned()),
    ];
    queries
        .into_iter()
        .map(|(title, expr)| {
            let expr = substitutions
                .iter()
                .fold(expr, |e, (var, value)| e.replace(var, value));
            assert!(
                !expr.contains('$'),
                "{title}: a Grafana variable the test does not know: {expr}"
            );
            (title, expr)
        })
        .collect()
}

#[test]
fn dashboard_is_labelled_for_the_grafana_sidecar_and_every_query_parses() {
    let (config_map, board) = dashboard(&[]);
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(config_map["metadata"]["namespace"], NAMESPACE);
    let (config_map, _) = dashboard(&[
        ("metrics.dashboard.label", json!("dashboards.example.com/grafana")),
        ("metrics.dashboard.labelValue", json!("projection")),
        ("metrics.dashboard.namespace", json!("monitoring")),
        (
            "metrics.dashboard.annotations",
            json!({"grafana_folder": "Operators"}),
        ),
    ]);
    assert_eq!(
        config_map["metadata"]["labels"]["dashboards.example.com/grafana"],
        "projection"
    );
    assert!(
        config_map["metadata"]["labels"]
            .get("grafana_dashboard")
            .is_none()
    );
    assert_eq!(config_map["metadata"]["namespace"], "monitoring");
    assert_eq!(
        config_map["metadata"]["annotations"]["grafana_folder"],
        "Operators"
    );
    assert!(rendered(&[]).of_kind("ConfigMap").iter().all(|c| {
        !c["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .ends_with("-dashboard")
    }));

    // Grafana's structure: unique panel ids, every target on the data source variable.
    let mut ids = BTreeSet::new();
    for panel in board["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "duplicate panel id {}",
            panel["id"]
        );
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
        }
    }

    // Every query through promtool's parser: each as a recording rule of a rule file.
    let queries = dashboard_queries(&board);
    assert!(queries.len() >= 25, "only {} queries", queries.len());
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| json!({"record": format!("dashboard:query_{i}"), "expr": expr}))
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string();
    let out = promtool_in(
        &[("dashboard.rules.yaml", &file)],
        &["check", "rules", "{dashboard.rules.yaml}"],
    );
    assert!(
        out.status.success(),
        "promtool does not accept a dashboard query:\n{}{}\n{queries:#?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// On the local control plane: processes, Prometheus, and the cluster

/// One service process a test may stop and start again on the same ports (Prometheus keeps
/// scraping them).
struct Slot {
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    http_port: u16,
    process: Option<ServiceProcess>,
}

impl Slot {
    fn new(binary: PathBuf, args: Vec<String>, kubeconfig: PathBuf) -> Self {
        Self {
            binary,
            args,
            kubeconfig,
            http_port: free_port(),
            process: None,
        }
    }

    async fn start(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut process = ServiceProcess::start_on(
            &self.binary,
            &args,
            &self.kubeconfig,
            &[],
            self.http_port,
            self.http_port,
        );
        process.wait_ready().await;
        self.process = Some(process);
    }

    /// SIGTERM, as Kubernetes stops a pod.
    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.terminate();
        }
    }

    /// SIGKILL, as a crash or a lost node.
    fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill_hard();
        }
    }

    fn metrics(&self) -> String {
        self.process
            .as_ref()
            .map(ServiceProcess::metrics)
            .unwrap_or_default()
    }
}

/// The webhook's serving certificate, from `certs/generate.sh`, valid for `days` days.
fn issue_certificate(dir: &std::path::Path, days: u32) {
    let status = std::process::Command::new(repo_root().join("certs/generate.sh"))
        .arg(dir)
        .env("CERT_DAYS", days.to_string())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("certs/generate.sh runs");
    assert!(status.success(), "certs/generate.sh failed");
}

/// How the test's webhook runs.
struct WebhookSetup {
    /// Its kubeconfig (the admin's, a ServiceAccount's, or one through a proxy).
    kubeconfig: PathBuf,
    /// Validity of its first serving certificate.
    certificate_days: u32,
    /// More flags.
    extra_args: Vec<String>,
}

impl Default for WebhookSetup {
    fn default() -> Self {
        Self {
            kubeconfig: kubeconfig_path(),
            certificate_days: 30,
            extra_args: Vec::new(),
        }
    }
}

/// A Prometheus with the chart's rules (quick values), the controllers and the webhook it scrapes,
/// and a namespace of its own for the leader Lease.
struct Stack {
    client: Client,
    prometheus: PrometheusServer,
    controllers: Vec<Slot>,
    webhook: Slot,
    /// The webhook's admission port and certificate folder (`ca.crt`, `tls.crt`, `tls.key`).
    webhook_port: u16,
    certs: Scratch,
    lease_namespace: TestNamespace,
    /// When the stack began starting (for the timings the tests print).
    started: std::time::Instant,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Stack {
    async fn start(controllers: usize, setup: WebhookSetup) -> Self {
        let serial = exclusive().await;
        let started = std::time::Instant::now();
        let client = client().await;
        install_crds(&client).await;
        let lease_namespace = TestNamespace::create(&client, "alerts-lease").await;
        let controller_binary = workspace_binary("controller", "projection-controller");
        let webhook_binary = workspace_binary("webhook", "projection-webhook");

        let controller_args: Vec<String> = [
            "--leader-elect",
            "--leader-election-namespace",
            lease_namespace.name(),
            "--leader-election-lease-duration",
            "20s",
            "--requeue-interval",
            "2s",
            "--author-access=trusted",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut slots: Vec<Slot> = (0..controllers)
            .map(|_| {
                Slot::new(
                    controller_binary.clone(),
                    controller_args.clone(),
                    kubeconfig_path(),
                )
            })
            .collect();
        for slot in &mut slots {
            slot.start().await;
        }

        let certs = Scratch::new("alerts-webhook-certs");
        issue_certificate(&certs.dir, setup.certificate_days);
        let webhook_port = free_port();
        let client_ca = testenv_dir().join("pki/webhook-client-ca.crt");
        assert!(
            client_ca.exists(),
            "{} is missing: restart the control plane with up.sh",
            client_ca.display()
        );
        let webhook_args: Vec<String> = vec![
            "--bind-address".into(),
            format!("127.0.0.1:{webhook_port}"),
            "--tls-cert-file".into(),
            certs.dir.join("tls.crt").display().to_string(),
            "--tls-key-file".into(),
            certs.dir.join("tls.key").display().to_string(),
            "--tls-reload-interval".into(),
            "200ms".into(),
            "--client-ca-file".into(),
            client_ca.display().to_string(),
            "--shutdown-delay".into(),
            "0s".into(),
            // Every review asks the apiserver, so a slow or refusing apiserver shows at once.
            "--access-review-cache-ttl".into(),
            "0s".into(),
            "--source-metadata-cache-ttl".into(),
            "0s".into(),
        ];
        let webhook_args = [webhook_args, setup.extra_args].concat();
        let mut webhook = Slot::new(webhook_binary, webhook_args, setup.kubeconfig);
        webhook.start().await;

        let labels = BTreeMap::from([("namespace", NAMESPACE)]);
        let prometheus = PrometheusServer::start(
            &rules_yaml(&quick_values()),
            &[
                Job {
                    name: CONTROLLER_JOB,
                    ports: slots.iter().map(|s| s.http_port).collect(),
                    labels: labels.clone(),
                },
                Job {
                    name: WEBHOOK_JOB,
                    ports: vec![webhook.http_port],
                    labels,
                },
            ],
        )
        .await;
        prometheus.wait_targets_up().await;
        println!("stack up after {:?}", started.elapsed());
        Self {
            client,
            prometheus,
            controllers: slots,
            webhook,
            webhook_port,
            certs,
            lease_namespace,
            started,
            _serial: serial,
        }
    }

    /// Waits until `name` is inactive before the test induces its condition (a leftover of
    /// another suite would otherwise be taken for the test's own).
    async fn baseline(&self, name: &str, labels: &[(&str, &str)]) {
        self.prometheus.wait_inactive(name, labels, FIRE).await;
    }

    async fn fires(&self, name: &str, labels: &[(&str, &str)]) -> Alert {
        let alert = self.prometheus.wait_firing(name, labels, FIRE).await;
        assert_eq!(
            alert.annotations.get("runbook_url").map(String::as_str),
            Some(format!("{RUNBOOKS}#{}", name.to_lowercase()).as_str()),
            "{alert:?}"
        );
        println!("{name} fired after {:?}: {alert:?}", self.started.elapsed());
        alert
    }

    async fn resolves(&self, name: &str, labels: &[(&str, &str)]) {
        self.prometheus.wait_inactive(name, labels, RESOLVE).await;
        println!("{name} resolved after {:?}", self.started.elapsed());
    }
}

/// An alert's value as a number.
fn value(alert: &Alert) -> f64 {
    alert.value.parse().unwrap_or_else(|e| panic!("{alert:?}: {e}"))
}

fn projection(
    name: &str,
    namespace: &str,
    source_namespace: &str,
    source: &str,
    labels: Value,
) -> Projection {
    serde_json::from_value(json!({
        "apiVersion": "projection.sh/v1",
        "kind": "Projection",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "source": {"version": "v1", "kind": "ConfigMap", "namespace": source_namespace, "name": source},
            "destination": {"name": format!("{source}-copy")},
        },
    }))
    .expect("a valid Projection")
}

async fn create_source(client: &Client, namespace: &str, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "annotations": {"projection.sh/projectable": "true"}},
        "data": {"key": "value"},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .expect("source created");
}

/// Deletes the Projections of `namespace` while the controller runs, and waits until they are
/// gone (their finalizers done).
async fn delete_projections(client: &Client, namespace: &str) {
    let api: Api<Projection> = Api::namespaced(client.clone(), namespace);
    let _ = api
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await;
    wait_for(&format!("Projections of {namespace} deleted"), FIRE, || async {
        let left = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        (left == 0).then_some(()).ok_or(format!("{left} left"))
    })
    .await;
}

#[tokio::test]
async fn the_apiserver_accepts_the_prometheus_rule_and_the_dashboard() {
    // prometheus-operator's PrometheusRule CRD, from its Go module (tests/control-plane/build.sh).
    let client = client().await;
    let crd = format!(
        "{}/",
        projection_tests::control_plane_bin()
            .join("prometheus-rule-crd")
            .display()
    );
    kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", &crd]);
    projection_tests::wait_crd_established(&client, "prometheusrules.monitoring.coreos.com").await;
    let namespace = TestNamespace::create(&client, "alerts-objects").await;
    let objects = render(
        RELEASE,
        namespace.name(),
        &[
            ("metrics.prometheusRule.enabled", json!(true)),
            (
                "metrics.prometheusRule.labels",
                json!({"release": "kube-prometheus-stack"}),
            ),
            ("metrics.dashboard.enabled", json!(true)),
        ],
    )
    .expect("renders");
    for (kind, name) in [
        ("PrometheusRule", RELEASE.to_owned()),
        ("ConfigMap", format!("{RELEASE}-dashboard")),
    ] {
        let object = objects.get(kind, &name);
        let out = kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &object.to_string());
        assert!(
            out.status.success(),
            "the apiserver refuses the {kind} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A POST of `body` to the webhook's `path` with curl, with the client certificate the apiserver
/// presents to webhooks (the webhook requires one chained to `--client-ca-file`), sending the body
/// at `rate` bytes a second if given; the running curl, which prints the HTTP status.
fn curl_post(stack: &Stack, path: &str, body: &std::path::Path, rate: Option<u32>) -> std::process::Child {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "30",
        "--cacert",
    ])
    .arg(stack.certs.dir.join("ca.crt"))
    .arg("--cert")
    .arg(testenv_dir().join("pki/webhook-client.crt"))
    .arg("--key")
    .arg(testenv_dir().join("pki/webhook-client.key"))
    .args(["-H", "content-type: application/json", "--data-binary"])
    .arg(format!("@{}", body.display()))
    .arg(format!("https://127.0.0.1:{}{path}", stack.webhook_port))
    .stdout(std::process::Stdio::piped());
    if let Some(rate) = rate {
        cmd.args(["--limit-rate", &rate.to_string()]);
    }
    cmd.spawn().expect("curl runs (scripts/prereqs.sh installs it)")
}

fn http_status(child: std::process::Child) -> String {
    let out = child.wait_with_output().expect("curl ends");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The metric names of both services' `/metrics`, once each family has a sample: prometheus-client
/// leaves a labelled family out until a series of it is observed, so the test makes the
/// controller reconcile, fail a reconcile, and the webhook answer, refuse, shed and reload.
async fn exported_metric_names(stack: &Stack) -> BTreeSet<String> {
    let source = TestNamespace::create(&stack.client, "alerts-names-src").await;
    let dest = TestNamespace::create(&stack.client, "alerts-names-dst").await;
    let copied = TestNamespace::create(&stack.client, "alerts-names-ok").await;
    create_source(&stack.client, source.name(), "settings").await;
    // A copy made (reconciles, their duration, propagation) and a reconcile that fails.
    Api::<Projection>::namespaced(stack.client.clone(), copied.name())
        .create(
            &PostParams::default(),
            &projection("settings", copied.name(), source.name(), "settings", json!({})),
        )
        .await
        .expect("Projection created");
    let (_policy, binding) = refuse_projection_updates(&stack.client, source.name(), dest.name()).await;
    let controller = &stack.controllers[0];
    wait_for("a reconcile error counted", FIRE, || async {
        let text = controller.metrics();
        metric_value(
            &text,
            "projection_reconcile_errors_total{kind=\"Projection\",category=\"finalizer\"}",
        )
        .map(|_| ())
        .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    wait_for("a copy's propagation observed", FIRE, || async {
        metric_value(
            &controller.metrics(),
            "projection_e2e_seconds_count{kind=\"Projection\",event=\"create\"}",
        )
        .map(|_| ())
        .ok_or_else(|| "none yet".to_owned())
    })
    .await;

    // The webhook: an unreadable review; one shed while a slow large body holds the only slot
    // (`--max-in-flight-reviews 1`: a body over 32 KiB takes its unit before it is read, a small
    // one only once whole; `--body-timeout 60s` lets it be slow); a certificate reload.
    let scratch = Scratch::new("alerts-names-bodies");
    let malformed = scratch.write("malformed.json", r#"{"apiVersion":"v1"}"#);
    assert_eq!(
        http_status(curl_post(stack, "/validate", &malformed, None)),
        "400"
    );
    let slow_body = scratch.write("slow.json", &" ".repeat(64 * 1024));
    let slow = curl_post(stack, "/validate", &slow_body, Some(4096));
    wait_for("a review shed while another holds the slot", FIRE, || async {
        let status = http_status(curl_post(stack, "/validate", &malformed, None));
        (status == "429").then_some(()).ok_or(format!("HTTP {status}"))
    })
    .await;
    let _ = http_status(slow);
    issue_certificate(&stack.certs.dir, 30);
    wait_for("the renewed certificate reloaded", FIRE, || async {
        metric_value(
            &stack.webhook.metrics(),
            "projection_webhook_certificate_reloads_total{result=\"success\"}",
        )
        .map(|_| ())
        .ok_or_else(|| "none yet".to_owned())
    })
    .await;

    let mut names = exposed_names(&controller.metrics());
    names.extend(exposed_names(&stack.webhook.metrics()));
    // Prometheus' own series for every target.
    names.insert("up".to_owned());
    drop(binding);
    delete_projections(&stack.client, dest.name()).await;
    delete_projections(&stack.client, copied.name()).await;
    names
}

#[tokio::test]
async fn dashboard_and_rules_name_only_metrics_the_binaries_export() {
    let stack = Stack::start(
        1,
        WebhookSetup {
            extra_args: vec![
                "--max-in-flight-reviews".into(),
                "1".into(),
                "--body-timeout".into(),
                "60s".into(),
            ],
            ..WebhookSetup::default()
        },
    )
    .await;
    let exported = exported_metric_names(&stack).await;

    let (_, board) = dashboard(&[]);
    let mut queries = dashboard_queries(&board);
    for rule in rules_of(&rules_yaml(&[])) {
        queries.push((
            format!("alert {}", rule["alert"].as_str().unwrap_or_default()),
            rule["expr"].as_str().expect("expr").to_owned(),
        ));
    }
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (title, expr) in &queries {
        let names = stack
            .prometheus
            .selected_metrics(expr)
            .unwrap_or_else(|e| panic!("{title}: Prometheus does not parse {expr}: {e}"));
        assert!(!names.is_empty(), "{title}: {expr} selects no metric");
        for name in names {
            if !exported.contains(&name) {
                unknown.push(format!("{title}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "not exported by the controller or the webhook: {unknown:#?}"
    );
    println!("{} queries use {} metrics: {used:?}", queries.len(), used.len());
}

#[tokio::test]
async fn not_ready_fires_for_a_projection_whose_source_is_missing_and_resolves_when_it_appears() {
    let stack = Stack::start(1, WebhookSetup::default()).await;
    let source = TestNamespace::create(&stack.client, "alerts-ready-src").await;
    let dest = TestNamespace::create(&stack.client, "alerts-ready-dst").await;
    // One alert for this CR, named and in its own namespace (for routing to its owner).
    let labels = [
        ("kind", "Projection"),
        ("namespace", dest.name()),
        ("name", "settings"),
    ];
    stack.baseline("ProjectionNotReady", &labels).await;
    Api::<Projection>::namespaced(stack.client.clone(), dest.name())
        .create(
            &PostParams::default(),
            &projection("settings", dest.name(), source.name(), "settings", json!({})),
        )
        .await
        .expect("Projection created");

    let alert = stack.fires("ProjectionNotReady", &labels).await;
    assert_eq!(value(&alert), 1.0);
    assert_eq!(
        alert.labels["cause"], "tenant",
        "a missing source is the tenant's: {alert:?}"
    );
    assert_eq!(
        alert.annotations["summary"],
        format!("Projection {}/settings not Ready", dest.name())
    );
    assert!(
        alert.annotations["description"].contains(&format!(
            "for 3s; its Ready condition says why: kubectl get projection settings -n {} -o wide",
            dest.name()
        )),
        "{alert:?}"
    );

    create_source(&stack.client, source.name(), "settings").await;
    stack.resolves("ProjectionNotReady", &labels).await;
    delete_projections(&stack.client, dest.name()).await;
}

#[tokio::test]
async fn fan_out_failures_fire_for_a_namespace_a_cluster_projection_cannot_write() {
    let stack = Stack::start(1, WebhookSetup::default()).await;
    stack.baseline("ProjectionFanOutFailures", &[]).await;
    let source = TestNamespace::create(&stack.client, "alerts-fan-src").await;
    let written = TestNamespace::create(&stack.client, "alerts-fan-ok").await;
    let conflicting = TestNamespace::create(&stack.client, "alerts-fan-conflict").await;
    create_source(&stack.client, source.name(), "settings").await;
    // An object the ClusterProjection does not own where its copy would go.
    let theirs: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "settings-copy"}, "data": {"owner": "someone else"}}),
    )
    .expect("ConfigMap");
    Api::<ConfigMap>::namespaced(stack.client.clone(), conflicting.name())
        .create(&PostParams::default(), &theirs)
        .await
        .expect("conflicting object created");

    let name = format!("alerts-fan-{}", std::process::id());
    let _guard = ClusterScopedGuard::new("clusterprojections", &name);
    let api: Api<ClusterProjection> = Api::all(stack.client.clone());
    let cluster: ClusterProjection = serde_json::from_value(json!({
        "apiVersion": "projection.sh/v1",
        "kind": "ClusterProjection",
        "metadata": {"name": name},
        "spec": {
            "source": {"version": "v1", "kind": "ConfigMap", "namespace": source.name(), "name": "settings"},
            "destination": {"name": "settings-copy", "namespaces": [written.name(), conflicting.name()]},
        },
    }))
    .expect("a ClusterProjection");
    api.create(&PostParams::default(), &cluster)
        .await
        .expect("ClusterProjection created");

    let alert = stack.fires("ProjectionFanOutFailures", &[]).await;
    assert_eq!(value(&alert), 1.0);
    assert_eq!(
        alert.annotations["summary"],
        "ClusterProjections fail to write 1 namespace(s)"
    );
    // A ClusterProjection has no namespace of its own: its alert keeps the controller's.
    let alert = stack
        .fires(
            "ProjectionNotReady",
            &[("kind", "ClusterProjection"), ("name", &name)],
        )
        .await;
    assert_eq!(alert.labels["namespace"], NAMESPACE, "{alert:?}");

    // The platform team takes the namespace out of the fan-out.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"destination": {"namespaces": [written.name()]}}})),
    )
    .await
    .expect("ClusterProjection patched");
    stack.resolves("ProjectionFanOutFailures", &[]).await;
    stack
        .resolves(
            "ProjectionNotReady",
            &[("kind", "ClusterProjection"), ("name", &name)],
        )
        .await;

    api.delete(&name, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_for("the ClusterProjection deleted", FIRE, || async {
        match api.get_opt(&name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// An admission policy (evaluated by the apiserver) refusing every update of Projections in `dest`,
/// and a Projection `probe` there (of ConfigMap `settings` in `source`) created once the policy is
/// enforced: the controller cannot add its finalizer, so each of its reconciles fails (category
/// `finalizer`). Returns the policy's and its binding's guards; dropping the binding lifts it.
async fn refuse_projection_updates(
    client: &Client,
    source: &str,
    dest: &str,
) -> (ClusterScopedGuard, ClusterScopedGuard) {
    let policy = format!("alerts-refuse-updates-{dest}");
    let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["projection.sh"], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["projections"],
                }]},
                "validations": [{"expression": "false", "message": "updates are refused by the alerts test"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": dest}}},
            },
        },
    ]});
    let out = kubectl_stdin(&["apply", "-f", "-"], &manifests.to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let guards = (
        ClusterScopedGuard::new("validatingadmissionpolicy", &policy),
        ClusterScopedGuard::new("validatingadmissionpolicybinding", &policy),
    );
    // The apiserver enforces a new policy once its informer has it: a dry-run update of a canary
    // shows when. Only then is the Projection created, so its finalizer cannot slip in before.
    let projections: Api<Projection> = Api::namespaced(client.clone(), dest);
    projections
        .create(
            &PostParams::default(),
            &projection("canary", dest, source, "settings", json!({})),
        )
        .await
        .expect("canary created");
    wait_for("the admission policy to refuse updates", FIRE, || async {
        let out = kubectl(&[
            "label",
            "projection",
            "canary",
            "-n",
            dest,
            "alerts-test/probe=1",
            "--overwrite",
            "--dry-run=server",
        ]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.contains("updates are refused by the alerts test")
            .then_some(())
            .ok_or(err)
    })
    .await;
    let mut refused = projection("probe", dest, source, "settings", json!({}));
    refused.spec.destination = Some(shared::api::crd::ProjectionDestination {
        name: Some("settings-probe".into()),
        kube_config: None,
    });
    projections
        .create(&PostParams::default(), &refused)
        .await
        .expect("Projection created");

    guards
}

#[tokio::test]
async fn reconcile_errors_fire_while_the_finalizer_cannot_be_added_and_resolve_after() {
    let stack = Stack::start(1, WebhookSetup::default()).await;
    let labels = [("kind", "Projection"), ("category", "finalizer")];
    stack.baseline("ProjectionReconcileErrors", &[]).await;
    let source = TestNamespace::create(&stack.client, "alerts-errors-src").await;
    let dest = TestNamespace::create(&stack.client, "alerts-errors-dst").await;
    create_source(&stack.client, source.name(), "settings").await;

    let (_policy, binding) = refuse_projection_updates(&stack.client, source.name(), dest.name()).await;
    let projections: Api<Projection> = Api::namespaced(stack.client.clone(), dest.name());

    let alert = stack.fires("ProjectionReconcileErrors", &labels).await;
    assert!(
        alert.annotations["summary"].contains("Projection reconciles fail with finalizer errors"),
        "{alert:?}"
    );

    drop(binding);
    wait_for(
        "the Projection to get its finalizer and be Ready",
        FIRE,
        || async {
            let p = projections.get("probe").await.map_err(|e| e.to_string())?;
            let ready = p.status.as_ref().is_some_and(|s| {
                s.copy
                    .conditions
                    .iter()
                    .any(|c| c.r#type == "Ready" && c.status == "True")
            });
            ready.then_some(()).ok_or(format!("{:?}", p.status))
        },
    )
    .await;
    stack.resolves("ProjectionReconcileErrors", &labels).await;
    delete_projections(&stack.client, dest.name()).await;
}

/// The webhook's configurations (registered by `scripts/register-webhook.sh`, as the admission
/// tests do), deleted when dropped.
struct Registration {
    name: String,
}

impl Registration {
    async fn apply(port: u16, ca: &std::path::Path) -> Self {
        let name = format!("projection-alerts-test-{}", std::process::id());
        let path = format!(
            "{}:{}",
            projection_tests::control_plane_bin().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new(repo_root().join("scripts/register-webhook.sh"))
            .arg(port.to_string())
            .arg(ca)
            .arg(&name)
            .env("KUBECONFIG", kubeconfig_path())
            .env("PATH", path)
            .output()
            .expect("scripts/register-webhook.sh runs");
        assert!(
            out.status.success(),
            "registering: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { name }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
        ]);
    }
}

/// A Projection manifest applied with `kubectl apply --dry-run=server`: the apiserver sends it
/// through both webhooks, nothing is stored.
fn dry_run_apply(namespace: &str, source_namespace: &str) -> std::process::Output {
    let manifest = serde_json::to_string(&projection(
        "dry-run",
        namespace,
        source_namespace,
        "settings",
        json!({}),
    ))
    .expect("JSON");
    kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &manifest)
}

/// Applies in a loop on a thread of its own until `stop`; counts the answers whose stderr contains
/// `counted`.
fn apply_loop(
    namespace: String,
    source_namespace: String,
    stop: Arc<AtomicBool>,
    counted: &'static str,
    count: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // Bounded: the test stops it well before.
        for _ in 0..2000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let out = dry_run_apply(&namespace, &source_namespace);
            if String::from_utf8_lossy(&out.stderr).contains(counted) {
                count.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

#[tokio::test]
async fn webhook_errors_fire_while_it_may_not_check_access_and_resolve_once_it_may() {
    // The webhook runs as a ServiceAccount that may not create SubjectAccessReviews yet.
    let client = client().await;
    let accounts = TestNamespace::create(&client, "alerts-webhook-sa").await;
    kubectl_ok(&[
        "create",
        "serviceaccount",
        "alerts-webhook",
        "-n",
        accounts.name(),
    ]);
    let kubeconfig = service_account_kubeconfig(accounts.name(), "alerts-webhook");
    let stack = Stack::start(
        1,
        WebhookSetup {
            kubeconfig,
            ..WebhookSetup::default()
        },
    )
    .await;
    stack.baseline("ProjectionWebhookErrors", &[]).await;
    let source = TestNamespace::create(&stack.client, "alerts-werr-src").await;
    let dest = TestNamespace::create(&stack.client, "alerts-werr-dst").await;
    create_source(&stack.client, source.name(), "settings").await;
    let _registration = Registration::apply(stack.webhook_port, &stack.certs.dir.join("ca.crt")).await;

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let applies = apply_loop(
        dest.name().to_owned(),
        source.name().to_owned(),
        stop.clone(),
        "cannot check the source right now",
        refused.clone(),
    );
    let alert = stack.fires("ProjectionWebhookErrors", &[]).await;
    assert!(
        alert.annotations["summary"].contains("of reviews: it cannot check them"),
        "{alert:?}"
    );
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "kubectl apply never saw the fail-closed denial"
    );
    let errors = metric_value(
        &stack.webhook.metrics(),
        "projection_webhook_errors_total{category=\"access_review\"}",
    );
    assert!(
        errors.is_some_and(|e| e > 0.0),
        "access_review errors: {errors:?}"
    );

    // The webhook's RBAC is repaired: it may review access and read the source.
    let binding = format!("alerts-webhook-{}", std::process::id());
    kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=system:auth-delegator",
        &format!("--serviceaccount={}:alerts-webhook", accounts.name()),
    ]);
    let _binding = ClusterScopedGuard::new("clusterrolebinding", &binding);
    kubectl_ok(&[
        "create",
        "rolebinding",
        "alerts-webhook-view",
        "-n",
        source.name(),
        "--clusterrole=view",
        &format!("--serviceaccount={}:alerts-webhook", accounts.name()),
    ]);
    wait_for("a dry-run apply to pass the webhook", FIRE, || async {
        let out = dry_run_apply(dest.name(), source.name());
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await;
    stack.resolves("ProjectionWebhookErrors", &[]).await;
    stop.store(true, Ordering::Relaxed);
    applies.join().expect("the apply loop ends");
}

/// [`dry_run_apply`] on a blocking thread, so the runtime keeps driving the test's proxy meanwhile.
fn dry_run_apply_off_thread(
    namespace: &str,
    source_namespace: &str,
) -> impl std::future::Future<Output = std::process::Output> + Send + 'static {
    let (namespace, source_namespace) = (namespace.to_owned(), source_namespace.to_owned());
    async move {
        tokio::task::spawn_blocking(move || dry_run_apply(&namespace, &source_namespace))
            .await
            .expect("kubectl thread")
    }
}

// Several threads: the proxy between the webhook and the apiserver runs on this test's runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_latency_fires_while_the_apiserver_answers_it_slowly() {
    // The webhook reaches the apiserver through a proxy the test can hold silent.
    let upstream = projection_tests::apiserver_addr()
        .await
        .expect("the apiserver's address");
    let proxy = BlackHoleProxy::start(upstream).await.expect("proxy listens");
    let mut kubeconfig: Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig_path()).expect("kubeconfig")).expect("YAML");
    kubeconfig["clusters"][0]["cluster"]["server"] = json!(format!("https://{}", proxy.addr()));
    let scratch = Scratch::new("alerts-proxy-kubeconfig");
    let kubeconfig_file = scratch.write("kubeconfig", &kubeconfig.to_string());
    let stack = Stack::start(
        1,
        WebhookSetup {
            kubeconfig: kubeconfig_file,
            ..WebhookSetup::default()
        },
    )
    .await;
    stack.baseline("ProjectionWebhookLatency", &[]).await;
    let source = TestNamespace::create(&stack.client, "alerts-slow-src").await;
    let dest = TestNamespace::create(&stack.client, "alerts-slow-dst").await;
    create_source(&stack.client, source.name(), "settings").await;
    let _registration = Registration::apply(stack.webhook_port, &stack.certs.dir.join("ca.crt")).await;
    wait_for("a dry-run apply to pass the webhook", FIRE, || async {
        let out = dry_run_apply_off_thread(dest.name(), source.name()).await;
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await;

    // Rounds of a 2.5 s silence of the webhook's path to the apiserver (shorter than the 5 s the
    // registration gives the webhook), with applies waiting through it, until the alert fires.
    let mut fired = None;
    for round in 0..20 {
        proxy.black_hole();
        let applies: Vec<_> = (0..3)
            .map(|_| tokio::spawn(dry_run_apply_off_thread(dest.name(), source.name())))
            .collect();
        // The length of the outage being induced, not a wait for a state.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        proxy.restore();
        for apply in applies {
            let out = apply.await.expect("apply task");
            assert!(
                out.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let alerts = stack.prometheus.alerts().unwrap_or_default();
        if let Some(a) = alerts
            .iter()
            .find(|a| a.labels["alertname"] == "ProjectionWebhookLatency" && a.state == "firing")
        {
            fired = Some(a.clone());
            break;
        }
    }
    let alert = fired.unwrap_or_else(|| panic!("ProjectionWebhookLatency never fired"));
    println!("ProjectionWebhookLatency fired: {alert:?}");
    let seconds = value(&alert);
    assert!(seconds > 1.0, "{alert:?}");
    assert!(
        alert.annotations["summary"].starts_with("The projection webhook is slow: "),
        "{alert:?}"
    );
    stack.resolves("ProjectionWebhookLatency", &[]).await;
    // The path answering promptly again: a review goes through at once.
    let out = dry_run_apply_off_thread(dest.name(), source.name()).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn certificate_expiry_fires_for_a_short_lived_certificate_and_resolves_on_renewal() {
    let stack = Stack::start(
        1,
        WebhookSetup {
            certificate_days: 1,
            ..WebhookSetup::default()
        },
    )
    .await;
    let alert = stack.fires("ProjectionWebhookCertificateExpiry", &[]).await;
    let left = value(&alert);
    assert!(left > 0.0 && left <= 86_400.0, "{alert:?}");
    assert!(
        alert.annotations["summary"].contains("expires in 23h"),
        "{alert:?}"
    );

    // Renewed, as cert-manager or the self-managed mode would: the webhook reloads the files.
    issue_certificate(&stack.certs.dir, 30);
    stack.resolves("ProjectionWebhookCertificateExpiry", &[]).await;
    let expiry = metric_value(
        &stack.webhook.metrics(),
        "projection_webhook_certificate_expiry_timestamp_seconds",
    )
    .expect("the expiry gauge");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(
        expiry - now > 29.0 * 86_400.0,
        "the renewed certificate is in use"
    );
}

#[tokio::test]
async fn webhook_down_fires_when_it_stops_and_resolves_when_it_is_back() {
    let mut stack = Stack::start(1, WebhookSetup::default()).await;
    stack.baseline("ProjectionWebhookDown", &[]).await;
    stack.webhook.stop();
    stack.fires("ProjectionWebhookDown", &[]).await;
    stack.webhook.start().await;
    stack.resolves("ProjectionWebhookDown", &[]).await;
}

#[tokio::test]
async fn controller_down_fires_when_it_stops_and_resolves_when_it_is_back() {
    let mut stack = Stack::start(1, WebhookSetup::default()).await;
    stack.baseline("ProjectionControllerDown", &[]).await;
    stack.controllers[0].stop();
    stack.fires("ProjectionControllerDown", &[]).await;
    stack.controllers[0].start().await;
    stack.resolves("ProjectionControllerDown", &[]).await;
}

/// Which controller slot leads, by its own `leader_election_master_status`.
fn leader(stack: &Stack) -> Option<usize> {
    let sample = "leader_election_master_status{name=\"projection-controller-leader\"}";
    stack
        .controllers
        .iter()
        .position(|c| metric_value(&c.metrics(), sample) == Some(1.0))
}

#[tokio::test]
async fn no_leader_fires_while_a_killed_leader_still_holds_the_lease() {
    let mut stack = Stack::start(2, WebhookSetup::default()).await;
    stack.baseline("ProjectionNoLeader", &[]).await;
    let first = wait_for("one controller to lead", FIRE, || async {
        leader(&stack).ok_or_else(|| "no replica reports leadership".to_owned())
    })
    .await;
    let standby = 1 - first;
    // Killed, it cannot release the Lease: the standby waits for it to expire (20 s), with no leader.
    stack.controllers[first].kill();
    let alert = stack.fires("ProjectionNoLeader", &[]).await;
    assert_eq!(value(&alert), 0.0);
    let down = stack.prometheus.alerts().expect("alerts");
    assert!(
        !down
            .iter()
            .any(|a| a.labels["alertname"] == "ProjectionControllerDown"),
        "a standby is up, so the controller is not down: {down:?}"
    );
    stack.resolves("ProjectionNoLeader", &[]).await;
    assert_eq!(leader(&stack), Some(standby), "the standby took over");
    let lease = kubectl_ok(&[
        "get",
        "lease",
        "projection-controller-leader",
        "-n",
        stack.lease_namespace.name(),
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let pid = stack.controllers[standby]
        .process
        .as_ref()
        .expect("running")
        .pid();
    assert!(
        lease.ends_with(&format!("-{pid}")),
        "the Lease names the standby ({pid}): {lease}"
    );
}
