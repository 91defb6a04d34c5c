//! The report step of a pass, the only place a pass publishes: its events, its status (server-side
//! apply, only when it changed), the reconcile counted and logged, and what the runtime does next.

use crate::{
    context::Report,
    error::{Error, api_error},
    metrics::{E2eLabels, ReconcileLabels},
    pass::kind::ProjectionKind,
    queue_metrics::queue_key,
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use shared::{
    api::{
        keys::FIELD_MANAGER,
        kind::CrView,
        reason::{Reason, Retry},
    },
    pass::{
        lifecycle::{
            SUSPENDED_MESSAGE, deletion_blocked_conditions, deletion_blocked_message, handled_request,
            suspended_conditions,
        },
        status::{PassEnd, Status, verdict},
        tally::Removal,
    },
};

/// Reports how a pass of `cr` ended: its events, its status (with the `requested` reconcile it
/// handled, and `Suspended` when `suspended`), the reconcile counted, and what next.
pub async fn report<K: ProjectionKind>(
    cr: &K,
    report: &Report,
    end: &PassEnd,
    (requested, suspended): (Option<&str>, bool),
) -> Result<Action, Error> {
    let view = cr.view();
    let events = match end {
        Ok(concluded) => concluded.events.clone(),
        Err(stop) => stop.events(),
    };
    report.events.publish_all(&cr.object_ref(&()), events).await;
    if let Ok(concluded) = end
        && concluded.tally.first_copy(view.ever_projected())
    {
        observe_first_copy(&view, report);
    }
    let current = Status::of(&view);
    let now = Time(Timestamp::now());
    let generation = view.meta.generation;
    let mut next = current.after(K::SCOPE, end, generation, &now);
    next.copy.last_handled_reconcile_at =
        handled_request(requested, current.copy.last_handled_reconcile_at.as_deref());
    if suspended {
        next.copy.conditions = suspended_conditions(&next.copy.conditions, generation, &now);
    }
    write_status(cr, report, &current, &next).await?;
    let (outcome, retry) = verdict(end);
    next_action(report, &view, (outcome.reason(), outcome.message()), retry)
}

/// While `spec.suspend` is true and nothing must be withdrawn, nothing is written or deleted: the
/// status keeps the last pass's conditions and counts, with `Suspended`.
pub async fn hold<K: ProjectionKind>(cr: &K, report: &Report) -> Result<Action, Error> {
    let view = cr.view();
    let current = Status::of(&view);
    let mut next = current.clone();
    let now = Time(Timestamp::now());
    next.copy.observed_generation = view.meta.generation;
    next.copy.conditions = suspended_conditions(&current.copy.conditions, view.meta.generation, &now);
    write_status(cr, report, &current, &next).await?;
    next_action(
        report,
        &view,
        (Reason::Suspended, SUSPENDED_MESSAGE),
        Retry::OnChange,
    )
}

/// Reports the withdrawal of the copies of a CR being deleted: its events, and when a copy is left
/// (`removal`), the deletion blocked, never silently: `Ready` and a Warning event say what blocks
/// it and how to release it; retried with backoff, since access given back to the controller
/// wakes no watch.
pub async fn withdrawn_for_deletion<K: ProjectionKind>(
    cr: &K,
    report: &Report,
    removal: Removal,
) -> Result<(), Error> {
    let about = cr.object_ref(&());
    report.events.publish_all(&about, removal.events.clone()).await;
    if removal.all_gone() {
        return Ok(());
    }
    let view = cr.view();
    let kubectl_name = match view.home() {
        Some(namespace) => format!(
            "{} {} -n {namespace}",
            K::SCOPE.kind().to_lowercase(),
            cr.name_any()
        ),
        None => format!("{} {}", K::SCOPE.kind().to_lowercase(), cr.name_any()),
    };
    let finalizers = view.meta.finalizers.clone().unwrap_or_default();
    let message =
        deletion_blocked_message(&kubectl_name, &finalizers, K::SCOPE.finalizer(), &removal.cause());
    report
        .events
        .publish(&about, Reason::DeletionBlocked, message.clone())
        .await;
    let current = Status::of(&view);
    let mut next = current.clone();
    next.copy.observed_generation = view.meta.generation;
    next.copy.conditions = deletion_blocked_conditions(
        &current.copy.conditions,
        &message,
        view.meta.generation,
        &Time(Timestamp::now()),
    );
    if let Err(e) = write_status(cr, report, &current, &next).await {
        tracing::warn!(error = %e, "could not report the blocked deletion in status");
    }
    Err(Error::Retry {
        reason: Reason::DeletionBlocked,
        message,
    })
}

/// Counts the reconcile of `cr`, logs it with its `reason` and message, and tells the runtime what
/// to do next.
fn next_action(
    report: &Report,
    cr: &CrView<'_>,
    (reason, message): (Reason, &str),
    retry: Retry,
) -> Result<Action, Error> {
    let kind = cr.scope.kind();
    let name = queue_key(cr.home(), cr.meta.name.as_deref().unwrap_or_default());
    let result = reason.category().as_str();
    report
        .metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels { kind, result })
        .inc();
    tracing::info!(kind, name, result, %reason, detail = message, "reconciled");
    match retry {
        Retry::OnChange => {
            report.backoff.reset(cr.uid());
            Ok(Action::await_change())
        }
        Retry::Backoff => Err(Error::Retry {
            reason,
            message: message.to_owned(),
        }),
    }
}

/// Observes the time from the creation of `cr` to its first copy.
fn observe_first_copy(cr: &CrView<'_>, report: &Report) {
    if let Some(created) = cr.meta.creation_timestamp.as_ref() {
        let seconds = Timestamp::now().duration_since(created.0).as_secs_f64();
        report
            .metrics
            .e2e_seconds
            .get_or_create(&E2eLabels {
                kind: cr.scope.kind(),
                event: "create",
            })
            .observe(seconds.max(0.0));
    }
}

/// Writes `next` as the status of `object` (server-side apply of the status only), unless it equals
/// both the status the object carries (`current`, from the reflector, which may lag) and the status
/// we last wrote to it.
async fn write_status<K: ProjectionKind>(
    object: &K,
    report: &Report,
    current: &Status,
    next: &Status,
) -> Result<(), Error> {
    let uid = object.uid().unwrap_or_default();
    let value = serde_json::to_value(next).unwrap_or_default();
    if next == current && report.statuses.matches(&uid, &value) {
        return Ok(());
    }
    let body =
        serde_json::json!({"apiVersion": "projection.sh/v1", "kind": K::SCOPE.kind(), "status": value});
    object
        .api(report.client.clone())
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error("writing status"))?;
    report.statuses.record(&uid, &value, std::time::Instant::now());
    Ok(())
}
