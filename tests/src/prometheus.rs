//! The real Prometheus and promtool (built from the Prometheus Go module by
//! `tests/control-plane/build-monitoring.sh`, at the version of `versions.env`) for the tests of the chart's
//! alerts and dashboard: a Prometheus server on loopback that scrapes processes the test runs and
//! evaluates rule files, read through its HTTP API.

use crate::{control_plane_bin, free_port, http_get, http_get_from, testenv_dir, wait_for};
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

/// The path of `promtool` or `prometheus` in the control plane's bin folder; panics saying how to
/// build it when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = control_plane_bin().join(name);
    assert!(
        path.exists(),
        "{} is missing: run tests/control-plane/build-monitoring.sh (it builds promtool and prometheus from \
         the Prometheus Go module) and tests/control-plane/up.sh (which links them into {})",
        path.display(),
        control_plane_bin().display()
    );
    path
}

/// Runs promtool with `args`.
pub fn promtool(args: &[&str]) -> Output {
    Command::new(tool("promtool"))
        .args(args)
        .output()
        .expect("promtool runs")
}

/// A folder of its own for one test's files, removed when dropped.
pub struct Scratch {
    pub dir: PathBuf,
}

static SCRATCH_COUNTER: AtomicU32 = AtomicU32::new(0);

impl Scratch {
    /// `.testenv/<prefix>-<pid>-<n>`, new and empty.
    pub fn new(prefix: &str) -> Self {
        let n = SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = testenv_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Self { dir }
    }

    /// Writes `name` in the folder; returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("scratch file written");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One scrape job of the server: its name, its targets' ports on 127.0.0.1, and target labels.
pub struct Job<'a> {
    pub name: &'a str,
    pub ports: Vec<u16>,
    pub labels: BTreeMap<&'a str, &'a str>,
}

/// A Prometheus server on 127.0.0.1 scraping and evaluating every second; stopped when dropped.
/// Its API is [`PrometheusApi`]'s (through `Deref`).
pub struct PrometheusServer {
    child: std::process::Child,
    /// Its HTTP port (API).
    pub port: u16,
    /// Where its log is.
    pub log: PathBuf,
    api: PrometheusApi,
    _scratch: Scratch,
}

/// The HTTP API of a Prometheus server at `host:port` (one the tests run on loopback, or one in a
/// pod of the local node, reached at its pod IP).
pub struct PrometheusApi {
    pub host: String,
    pub port: u16,
}

impl std::ops::Deref for PrometheusServer {
    type Target = PrometheusApi;
    fn deref(&self) -> &PrometheusApi {
        &self.api
    }
}

/// One alert as `/api/v1/alerts` reports it.
#[derive(Debug, Clone)]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `pending` or `firing`.
    pub state: String,
    pub value: String,
}

impl Alert {
    /// Whether every `(label, value)` of `labels` is among the alert's labels.
    pub fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.get(*k).is_some_and(|have| have == v))
    }
}

impl PrometheusServer {
    /// Starts Prometheus with `rules` (a rule file's YAML) and `jobs`, scraping and evaluating
    /// every second; waits until it is ready and has loaded the rules.
    pub async fn start(rules: &str, jobs: &[Job<'_>]) -> Self {
        let scratch = Scratch::new("prometheus");
        let rules_path = scratch.write("rules.yaml", rules);
        let scrape_configs: Vec<Value> = jobs
            .iter()
            .map(|job| {
                serde_json::json!({
                    "job_name": job.name,
                    "static_configs": [{
                        "targets": job.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>(),
                        "labels": job.labels,
                    }],
                })
            })
            .collect();
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules_path],
            "scrape_configs": scrape_configs,
        });
        // JSON is YAML.
        let config_path = scratch.write("prometheus.yml", &config.to_string());
        let port = free_port();
        let log = scratch.dir.join("prometheus.log");
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("prometheus starts");
        let mut server = Self {
            child,
            port,
            log,
            api: PrometheusApi {
                host: "127.0.0.1".to_owned(),
                port,
            },
            _scratch: scratch,
        };
        server.wait_ready().await;
        server
    }

    async fn wait_ready(&mut self) {
        let port = self.port;
        let log = self.log.clone();
        for _ in 0..600 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "prometheus exited ({status}); log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if http_get(port, "/-/ready").is_some_and(|(code, _)| code == 200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wait_for(
            "prometheus to load its rules",
            Duration::from_secs(30),
            || async {
                let groups = self.api("/api/v1/rules")?;
                let count = groups["groups"]
                    .as_array()
                    .map(|g| {
                        g.iter()
                            .map(|g| g["rules"].as_array().map_or(0, Vec::len))
                            .sum::<usize>()
                    })
                    .unwrap_or(0);
                (count > 0).then_some(()).ok_or(format!("rules: {groups}"))
            },
        )
        .await;
    }
}

