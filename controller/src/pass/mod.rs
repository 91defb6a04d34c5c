//! One pass for both kinds: read → plan → apply → report. The source is read and checked
//! (`read`), the pure `shared::pass::plan` decides what to write and remove, `apply` does it, and
//! `report` writes the status and tells the runtime what next. A Projection is a pass whose only
//! target is its own namespace; what else differs between the kinds is in `kind`.

pub mod apply;
pub mod kind;
pub mod read;
pub mod report;

use crate::cache::stored_cr::StoredCr;
use crate::{
    context::{Context, CopyCluster, Report},
    discovery::Discovery,
    error::Error,
    events::Events,
    index::ObjectKey,
    metrics::KindLabels,
    pass::{
        apply::{existing_copies, views, withdraw, write_all},
        kind::{KindStatus, ProjectionKind},
        read::{Problem, Source, forbidden_namespaces, forget_refused_grants, read},
        report::{conclude, conclude_suspended, observe_first_copy, write_status},
    },
    queue_metrics::{ReconcileEnd, queue_key},
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Resource, ResourceExt,
    api::ApiResource,
    runtime::{
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
    },
};
use shared::{
    api::{
        crd::{SourceRef, WrittenDestination},
        reason::Reason,
        source::GroupKind,
    },
    copy::content::BuiltContent,
    pass::{
        lifecycle::{
            Release, deletion_blocked_conditions, deletion_blocked_message, handled_request, is_suspended,
            on_cr_deletion, on_source_loss, requested_at, suspended_conditions, withdraws_while_suspended,
        },
        plan::{Cleaned, Concluded, PassInput, plan},
        status::{Failure, Reached, Stopped, StoppedAt},
    },
};
use std::{sync::Arc, time::Instant};

/// How a pass ended.
enum Ended {
    /// The plan was applied; `hash` is the source hash every copy carries.
    Applied { concluded: Box<Concluded>, hash: String },
    /// The pass stopped before writing.
    Stopped(Failure),
}

/// The reconcile proper: put the copies in place and report, one status built once, whichever step
/// the pass stopped at.
async fn apply<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Action, Error> {
    let status = cr.status();
    let suspended = is_suspended(cr.controls().suspend);
    // A suspended CR handles no reconcile request: it does on resume.
    let requested = requested_at(cr.meta().annotations.as_ref()).filter(|_| !suspended);
    let ended = if suspended {
        match withdraw_if_suspended_and_lost(cr, ctx, &status).await {
            Some(ended) => ended,
            None => return hold(cr, &ctx.report, &status).await,
        }
    } else {
        run(cr, ctx, &status, requested).await
    };
    let (outcome, retry, reached) = match &ended {
        Ended::Applied { concluded, hash } => (
            concluded.outcome.clone(),
            concluded.retry,
            Reached::Applied {
                record: &concluded.record,
                holding: concluded.holding,
                failures: &concluded.tally.failures,
                hash,
                applied_once: concluded.applied_once.as_ref(),
            },
        ),
        Ended::Stopped(failure) => (
            failure.outcome.clone(),
            failure.retry,
            Reached::Stopped {
                written: failure.written.as_ref(),
            },
        ),
    };
    let now = Time(Timestamp::now());
    let mut next = status.after(&outcome, reached, cr.meta().generation, &now);
    next.set_handled_request(handled_request(requested, status.handled_request()));
    if suspended {
        *next.conditions_mut() = suspended_conditions(next.conditions(), cr.meta().generation, &now);
    }
    write_status(cr, &ctx.report, &status, &next).await?;
    let name = queue_key(cr.meta().namespace.as_deref(), &cr.name_any());
    conclude(
        &ctx.report,
        K::KIND,
        (&name, &cr.uid().unwrap_or_default()),
        &outcome,
        retry,
    )
}

