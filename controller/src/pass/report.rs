//! The report step of a pass: the status written (server-side apply, only when it changed), the
//! reconcile counted and logged, and what the runtime does next.

use crate::{
    context::Report,
    error::{Error, api_error},
    metrics::{E2eLabels, Metrics, ReconcileLabels},
    pass::kind::ProjectionKind,
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use serde::Serialize;
use shared::{
    api::{
        keys::FIELD_MANAGER,
        reason::{Reason, Retry},
    },
    pass::status::Outcome,
};

/// Counts the reconcile and tells the runtime what to do next.
pub fn conclude(
    report: &Report,
    kind: &'static str,
    object: (&str, &str),
    outcome: &Outcome,
    retry: Retry,
) -> Result<Action, Error> {
    let (name, uid) = object;
    let result = outcome.category().as_str();
    report
        .metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(
        kind,
        name,
        result,
        reason = %outcome.reason(),
        detail = outcome.message(),
        "reconciled"
    );
    match retry {
        Retry::OnChange => {
            report.backoff.reset(uid);
            Ok(Action::await_change())
        }
        Retry::Backoff => Err(Error::Retry {
            reason: outcome.reason(),
            message: outcome.message().to_owned(),
        }),
    }
}

/// Counts and logs a pass of a suspended CR, which wrote nothing; only a change of the CR wakes it.
pub fn conclude_suspended(report: &Report, kind: &'static str, object: (&str, &str)) -> Action {
    let (name, uid) = object;
    let reason = Reason::Suspended;
    let result = reason.category().as_str();
    report
        .metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(kind, name, result, %reason, detail = shared::pass::lifecycle::SUSPENDED_MESSAGE, "reconciled");
    report.backoff.reset(uid);
    Action::await_change()
}

/// Observes the time from the creation of `cr` to its first copy.
pub fn observe_first_copy<K: ProjectionKind>(cr: &K, metrics: &Metrics) {
    if let Some(created) = cr.meta().creation_timestamp.as_ref() {
        let seconds = Timestamp::now().duration_since(created.0).as_secs_f64();
        metrics
            .e2e_seconds
            .get_or_create(&E2eLabels {
                kind: K::KIND,
                event: "create",
            })
            .observe(seconds.max(0.0));
    }
}

/// Writes `next` as the status of `object` (server-side apply of the status only), unless it equals
/// both the status the object carries (`current`, from the reflector, which may lag) and the status
/// we last wrote to it.
pub async fn write_status<K: ProjectionKind, S: Serialize + PartialEq>(
    object: &K,
    report: &Report,
    current: &S,
    next: &S,
) -> Result<(), Error> {
    let uid = object.uid().unwrap_or_default();
    let value = serde_json::to_value(next).unwrap_or_default();
    if next == current && report.statuses.matches(&uid, &value) {
        return Ok(());
    }
    let body = serde_json::json!({"apiVersion": "projection.sh/v1", "kind": K::KIND, "status": value});
    object
        .api(report.client.clone())
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error("writing status"))?;
    report.statuses.record(&uid, &value);
    Ok(())
}
