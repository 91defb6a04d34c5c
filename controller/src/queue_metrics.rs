//! The controller-runtime metric names the Go operator exposed (`controller_runtime_reconcile_*`,
//! `workqueue_*`), so its dashboards and benchmark harness read real values from us.
//!
//! kube-runtime's controller keeps its queue to itself, so the queue figures are taken at its edges:
//! an object is queued when a change or a wake is handed to the controller (and it was not already
//! waiting) and leaves the queue when its reconcile starts. docs/observability.md says which values
//! are exact equivalents and which are approximations.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType, counter::Counter, family::Family, gauge::ConstGauge, gauge::Gauge, histogram::Histogram,
    },
    registry::Registry,
};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// controller-runtime's buckets of `controller_runtime_reconcile_time_seconds`.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25,
    1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0,
    50.0, 60.0,
];

/// client-go's work-queue buckets: 10 ns to 1000 s, by factors of ten.
fn workqueue_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(10e-9, 10.0, 12)
}

/// Labels by controller (`projection` or `clusterprojection`, the Go operator's controller names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

/// Labels of `controller_runtime_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: &'static str,
    /// `success`, `error`, `requeue` or `requeue_after`, as controller-runtime.
    pub result: &'static str,
}

/// Labels of the `workqueue_*` metrics (the queue is named after its controller). In
/// client_golang's order (sorted), so text matches of the Go operator's series match ours.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub controller: &'static str,
    pub name: &'static str,
}

/// Labels of `workqueue_depth`: controller-runtime's priority queue (the Go operator's) adds the
/// priority; every reconcile here has the default one, `0`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DepthLabels {
    pub controller: &'static str,
    pub name: &'static str,
    pub priority: &'static str,
}

/// How a reconcile ended, in controller-runtime's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileEnd {
    Success,
    RequeueAfter,
    Error,
}

/// The metric families, shared by both controllers.
#[derive(Clone)]
struct Families {
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors_total: Family<ControllerLabels, Counter>,
    reconcile_time_seconds: Family<ControllerLabels, Histogram>,
    depth: Family<DepthLabels, Gauge>,
    adds_total: Family<QueueLabels, Counter>,
    queue_duration_seconds: Family<QueueLabels, Histogram>,
    work_duration_seconds: Family<QueueLabels, Histogram>,
    retries_total: Family<QueueLabels, Counter>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_concurrent_reconciles: Family<ControllerLabels, Gauge>,
}

/// The controller-runtime metrics of one controller, with what its queue holds.
pub struct ControllerMetrics {
    name: &'static str,
    families: Families,
    /// The objects waiting for a reconcile (`namespace/name`), since when.
    queued: Mutex<HashMap<String, Instant>>,
    /// When each reconcile running now started.
    running: Mutex<Vec<Instant>>,
}

impl ControllerMetrics {
    fn new(name: &'static str, families: Families) -> Self {
        let this = Self {
            name,
            families,
            queued: Mutex::default(),
            running: Mutex::default(),
        };
        // As controller-runtime does: every series exists from the start, at zero.
        for result in ["success", "error", "requeue", "requeue_after"] {
            drop(this.families.reconcile_total.get_or_create(&this.result(result)));
        }
        drop(
            this.families
                .reconcile_errors_total
                .get_or_create(&this.controller()),
        );
        drop(
            this.families
                .reconcile_time_seconds
                .get_or_create(&this.controller()),
        );
        drop(this.families.depth.get_or_create(&this.depth_labels()));
        drop(this.families.adds_total.get_or_create(&this.queue()));
        drop(this.families.queue_duration_seconds.get_or_create(&this.queue()));
        drop(this.families.work_duration_seconds.get_or_create(&this.queue()));
        drop(this.families.retries_total.get_or_create(&this.queue()));
        drop(this.families.active_workers.get_or_create(&this.controller()));
        drop(
            this.families
                .max_concurrent_reconciles
                .get_or_create(&this.controller()),
        );
        this
    }