/// One pass: read the source and the targets, plan, build and write a copy per target namespace
/// (stamped with the `requested` reconcile, if any) while removing the copies no longer wanted,
/// and conclude. Every decision on the way is `shared`'s.
async fn run<K: ProjectionKind>(cr: &K, ctx: &Context, status: &K::Status, requested: Option<&str>) -> Ended {
    let read = match read(&ctx.sources, cr, status).await {
        Ok(read) => read,
        Err(problem) => {
            let stopped = withdraw_if_lost(ctx, cr, status, problem).await;
            return stop(&ctx.report.events, cr, stopped, status.recorded()).await;
        }
    };
    let recorded = status.recorded();
    let stopped = |reason: Reason, message: String| {
        let at = StoppedAt::Destination {
            resolved: read.resolved_message.clone(),
        };
        let stopped = Stopped { reason, message, at };
        stop(&ctx.report.events, cr, stopped, recorded)
    };
    let targets = match cr.targets(&ctx.namespaces).await {
        Ok(targets) => targets,
        Err(message) => {
            return stopped(Reason::TargetResolutionFailed, message).await;
        }
    };
    // Namespaces where the author may not create the kind get no copy, and lose the one they had;
    // they stay targets, counted as failed.
    let forbidden = forbidden_namespaces(&ctx.sources, &read, &targets.write).await;
    let owner = cr.owner();
    let copies = WrittenDestination::of(&read.resource, &cr.copy_name());
    let home = cr.home();
    let known: Vec<&str> = std::iter::once(copies.name.as_str())
        .chain(recorded.map(|r| r.name.as_str()))
        .collect();
    let cached = existing_copies(&read.copies, &owner, K::DESTINATIONS, home.as_deref(), &known);
    let existing = views(&cached);
    let input = PassInput {
        scope: K::DESTINATIONS,
        copies: &copies,
        recorded,
        targets: &targets,
        forbidden: &forbidden,
        existing: &existing,
        sync_policy: cr.controls().sync_policy,
        applied_once: status.applied_once(),
    };
    let plan = match plan(&input) {
        Ok(plan) => plan,
        Err(refused) => {
            return stopped(refused.reason, refused.message).await;
        }
    };
    // The content is the same in every namespace: built (and refused) once.
    let built = match build(&read, cr) {
        Ok(built) => built,
        Err((reason, message)) => return stopped(reason, message).await,
    };
    let (writes, cleaned) = futures::join!(
        write_all(&ctx.copies, &read, &built, &owner, &plan, requested),
        remove_unwanted((&ctx.copies, &ctx.report.events), cr, &read, &plan),
    );
    forget_refused_grants(&ctx.sources, &read, &writes);
    let from = format!("{}/{}", cr.source().namespace, cr.source().name);
    let concluded = plan.conclude(
        writes,
        cleaned,
        read.resolved_message.clone(),
        (&gvk_display(&read.resource), &from),
    );
    let waiting = concluded
        .waiting
        .iter()
        .map(|namespace| ObjectKey {
            group_kind: read.group_kind.clone(),
            namespace: namespace.clone(),
            name: copies.name.clone(),
        })
        .collect();
    ctx.watches.set_waiting(&cr.waker(), waiting);
    if concluded.tally.first_copy(status.ever_projected()) {
        observe_first_copy(cr, &ctx.report.metrics);
    }
    ctx.report
        .events
        .publish_all(&cr.object_ref(&()), concluded.events.clone())
        .await;
    Ended::Applied {
        concluded: Box::new(concluded),
        hash: built.hash().to_owned(),
    }
}

/// A source that cannot be projected: its copies are withdrawn (deleted or orphaned, as
/// `sourceDeletionPolicy` and the problem's reason decide) when the problem calls for it.
async fn withdraw_if_lost<K: ProjectionKind>(
    ctx: &Context,
    cr: &K,
    status: &K::Status,
    problem: Problem,
) -> Stopped {
    let withdrawn = match &problem {
        Problem::Withdraw { resource, reason, .. } => {
            let release = on_source_loss(cr.controls().source_deletion_policy, *reason);
            let current = (cr.source().group_kind(), resource.clone());
            withdraw(
                (&ctx.copies, &ctx.report.events),
                cr,
                status.recorded(),
                Some(current),
                release,
            )
            .await
            .is_ok()
        }
        Problem::Report { .. } => false,
    };
    problem.stopped(withdrawn)
}

/// Ends a pass that stopped: its reason published as a Warning event, and the failure its status
/// reports (`recorded`: the copies the status recorded before the pass).
async fn stop<K: ProjectionKind>(
    events: &Events,
    cr: &K,
    stopped: Stopped,
    recorded: Option<&WrittenDestination>,
) -> Ended {
    events
        .publish(&cr.object_ref(&()), stopped.reason, stopped.message.clone())
        .await;
    Ended::Stopped(stopped.failure(recorded.cloned()))
}

/// Builds the content of the copies of the source under the CR's rules; a spec that cannot make a
/// valid copy of this source is `DestinationInvalid`.
fn build<K: ProjectionKind>(read: &Source, cr: &K) -> Result<BuiltContent, (Reason, String)> {
    let source =
        serde_json::to_value(&read.object).map_err(|e| (Reason::DestinationCreateFailed, e.to_string()))?;
    BuiltContent::build(&source, &cr.rules()).map_err(|refused| (Reason::DestinationInvalid, refused.message))
}