impl PrometheusApi {
    /// `GET path` of the API; the `data` of a successful answer, or what went wrong.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (code, _, body) =
            http_get_from(&self.host, self.port, path, None).ok_or("prometheus does not answer")?;
        let answer: Value = serde_json::from_str(&body).map_err(|e| format!("HTTP {code}: {e}: {body}"))?;
        if code != 200 || answer["status"] != "success" {
            return Err(format!("HTTP {code}: {answer}"));
        }
        Ok(answer["data"].clone())
    }

    /// The alerts now pending or firing.
    pub fn alerts(&self) -> Result<Vec<Alert>, String> {
        let data = self.api("/api/v1/alerts")?;
        let strings = |v: &Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(data["alerts"]
            .as_array()
            .ok_or_else(|| format!("no alerts array: {data}"))?
            .iter()
            .map(|a| Alert {
                labels: strings(&a["labels"]),
                annotations: strings(&a["annotations"]),
                state: a["state"].as_str().unwrap_or_default().to_owned(),
                value: a["value"].as_str().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    /// Waits until the alert `name` with `labels` fires; returns it.
    pub async fn wait_firing(&self, name: &str, labels: &[(&str, &str)], timeout: Duration) -> Alert {
        wait_for(&format!("alert {name} {labels:?} to fire"), timeout, || async {
            let alerts = self.alerts()?;
            alerts
                .iter()
                .find(|a| {
                    a.labels.get("alertname").is_some_and(|n| n == name)
                        && a.has(labels)
                        && a.state == "firing"
                })
                .cloned()
                .ok_or_else(|| format!("active alerts: {}", summary(&alerts)))
        })
        .await
    }

    /// Waits until no alert `name` with `labels` is pending or firing (resolved, or never active).
    pub async fn wait_inactive(&self, name: &str, labels: &[(&str, &str)], timeout: Duration) {
        wait_for(
            &format!("alert {name} {labels:?} to be inactive"),
            timeout,
            || async {
                let alerts = self.alerts()?;
                let active = alerts
                    .iter()
                    .any(|a| a.labels.get("alertname").is_some_and(|n| n == name) && a.has(labels));
                (!active)
                    .then_some(())
                    .ok_or_else(|| format!("active alerts: {}", summary(&alerts)))
            },
        )
        .await;
    }

    /// Waits until every target of every job has been scraped successfully.
    pub async fn wait_targets_up(&self) {
        wait_for("every scrape target up", Duration::from_secs(30), || async {
            let data = self.api("/api/v1/targets?state=active")?;
            let targets = data["activeTargets"].as_array().cloned().unwrap_or_default();
            let down: Vec<String> = targets
                .iter()
                .filter(|t| t["health"] != "up")
                .map(|t| format!("{} {}: {}", t["scrapeUrl"], t["health"], t["lastError"]))
                .collect();
            (!targets.is_empty() && down.is_empty())
                .then_some(())
                .ok_or(format!("{} targets, not up: {down:?}", targets.len()))
        })
        .await;
    }

    /// The metric names a PromQL expression selects, as Prometheus' own parser reads it
    /// (`/api/v1/parse_query`); the parser's error otherwise.
    pub fn selected_metrics(&self, expr: &str) -> Result<BTreeSet<String>, String> {
        let ast = self.api(&format!("/api/v1/parse_query?query={}", percent_encode(expr)))?;
        let mut names = BTreeSet::new();
        collect_selectors(&ast, &mut names);
        Ok(names)
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn summary(alerts: &[Alert]) -> String {
    let items: Vec<String> = alerts
        .iter()
        .map(|a| {
            let labels: Vec<String> = a
                .labels
                .iter()
                .filter(|(k, _)| k.as_str() != "alertname")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "{} {{{}}} {} value={}",
                a.labels.get("alertname").map_or("?", String::as_str),
                labels.join(","),
                a.state,
                a.value
            )
        })
        .collect();
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join("; ")
    }
}

/// The names of every vector and matrix selector in a `parse_query` AST.
fn collect_selectors(node: &Value, names: &mut BTreeSet<String>) {
    match node {
        Value::Object(map) => {
            if matches!(
                map.get("type").and_then(Value::as_str),
                Some("vectorSelector" | "matrixSelector")
            ) {
                match map.get("name").and_then(Value::as_str) {
                    Some(name) if !name.is_empty() => {
                        names.insert(name.to_owned());
                    }
                    // A selector by `__name__` matchers only: name what it matches.
                    _ => {
                        names.insert(format!("<no name: {node}>"));
                    }
                }
            }
            map.values().for_each(|v| collect_selectors(v, names));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_selectors(v, names)),
        _ => {}
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The sample names an exposition (Prometheus text or OpenMetrics) offers, including those of
/// families that have no sample yet: a counter's `_total`, a histogram's `_bucket`, `_sum` and
/// `_count`, from its `# TYPE` line.
pub fn exposed_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    let base = name.strip_suffix("_total").unwrap_or(name);
                    names.insert(format!("{base}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        } else if let Some(name) = line
            .split(['{', ' '])
            .next()
            .filter(|n| !n.is_empty() && !n.starts_with('#'))
        {
            names.insert(name.to_owned());
        }
    }
    names
}

/// Writes `files` (name, text) into a new scratch folder and runs `promtool` with `args` there
/// (each `{name}` in an argument replaced by that file's path). Returns the output.
pub fn promtool_in(files: &[(&str, &str)], args: &[&str]) -> Output {
    let scratch = Scratch::new("promtool");
    let mut paths = BTreeMap::new();
    for (name, text) in files {
        paths.insert(*name, scratch.write(name, text));
    }
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            paths.iter().fold((*a).to_owned(), |arg, (name, path)| {
                arg.replace(&format!("{{{name}}}"), &path.display().to_string())
            })
        })
        .collect();
    Command::new(tool("promtool"))
        .args(&args)
        .current_dir(&scratch.dir)
        .output()
        .expect("promtool runs")
}
