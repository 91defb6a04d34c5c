//! Helpers shared by the webhook's in-process tests (handler, server): the admission router over a
//! test's own view of the cluster, without a Kubernetes API behind it.
#![allow(dead_code)]

use shared::policy::projectable::SourceMode;
use std::sync::Arc;
use webhook::{
    cluster_view::ClusterView,
    handler::{App, BODY_TIMEOUT, InFlightLimit, router},
    metrics::Metrics,
    policy::PolicySettings,
    review::ReviewSettings,
};

/// The default review settings (allowlist, the requester's access to the source checked), with
/// tenant mode on or off: what most in-process tests review with.
pub fn default_settings(tenant_mode: bool) -> ReviewSettings {
    ReviewSettings {
        tenant_mode,
        policy: PolicySettings {
            source_mode: SourceMode::Allowlist,
            check_source_access: true,
            // In-process, the router is called without the server: as the apiserver would.
            caller_authenticated: true,
        },
        allowed_power_kinds: Default::default(),
    }
}

/// The admission router over `cluster` with `settings`, counting into `metrics`: the webhook as
/// the server runs it, minus the server.
pub fn admission_router<C: ClusterView>(
    cluster: C,
    settings: ReviewSettings,
    metrics: Arc<Metrics>,
) -> axum::Router {
    router(Arc::new(App {
        settings,
        cluster,
        metrics,
        in_flight: InFlightLimit::new(64),
        body_timeout: BODY_TIMEOUT,
    }))
}