/// Removes the copies the plan no longer wants, of the current kind and of an earlier one.
async fn remove_unwanted<K: ProjectionKind>(
    (cluster, events): (&CopyCluster, &Events),
    cr: &K,
    read: &Source,
    plan: &shared::pass::plan::Plan,
) -> Cleaned {
    let owner = cr.owner();
    let about = cr.object_ref(&());
    let kind = apply::KindCopies {
        group_kind: &read.group_kind,
        resource: &read.resource,
        store: Some(&read.copies),
    };
    let current = plan.remove.is_empty()
        || apply::remove(
            (cluster, events),
            (&owner, &about),
            kind,
            &plan.remove,
            Release::Delete,
        )
        .await
        .is_ok();
    let earlier = match &plan.earlier {
        None => true,
        Some(old) => withdraw((cluster, events), cr, Some(old), None, Release::Delete)
            .await
            .is_ok(),
    };
    Cleaned { current, earlier }
}

/// A suspended CR still reads its source and asks its author, since suspension stops updates but
/// never a withdrawal that consent or access requires (`withdraws_while_suspended`): the copies go
/// as they would unsuspended, and the pass ends there (`Some`). `None` when there is nothing to
/// withdraw: the CR is held.
async fn withdraw_if_suspended_and_lost<K: ProjectionKind>(
    cr: &K,
    ctx: &Context,
    status: &K::Status,
) -> Option<Ended> {
    let problem = match read(&ctx.sources, cr, status).await {
        Err(problem @ Problem::Withdraw { reason, .. }) if withdraws_while_suspended(reason) => problem,
        _ => return None,
    };
    let stopped = withdraw_if_lost(ctx, cr, status, problem).await;
    Some(stop(&ctx.report.events, cr, stopped, status.recorded()).await)
}

/// While `spec.suspend` is true and nothing must be withdrawn, nothing is written or deleted: the
/// status keeps the last pass's conditions and counts, with `Suspended`.
async fn hold<K: ProjectionKind>(cr: &K, report: &Report, current: &K::Status) -> Result<Action, Error> {
    let mut next = current.clone();
    let now = Time(Timestamp::now());
    *next.conditions_mut() = suspended_conditions(current.conditions(), cr.meta().generation, &now);
    write_status(cr, report, current, &next).await?;
    let uid = cr.uid().unwrap_or_default();
    let name = queue_key(cr.meta().namespace.as_deref(), &cr.name_any());
    Ok(conclude_suspended(report, K::KIND, (&name, &uid)))
}

/// Deletion of a CR: its copies go first, or are orphaned with `deletionPolicy: Orphan` (the
/// finalizer holds the CR until then; a suspended CR follows its policy too).
async fn cleanup<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Action, Error> {
    let current = resolved_kind(&ctx.sources.discovery, cr.source()).await;
    let release = on_cr_deletion(cr.controls().deletion_policy);
    let status = cr.status();
    if let Err(cause) = withdraw(
        (&ctx.copies, &ctx.report.events),
        cr,
        status.recorded(),
        current,
        release,
    )
    .await
    {
        return Err(block_deletion(cr, &ctx.report, &cause).await);
    }
    cr.forget(&ctx.watches, &ctx.namespaces);
    // The backoff is reset by `reconcile` once the finalizer is removed too.
    Ok(Action::await_change())
}

/// The finalizer holds a CR whose copies cannot be removed (`cause`): never silently. Its `Ready`
/// condition and a Warning event say what blocks the deletion and how to release it; retried with
/// backoff, since access given back to the controller wakes no watch.
async fn block_deletion<K: ProjectionKind>(cr: &K, report: &Report, cause: &str) -> Error {
    let kubectl_name = match cr.meta().namespace.as_deref() {
        Some(namespace) => format!("{} {} -n {namespace}", K::KIND.to_lowercase(), cr.name_any()),
        None => format!("{} {}", K::KIND.to_lowercase(), cr.name_any()),
    };
    let finalizers = cr.meta().finalizers.clone().unwrap_or_default();
    let message = deletion_blocked_message(&kubectl_name, &finalizers, K::FINALIZER, cause);
    report
        .events
        .publish(&cr.object_ref(&()), Reason::DeletionBlocked, message.clone())
        .await;
    let current = cr.status();
    let mut next = current.clone();
    *next.conditions_mut() = deletion_blocked_conditions(
        current.conditions(),
        &message,
        cr.meta().generation,
        &Time(Timestamp::now()),
    );
    if let Err(e) = write_status(cr, report, &current, &next).await {
        tracing::warn!(error = %e, "could not report the blocked deletion in status");
    }
    Error::Retry {
        reason: Reason::DeletionBlocked,
        message,
    }
}

