//! The webhook's Prometheus metrics. Labels are bounded: endpoint, resource, operation and verdict
//! come from fixed sets, never from object names or error text.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};
use runtime::serve::LimitLabels;

/// Labels of the request counter and latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `validate` or `mutate`.
    pub endpoint: &'static str,
    /// `projections`, `clusterprojections`, `other`, or `unknown` for unreadable requests.
    pub resource: &'static str,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT`, or `unknown`.
    pub operation: &'static str,
    /// `allowed`, `denied`, `error` (a policy could not be checked) or `bad_request`.
    pub verdict: &'static str,
}

/// Labels of error counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    /// The error's category (a fixed, small set).
    pub category: &'static str,
}

/// Labels of the certificate reload counters.
pub use runtime::tls::ReloadLabels;

/// Labels of the lookup counters of the SubjectAccessReview cache and the source metadata cache.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit` (a kept answer was used) or `miss` (the apiserver was asked).
    pub result: &'static str,
}

/// Labels of the self-managed certificate issue counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssueLabels {
    /// `ca` or `serving`.
    pub certificate: &'static str,
    /// Why: `missing`, `invalid`, `expiring`, `names_missing`, `names_extra`, `not_issued_by_ca`,
    /// `issuer_expiring`, `issued_by_previous_ca` or `ca_replaced`.
    pub reason: &'static str,
}

/// Labels of the apiserver writes of the self-managed certificate mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `secret_create`, `secret_update`, `validating_configuration` or `mutating_configuration`.
    pub target: &'static str,
    /// `success`, `conflict` (another replica won; re-read) or `error`.
    pub result: &'static str,
}

/// Labels of the shed counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// `validate` or `mutate`.
    pub endpoint: &'static str,
}

/// Every metric of the webhook.
pub struct Metrics {
    pub requests_total: Family<RequestLabels, Counter>,
    pub request_duration_seconds: Family<RequestLabels, Histogram>,
    pub errors_total: Family<CategoryLabels, Counter>,
    /// Reloads and expiry of the serving certificate in use, whatever its source.
    pub serving_certificate: runtime::tls::CertMetrics,
    pub certificates_issued_total: Family<IssueLabels, Counter>,
    pub self_managed_writes_total: Family<WriteLabels, Counter>,
    pub access_review_cache_lookups_total: Family<CacheLabels, Counter>,
    pub source_metadata_cache_lookups_total: Family<CacheLabels, Counter>,
    /// Reviews answered "overloaded" (HTTP 429) because the in-flight limit was reached.
    pub shed_total: Family<EndpointLabels, Counter>,
    /// Connections of the admission server that hit a limit, by limit (`runtime::serve`'s fixed set).
    pub connection_limit_hits_total: Family<LimitLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them, with the process metrics, into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        registry.register(
            "projection_webhook_requests",
            "Admission reviews answered, by endpoint, resource, operation and verdict",
            metrics.requests_total.clone(),
        );
        registry.register(
            "projection_webhook_request_duration_seconds",
            "Time to answer one admission review, body read included",
            metrics.request_duration_seconds.clone(),
        );
        registry.register(
            "projection_webhook_errors",
            "Requests that could not be read or whose policy could not be checked, by category",
            metrics.errors_total.clone(),
        );
        metrics.serving_certificate.register(registry, SERVICE, "Serving");
        registry.register(
            "projection_webhook_certificates_issued",
            "Certificates the self-managed certificate mode issued, by certificate and reason",
            metrics.certificates_issued_total.clone(),
        );
        registry.register(
            "projection_webhook_self_managed_writes",
            "Writes of the self-managed certificate mode (Secret, caBundle patches), by target and result",
            metrics.self_managed_writes_total.clone(),
        );
        registry.register(
            "projection_webhook_access_review_cache_lookups",
            "Lookups of SubjectAccessReview grants kept by --access-review-cache-ttl, by result (hit, miss)",
            metrics.access_review_cache_lookups_total.clone(),
        );
        registry.register(
            "projection_webhook_source_metadata_cache_lookups",
            "Lookups of source metadata reads kept by --source-metadata-cache-ttl, by result (hit, miss)",
            metrics.source_metadata_cache_lookups_total.clone(),
        );
        registry.register(
            "projection_webhook_shed",
            "Admission reviews answered with HTTP 429 (webhook overloaded, retry) because --max-in-flight-reviews was reached, by endpoint",
            metrics.shed_total.clone(),
        );
        registry.register(
            "projection_webhook_connection_limit_hits",
            "Connections of the admission server that hit a limit, by limit: connections (the cap was reached; new ones waited in the listen queue), connections_per_peer and reserved_for_apiserver (closed at once), handshake_timeout, header_timeout, idle_timeout (closed)",
            metrics.connection_limit_hits_total.clone(),
        );
        registry.register_collector(Box::new(runtime::process_metrics::ProcessCollector::default()));
        metrics
    }

    /// Metrics that nobody scrapes (in-process tests, benchmarks).
    pub fn unregistered() -> Self {
        Self {
            requests_total: Family::default(),
            request_duration_seconds: Family::new_with_constructor(|| {
                // 250 µs to about 4 s.
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.00025, 2.0, 15,
                ))
            }),
            errors_total: Family::default(),
            serving_certificate: Default::default(),
            certificates_issued_total: Family::default(),
            self_managed_writes_total: Family::default(),
            access_review_cache_lookups_total: Family::default(),
            source_metadata_cache_lookups_total: Family::default(),
            shed_total: Family::default(),
            connection_limit_hits_total: Family::default(),
        }
    }
}