    fn controller(&self) -> ControllerLabels {
        ControllerLabels {
            controller: self.name,
        }
    }
    fn result(&self, result: &'static str) -> ResultLabels {
        ResultLabels {
            controller: self.name,
            result,
        }
    }
    fn queue(&self) -> QueueLabels {
        QueueLabels {
            controller: self.name,
            name: self.name,
        }
    }
    fn depth_labels(&self) -> DepthLabels {
        DepthLabels {
            controller: self.name,
            name: self.name,
            priority: "0",
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // The map holds no invariant a panic could break halfway.
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<Instant>> {
        // As `queued`: no invariant a panic could break halfway.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long the reconciles running now have run: in all, and the longest.
    fn unfinished(&self) -> (f64, f64) {
        let running = self.running();
        let ages = running.iter().map(|started| started.elapsed().as_secs_f64());
        ages.fold((0.0, 0.0), |(sum, longest), age| {
            (sum + age, f64::max(longest, age))
        })
    }

    fn set_active(&self, workers: usize) {
        self.families
            .active_workers
            .get_or_create(&self.controller())
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    fn set_depth(&self, depth: usize) {
        self.families
            .depth
            .get_or_create(&self.depth_labels())
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// A change or a wake of `key` was handed to the controller. Counted as an add only when the
    /// object was not already waiting (a queue holds an object once).
    pub fn queued_change(&self, key: String) {
        let mut queued = self.queued();
        if queued.contains_key(&key) {
            return;
        }
        queued.insert(key, Instant::now());
        self.set_depth(queued.len());
        drop(queued);
        self.families.adds_total.get_or_create(&self.queue()).inc();
    }

    /// The controller dropped `key` without reconciling it (the object is gone from its store).
    pub fn dropped(&self, key: &str) {
        let mut queued = self.queued();
        if queued.remove(key).is_some() {
            self.set_depth(queued.len());
        }
    }

    /// The reconcile of `key` starts, `at` (the instant [`ControllerMetrics::finished`] is given).
    /// An object that was not waiting comes back from a requeue the controller scheduled itself: it
    /// is counted as an add with no time in the queue, as when client-go's delayed add fires.
    pub fn started(&self, key: &str, at: Instant) {
        let mut running = self.running();
        running.push(at);
        self.set_active(running.len());
        drop(running);
        let mut queued = self.queued();
        let since = queued.remove(key);
        self.set_depth(queued.len());
        drop(queued);
        let waited = match since {
            Some(since) => since.elapsed(),
            None => {
                self.families.adds_total.get_or_create(&self.queue()).inc();
                Duration::ZERO
            }
        };
        self.families
            .queue_duration_seconds
            .get_or_create(&self.queue())
            .observe(waited.as_secs_f64());
    }

    /// A reconcile that started at `started` ended with `outcome`.
    pub fn finished(&self, started: Instant, outcome: ReconcileEnd) {
        let mut running = self.running();
        if let Some(at) = running.iter().position(|at| *at == started) {
            running.swap_remove(at);
        }
        self.set_active(running.len());
        drop(running);
        let took = started.elapsed().as_secs_f64();
        self.families
            .reconcile_time_seconds
            .get_or_create(&self.controller())
            .observe(took);
        self.families
            .work_duration_seconds
            .get_or_create(&self.queue())
            .observe(took);
        let result = match outcome {
            ReconcileEnd::Success => "success",
            ReconcileEnd::RequeueAfter => "requeue_after",
            ReconcileEnd::Error => "error",
        };
        self.families
            .reconcile_total
            .get_or_create(&self.result(result))
            .inc();
        if outcome == ReconcileEnd::Error {
            self.families
                .reconcile_errors_total
                .get_or_create(&self.controller())
                .inc();
            // The error policy requeues with a backoff: controller-runtime's rate-limited add.
            self.families.retries_total.get_or_create(&self.queue()).inc();
        }
    }
}

/// Both controllers' controller-runtime metrics.
pub struct QueueMetrics {
    pub projection: Arc<ControllerMetrics>,
    pub cluster: Arc<ControllerMetrics>,
}

impl QueueMetrics {
    /// Reports `--max-concurrent-reconciles` (0: no limit) for both controllers.
    pub fn set_max_concurrent(&self, reconciles: u16) {
        for controller in [&self.projection, &self.cluster] {
            controller
                .families
                .max_concurrent_reconciles
                .get_or_create(&controller.controller())
                .set(i64::from(reconciles));
        }
    }

    /// The queue metrics of the controller of `scope`'s CRs.
    pub fn of(&self, scope: shared::api::kind::Scope) -> &ControllerMetrics {
        match scope {
            shared::api::kind::Scope::OwnNamespace => &self.projection,
            shared::api::kind::Scope::Namespaces => &self.cluster,
        }
    }

    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let families = Families {
            reconcile_total: Family::default(),
            reconcile_errors_total: Family::default(),
            reconcile_time_seconds: Family::new_with_constructor(|| Histogram::new(RECONCILE_TIME_BUCKETS)),
            depth: Family::default(),
            adds_total: Family::default(),
            queue_duration_seconds: Family::new_with_constructor(|| Histogram::new(workqueue_buckets())),
            work_duration_seconds: Family::new_with_constructor(|| Histogram::new(workqueue_buckets())),
            retries_total: Family::default(),
            active_workers: Family::default(),
            max_concurrent_reconciles: Family::default(),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            families.reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            families.reconcile_errors_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            families.reconcile_time_seconds.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue by workqueue and priority",
            families.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            families.adds_total.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            families.queue_duration_seconds.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            families.work_duration_seconds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            families.retries_total.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            families.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            families.max_concurrent_reconciles.clone(),
        );
        let this = Self {
            projection: Arc::new(ControllerMetrics::new("projection", families.clone())),
            cluster: Arc::new(ControllerMetrics::new("clusterprojection", families)),
        };
        registry.register_collector(Box::new(UnfinishedWork([
            this.projection.clone(),
            this.cluster.clone(),
        ])));
        this
    }
}

/// Encodes, at each scrape, how long the reconciles running now have run (client-go computes the
/// same two gauges every 500 ms; here a scrape reads them, so an idle controller does no work).
#[derive(Debug)]
struct UnfinishedWork([Arc<ControllerMetrics>; 2]);

impl std::fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerMetrics")
            .field("name", &self.name)
            .finish()
    }
}

impl Collector for UnfinishedWork {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures: Vec<(QueueLabels, (f64, f64))> = self
            .0
            .iter()
            .map(|controller| (controller.queue(), controller.unfinished()))
            .collect();
        let mut family = encoder.encode_descriptor(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
            None,
            MetricType::Gauge,
        )?;
        for (labels, (sum, _)) in &figures {
            ConstGauge::new(*sum).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            None,
            MetricType::Gauge,
        )?;
        for (labels, (_, longest)) in &figures {
            ConstGauge::new(*longest).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// The queue key of an object: `namespace/name`, or `name` for a cluster-scoped one.
pub fn queue_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(queue: &ControllerMetrics) -> i64 {
        queue.families.depth.get_or_create(&queue.depth_labels()).get()
    }

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn every_series_exists_at_zero_from_the_start() {
        let mut registry = Registry::default();
        let _metrics = QueueMetrics::register(&mut registry);
        let text = encoded(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="projection",result="success"} 0"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="error"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="projection"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="projection"} 0"#,
            r#"workqueue_depth{controller="projection",name="projection",priority="0"} 0"#,
            r#"workqueue_adds_total{controller="clusterprojection",name="clusterprojection"} 0"#,
            r#"workqueue_retries_total{controller="projection",name="projection"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_queue_holds_an_object_once_and_a_start_takes_it_out() {
        let mut registry = Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let queue = &metrics.projection;
        queue.queued_change(queue_key(Some("a"), "one"));
        queue.queued_change(queue_key(Some("a"), "one"));
        queue.queued_change(queue_key(Some("a"), "two"));
        assert_eq!(depth(queue), 2);
        queue.started("a/one", Instant::now());
        assert_eq!(depth(queue), 1);
        queue.dropped("a/two");
        assert_eq!(depth(queue), 0);
        // A requeue the controller scheduled itself: an add with no wait.
        queue.started("a/one", Instant::now());
        let text = encoded(&registry);
        assert!(text.contains(r#"workqueue_adds_total{controller="projection",name="projection"} 3"#));
        assert!(text.contains(
            r#"workqueue_queue_duration_seconds_count{controller="projection",name="projection"} 2"#
        ));
    }

    #[test]
    fn an_error_counts_as_an_error_and_a_retry() {
        let mut registry = Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        metrics.cluster.finished(Instant::now(), ReconcileEnd::Error);
        metrics.cluster.finished(Instant::now(), ReconcileEnd::Success);
        metrics
            .cluster
            .finished(Instant::now(), ReconcileEnd::RequeueAfter);
        let text = encoded(&registry);
        for line in [
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="error"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clusterprojection",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="clusterprojection"} 1"#,
            r#"workqueue_retries_total{controller="clusterprojection",name="clusterprojection"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="clusterprojection"} 3"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn running_reconciles_are_counted_and_timed_until_they_finish() {
        let mut registry = Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        metrics.set_max_concurrent(32);
        let queue = &metrics.projection;
        let long_ago = Instant::now() - Duration::from_secs(30);
        let now = Instant::now();
        queue.started("a/one", long_ago);
        queue.started("a/two", now);
        let text = encoded(&registry);
        assert!(
            text.contains(r#"controller_runtime_active_workers{controller="projection"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"controller_runtime_active_workers{controller="clusterprojection"} 0"#));
        assert!(text.contains(r#"controller_runtime_max_concurrent_reconciles{controller="projection"} 32"#));
        let gauge = |name: &str| -> f64 {
            let prefix = format!(r#"{name}{{controller="projection",name="projection"}} "#);
            let line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
            line[prefix.len()..].parse().expect("a number")
        };
        assert!(gauge("workqueue_longest_running_processor_seconds") >= 30.0);
        assert!(gauge("workqueue_unfinished_work_seconds") >= 30.0);
        queue.finished(long_ago, ReconcileEnd::Success);
        queue.finished(now, ReconcileEnd::Success);
        let text = encoded(&registry);
        assert!(
            text.contains(r#"controller_runtime_active_workers{controller="projection"} 0"#),
            "{text}"
        );
        assert!(text.contains(
            r#"workqueue_longest_running_processor_seconds{controller="projection",name="projection"} 0.0"#
        ), "{text}");
    }
}