/// Reconciles one CR (the entry point handed to the kube controller runtime): decoded back from
/// the store's compact form, then the finalizer decides between applying and cleaning up.
pub async fn reconcile<K: ProjectionKind>(
    stored: Arc<StoredCr<K>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let object = Arc::new(stored.expand().map_err(Error::Cache)?);
    let started = Instant::now();
    let queue = K::queue(&ctx.report.metrics.queue);
    queue.started(&queue_key(object.meta().namespace.as_deref(), &object.name_any()));
    let api = object.api(ctx.report.client.clone());
    let deleting = object.meta().deletion_timestamp.is_some();
    let uid = object.uid().unwrap_or_default();
    let result = finalizer(&api, K::FINALIZER, object, |event| async {
        match event {
            Finalizer::Apply(o) => apply(o.as_ref(), &ctx).await,
            Finalizer::Cleanup(o) => cleanup(o.as_ref(), &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if deleting && result.is_ok() {
        ctx.report.statuses.forget(&uid);
        // The copies are gone and so is the finalizer: nothing of this CR is left to retry. Reset
        // only now, not in `cleanup`: when removing the finalizer fails (e.g. an admission webhook
        // is down), the retries must keep backing off.
        ctx.report.backoff.reset(&uid);
    }
    ctx.report
        .metrics
        .reconcile_duration_seconds
        .get_or_create(&KindLabels { kind: K::KIND })
        .observe(started.elapsed().as_secs_f64());
    queue.finished(
        started,
        match &result {
            Err(_) => ReconcileEnd::Error,
            Ok(action) if *action == Action::await_change() => ReconcileEnd::Success,
            Ok(_) => ReconcileEnd::RequeueAfter,
        },
    );
    result
}

/// Decides when to retry after an error (capped exponential backoff per object).
pub fn error_policy<K: ProjectionKind>(object: Arc<StoredCr<K>>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = match object.meta().namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    };
    backoff_after(
        &ctx.report,
        K::KIND,
        &object.uid().unwrap_or_default(),
        &name,
        error,
    )
}

/// Decides when to retry after an error (capped exponential backoff per object).
fn backoff_after(report: &Report, kind: &'static str, uid: &str, name: &str, error: &Error) -> Action {
    report
        .metrics
        .reconcile_errors_total
        .get_or_create(&crate::metrics::ErrorLabels {
            kind,
            category: error.category(),
        })
        .inc();
    // The first failure of a streak is a warning; its retries are not (one WARN per CR that starts
    // failing, not one per retry).
    let first = !report.backoff.is_failing(uid);
    let delay = report.backoff.next_delay(uid, report.requeue_cap);
    if first {
        tracing::warn!(kind, name, error = %error, retry_in = ?delay, "reconcile failed");
    } else {
        tracing::info!(kind, name, error = %error, retry_in = ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

/// Drops what is kept about a CR the watch reports deleted, whichever way it went: the finalizer
/// path forgets it too, but a CR whose finalizer was removed by hand (or whose last reconcile never
/// ran) would otherwise leave its entries in the per-CR maps for the life of the process.
pub fn forget_deleted<K: ProjectionKind>(ctx: &Context, stored: &StoredCr<K>) {
    let uid = stored.meta().uid.as_deref().unwrap_or_default();
    ctx.report.statuses.forget(uid);
    ctx.report.backoff.reset(uid);
    if let Ok(cr) = stored.expand() {
        cr.forget(&ctx.watches, &ctx.namespaces);
    }
}
/// The kind of a CR's source as it resolves now, so a cleanup removes the copies of that kind too
/// (`None` when it no longer resolves: then only the recorded copies go).
pub async fn resolved_kind(discovery: &Discovery, source: &SourceRef) -> Option<(GroupKind, ApiResource)> {
    let resolved = discovery.resolve(source).await.ok()?;
    Some((source.group_kind(), resolved.resource))
}

/// `<group>/<version>, Kind=<Kind>` as the Go operator prints a GVK (`/v1, Kind=ConfigMap`).
pub fn gvk_display(resource: &ApiResource) -> String {
    format!("{}/{}, Kind={}", resource.group, resource.version, resource.kind)
}