/// The prefix of the webhook's metrics (`projection_webhook_*`; the metrics endpoint's certificate,
/// served over HTTPS: `projection_webhook_metrics_certificate_*`).
pub const SERVICE: &str = "projection_webhook";

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/observability.md lists exactly what `/metrics` serves: its webhook table and the
    /// process metrics against the registry the webhook serves, once each family has a series. (A
    /// family registered without a line in the doc fails `shared/tests/observability_doc.rs` too.)
    #[test]
    fn the_documented_metrics_are_the_served_ones() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/observability.md"))
            .expect("docs/observability.md");
        // The metric tables of its sections, and the process metrics.
        let documented = runtime::metrics_doc::documented_with_process_names(&doc, &["Webhook"]);
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        // A labelled family is served once it has a series: one of each.
        let request = RequestLabels {
            endpoint: "validate",
            resource: "projections",
            operation: "CREATE",
            verdict: "allowed",
        };
        metrics.requests_total.get_or_create(&request).inc();
        metrics
            .request_duration_seconds
            .get_or_create(&request)
            .observe(0.001);
        metrics
            .errors_total
            .get_or_create(&CategoryLabels {
                category: "malformed",
            })
            .inc();
        metrics
            .serving_certificate
            .reloads_total
            .get_or_create(&ReloadLabels { result: "success" })
            .inc();
        // Served over HTTPS (--metrics-cert-file) only.
        let certificate = runtime::tls::CertMetrics::of_metrics_endpoint(&mut registry, SERVICE);
        certificate
            .reloads_total
            .get_or_create(&ReloadLabels { result: "success" })
            .inc();
        metrics
            .certificates_issued_total
            .get_or_create(&IssueLabels {
                certificate: "serving",
                reason: "missing",
            })
            .inc();
        metrics
            .self_managed_writes_total
            .get_or_create(&WriteLabels {
                target: "secret_create",
                result: "success",
            })
            .inc();
        for lookups in [
            &metrics.access_review_cache_lookups_total,
            &metrics.source_metadata_cache_lookups_total,
        ] {
            lookups.get_or_create(&CacheLabels { result: "hit" }).inc();
        }
        metrics
            .connection_limit_hits_total
            .get_or_create(&LimitLabels {
                limit: "idle_timeout",
            })
            .inc();
        metrics
            .shed_total
            .get_or_create(&EndpointLabels { endpoint: "validate" })
            .inc();
        let served = runtime::metrics_doc::served_names(&registry);
        runtime::metrics_doc::assert_same_names(&documented, &served, "webhook table");
    }
}
