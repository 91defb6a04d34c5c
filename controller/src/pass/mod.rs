//! One pass for both kinds: read → plan → apply → report. The source is read and checked
//! (`read`), the pure `shared::pass::plan` decides what to write and remove, `apply` does it, and
//! `report` writes the status and tells the runtime what next. A Projection is a pass whose only
//! target is its own namespace; what else differs between the kinds is in `kind`.

pub mod apply;
pub mod interest;
pub mod kind;
pub mod read;
pub mod report;

use crate::{
    cache::stored_cr::StoredCr,
    context::{Context, CopyCluster, Destination, Report},
    discovery::Discovery,
    error::Error,
    index::CrRef,
    metrics::KindLabels,
    pass::{
        apply::{existing_copies, views, withdraw, write_all},
        interest::{Rule, register_inputs, register_waits},
        kind::ProjectionKind,
        read::{Source, forbidden_namespaces, forget_refused_grants, targets},
    },
    queue_metrics::{ReconcileEnd, queue_key},
};
use kube::{
    Resource, ResourceExt,
    api::ApiResource,
    runtime::{
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
        reflector::ObjectRef,
    },
};
use shared::{
    api::{
        crd::{CopyStatus, SourceRef, WrittenDestination},
        kind::{CrName, CrView},
        reason::Reason,
        source::GroupKind,
    },
    copy::{
        content::{BuiltContent, CopyRules},
        ownership::Owner,
    },
    pass::{
        interest::{Interest, Reached},
        lifecycle::{
            Release, is_suspended, on_cr_deletion, on_source_loss, requested_at, withdraws_while_suspended,
        },
        plan::{PassInput, Plan, plan},
        status::{PassEnd, Status, Stop},
        tally::Removal,
    },
    policy::kubeconfig::KubeconfigSecret,
};
use std::{sync::Arc, time::Instant};

/// The reconcile proper: put the copies in place and report, one status built once, whichever step
/// the pass stopped at.
async fn apply<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Action, Error> {
    let view = cr.view();
    let suspended = is_suspended(view.controls.suspend);
    // A suspended CR handles no reconcile request: it does on resume.
    let requested = requested_at(view.meta.annotations.as_ref()).filter(|_| !suspended);
    let end = if suspended {
        match withdraw_if_suspended_and_lost(&view, ctx).await {
            Some(stop) => Err(stop),
            None => return report::hold(cr, &ctx.report).await,
        }
    } else {
        run(&view, ctx, requested).await
    };
    report::report(cr, &ctx.report, &end, (requested, suspended)).await
}

/// One pass: read the source and the targets, plan, build and write a copy per target namespace
/// (stamped with the `requested` reconcile, if any) while removing the copies no longer wanted,
/// and conclude. Every decision on the way is `shared`'s.
async fn run(cr: &CrView<'_>, ctx: &Context, requested: Option<&str>) -> PassEnd {
    let (read, rule, destination) = match read_source(cr, ctx).await {
        Ok(read) => read,
        Err(stop) => return Err(withdraw_if_lost(ctx, cr, stop).await),
    };
    let copies_at = &destination.copies;
    let resolved = read.resolved_message.as_str();
    let stopped = |reason: Reason, message: String| Stop::Destination {
        reason,
        message,
        resolved: resolved.to_owned(),
    };
    let targets = targets(destination.namespaces.as_deref(), cr, rule, copies_at.is_remote())
        .await
        .map_err(|message| stopped(Reason::TargetResolutionFailed, message))?;
    // Namespaces where the author may not create the kind get no copy, and lose the one they had;
    // they stay targets, counted as failed.
    let forbidden = forbidden_namespaces(&ctx.sources, &read, &targets.write).await;
    let owner = copies_at.owner_of(cr);
    let copies = WrittenDestination::of(&read.resource, cr.copy_name)
        .in_cluster(destination.cluster.clone(), destination.cluster_identity.clone());
    let known: Vec<&str> = std::iter::once(copies.name.as_str())
        .chain(cr.recorded().map(|r| r.name.as_str()))
        .collect();
    let cached = existing_copies(&read.copies, &owner, cr.scope, cr.home(), &known);
    let existing = views(&cached);
    let input = PassInput::of(cr, (resolved, &copies), &targets, &forbidden, &existing);
    let plan = plan(&input)?;
    // The content is the same in every namespace: built (and refused) once.
    let built = build(&read, cr).map_err(|(reason, message)| stopped(reason, message))?;
    let (writes, removed) = futures::join!(
        write_all(copies_at, &read, &owner, &plan, (&built, requested)),
        remove_unwanted(copies_at, (cr, &owner), &read, &plan),
    );
    forget_refused_grants(&ctx.sources, &read, &writes);
    let from = format!("{}/{}", cr.source.namespace, cr.source.name);
    let concluded = plan.conclude(
        writes,
        removed,
        built.hash().to_owned(),
        (&gvk_display(&read.resource), &from),
    );
    if copies_at.is_remote() {
        return Ok(concluded.where_strangers_are_unwatched());
    }
    register_waits(&ctx.watches, cr, (&read.group_kind, &copies.name), &concluded);
    Ok(concluded)
}

/// The read step: resolves the kind and asks the author (`read::check`), opens the cluster the
/// copies go to, registers what wakes the CR (the one place a pass does, before anything is read),
/// then reads the source (`read::fetch`). Hands back the source, the target rule registered and
/// where the copies go.
async fn read_source(cr: &CrView<'_>, ctx: &Context) -> Result<(Source, Rule, Destination), Stop> {
    let secret = KubeconfigSecret::of(cr, ctx.remotes.controller_namespace());
    let opened = match read::check(&ctx.sources, cr, secret.as_ref()).await {
        Ok(checked) => {
            let destination = ctx
                .destination(cr)
                .await
                .map_err(|(reason, message)| Stop::Destination {
                    reason,
                    message,
                    resolved: checked.resolved_message().to_owned(),
                });
            Ok((checked, destination))
        }
        Err(refused) => Err(refused),
    };
    let reached = match &opened {
        Err((_, reached)) => *reached,
        Ok((_, Err(_))) => Reached::DestinationUnusable,
        Ok((_, Ok(_))) => Reached::Readable,
    };
    let namespaces = match &opened {
        Ok((_, Ok(destination))) => destination.namespaces.as_deref(),
        _ => None,
    };
    let rule = register_inputs((&ctx.watches, namespaces), cr, Interest::of(cr, reached));
    let (checked, destination) = opened.map_err(|(stop, _)| stop)?;
    let destination = destination?;
    let source = read::fetch(&ctx.sources, cr, checked, &destination.copies).await?;
    Ok((source, rule, destination))
}

/// A pass stopped at its source: when the stop withdraws the copies, they are released (deleted or
/// orphaned, as `sourceDeletionPolicy` and the reason decide) from the cluster they are in, and the
/// stop carries what that did.
async fn withdraw_if_lost(ctx: &Context, cr: &CrView<'_>, mut stop: Stop) -> Stop {
    if let Stop::Withdraw {
        reason,
        resource,
        removal,
        ..
    } = &mut stop
    {
        let release = on_source_loss(cr.controls.source_deletion_policy, *reason);
        let current = (cr.source.group_kind(), (**resource).clone());
        *removal = Some(match ctx.destination(cr).await {
            Ok(destination) => {
                withdraw(&destination.copies, cr, (cr.recorded(), Some(current)), release).await
            }
            Err((_, message)) => Removal {
                events: Vec::new(),
                left: vec![message],
            },
        });
    }
    stop
}

/// Builds the content of the copies of the source under the CR's rules; a spec that cannot make a
/// valid copy of this source is `DestinationInvalid`.
fn build(read: &Source, cr: &CrView<'_>) -> Result<BuiltContent, (Reason, String)> {
    let source =
        serde_json::to_value(&read.object).map_err(|e| (Reason::DestinationCreateFailed, e.to_string()))?;
    BuiltContent::build(&source, &CopyRules::of(cr.controls))
        .map_err(|refused| (Reason::DestinationInvalid, refused.message))
}

/// Removes the copies the plan no longer wants: of the current kind, and of an earlier one.
async fn remove_unwanted(
    cluster: &CopyCluster,
    (cr, owner): (&CrView<'_>, &Owner),
    read: &Source,
    plan: &Plan,
) -> (Removal, Removal) {
    let kind = (&read.group_kind, &read.resource, Some(&read.copies));
    let current = async {
        if plan.remove.is_empty() {
            return Removal::default();
        }
        apply::remove(cluster, owner, kind, &plan.remove, Release::Delete).await
    };
    let earlier = async {
        match &plan.earlier {
            None => Removal::default(),
            Some(old) => withdraw(cluster, cr, (Some(old), None), Release::Delete).await,
        }
    };
    futures::join!(current, earlier)
}

/// A suspended CR still reads its source and asks its author, since suspension stops updates but
/// never a withdrawal that consent or access requires (`withdraws_while_suspended`): the copies go
/// as they would unsuspended, and the pass ends there (`Some`). `None` when there is nothing to
/// withdraw: the CR is held.
async fn withdraw_if_suspended_and_lost(cr: &CrView<'_>, ctx: &Context) -> Option<Stop> {
    let stop = match read_source(cr, ctx).await {
        Err(stop @ Stop::Withdraw { .. }) if withdraws_while_suspended(stop.reason()) => stop,
        _ => return None,
    };
    Some(withdraw_if_lost(ctx, cr, stop).await)
}

/// How long the deletion of a CR that never recorded a copy in another cluster waits for that
/// cluster to answer before it lets the CR go.
const UNRECORDED_SWEEP_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// When a pass whose finalizer patch found the cached CR behind the server's runs again at the
/// latest (the CR's watch event, on its way, usually runs it sooner).
const CACHE_BEHIND_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Deletion of a CR: its copies go first, or are orphaned with `deletionPolicy: Orphan` (the
/// finalizer holds the CR until then; a suspended CR follows its policy too), in the cluster they
/// are in: one that cannot be reached holds the CR too.
async fn cleanup<K: ProjectionKind>(cr: &K, ctx: &Context) -> Result<Action, Error> {
    let view = cr.view();
    let current = resolved_kind(&ctx.sources.discovery, view.source).await;
    let release = on_cr_deletion(view.controls.deletion_policy);
    // In another cluster where no pass ever recorded a copy (never written, or written just before
    // the CR went, its status not recorded yet), the copies of the current kind are still swept
    // where the cluster answers at once; one that does not holds nothing up, since nothing proves
    // a copy is there.
    let never_recorded = view.cluster.is_some() && view.recorded().is_none();
    let destination = if never_recorded {
        let answering = async {
            let destination = ctx.destination(&view).await.ok()?;
            destination.copies.client.apiserver_version().await.ok()?;
            Some(Ok(destination))
        };
        tokio::time::timeout(UNRECORDED_SWEEP_WITHIN, answering)
            .await
            .ok()
            .flatten()
    } else {
        Some(ctx.destination(&view).await)
    };
    let removal = match destination {
        Some(Ok(destination)) => {
            withdraw(&destination.copies, &view, (view.recorded(), current), release).await
        }
        None => Removal::default(),
        Some(Err((_, message))) => Removal {
            events: Vec::new(),
            left: vec![message],
        },
    };
    report::withdrawn_for_deletion(cr, &ctx.report, removal).await?;
    forget(&view.name(), ctx);
    // The backoff is reset by `reconcile` once the finalizer is removed too.
    Ok(Action::await_change())
}

/// Drops what the indexes keep about the CR `name`, once its copies are gone, and the other
/// cluster it wrote into when no other CR writes there.
fn forget(name: &CrName, ctx: &Context) {
    if let CrName::ClusterProjection { name } = name {
        ctx.namespaces.forget(&ObjectRef::new(name));
    }
    ctx.watches.forget(&CrRef::named(name));
    ctx.remotes.forget(name);
}

/// Reconciles one CR (the entry point handed to the kube controller runtime): decoded back from
/// the store's compact form, then the finalizer decides between applying and cleaning up.
pub async fn reconcile<K: ProjectionKind>(
    stored: Arc<StoredCr<K>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    // With shards, only the replica the ring gives this CR to runs its pass; the others skip it,
    // and a change of the membership sends it again to whoever may run it then.
    let mut running = match &ctx.shard {
        Some(shard) => match shard.begin(stored.meta().uid.as_deref().unwrap_or_default()) {
            Some(running) => Some(running),
            None => {
                let key = queue_key(stored.meta().namespace.as_deref(), &stored.name_any());
                ctx.report.metrics.queue.of(K::SCOPE).dropped(&key);
                return Ok(Action::await_change());
            }
        },
        None => None,
    };
    ctx.passes_begun.send_modify(|begun| *begun += 1);
    let object = Arc::new(stored.expand().map_err(Error::Cache)?);
    let started = Instant::now();
    let queue = ctx.report.metrics.queue.of(K::SCOPE);
    let key = queue_key(object.meta().namespace.as_deref(), &object.name_any());
    queue.started(&key, started);
    // A pass never runs on a copy of the CR older than this replica's own last status write: the
    // status is its memory, and the CR's watch event can come after a source's that queued it.
    if let Some(wait) = ctx.report.statuses.behind(
        &object.uid().unwrap_or_default(),
        || Status::of(&object.view()),
        started,
    ) {
        tracing::debug!(kind = K::SCOPE.kind(), name = %key, ?wait, "the cached CR is behind our status write; run again");
        queue.finished(started, ReconcileEnd::RequeueAfter);
        return Ok(Action::requeue(wait));
    }
    let api = object.api(ctx.report.client.clone());
    let deleting = object.meta().deletion_timestamp.is_some();
    let uid = object.uid().unwrap_or_default();
    let about = object.object_ref(&());
    // A CR no replica reported on yet (created as the ring changed) is new here, not taken over.
    let reported_before = object.view().status.is_some_and(CopyStatus::ever_reported);
    let pass = finalizer(&api, K::SCOPE.finalizer(), object, |event| async {
        match event {
            Finalizer::Apply(o) => apply(o.as_ref(), &ctx).await,
            Finalizer::Cleanup(o) => cleanup(o.as_ref(), &ctx).await,
        }
    });
    // With shards, the pass runs within the fence: cut short (unreported, to be run anew by the CR's
    // owner) where this replica's Lease lapses.
    // The first pass of a CR the ring moved here tells who reconciles it now, once it has ended.
    let ended = match ctx.shard.as_deref() {
        Some(shard) => match shard.within_fence(pass, (&uid, &key)).await {
            Some(ended) => {
                let takeover = running.as_mut().and_then(|r| r.takeover.take());
                if let Some(takeover) = takeover.filter(|_| reported_before) {
                    shard.took_over(takeover, &about, &ctx.report.events).await;
                }
                ended
            }
            None => Ok(Action::await_change()),
        },
        None => pass.await,
    };
    let cache_behind = matches!(&ended, Err(e) if crate::error::cache_was_behind(e));
    let result = match ended {
        // Not a failure (no error counted, no warning): the watch event of the finalizer already
        // added runs the pass anew at once; the requeue is there should that event be lost.
        Err(_) if cache_behind => {
            tracing::debug!(kind = K::SCOPE.kind(), name = %key, "the cached CR was behind the server's; run again");
            Ok(Action::requeue(CACHE_BEHIND_RETRY))
        }
        ended => ended.map_err(|e| Error::Finalizer(Box::new(e))),
    };
    if deleting && result.is_ok() && !cache_behind {
        ctx.report.statuses.forget(&uid);
        // The copies are gone and so is the finalizer: nothing of this CR is left to retry. Reset
        // only now, not in `cleanup`: when removing the finalizer fails (e.g. an admission webhook
        // is down), the retries must keep backing off.
        ctx.report.backoff.reset(&uid);
    }
    ctx.report
        .metrics
        .reconcile_duration_seconds
        .get_or_create(&KindLabels {
            kind: K::SCOPE.kind(),
        })
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
        K::SCOPE.kind(),
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
    if let Ok(cr) = stored.expand() {
        forget_reconciled(ctx, uid, &cr.view().name());
    } else {
        ctx.report.statuses.forget(uid);
        ctx.report.backoff.reset(uid);
    }
}

/// Drops what is kept about a CR this replica no longer reconciles (deleted, or, with shards, given
/// to another replica): its status record, its backoff, its part in the indexes (the watches of a
/// kind no other CR here reads stop) and the other cluster it wrote into when no other CR here does.
/// Its copies are left as they are: they are the CR's, which another replica reconciles now.
pub fn forget_reconciled(ctx: &Context, uid: &str, name: &CrName) {
    ctx.report.statuses.forget(uid);
    ctx.report.backoff.reset(uid);
    forget(name, ctx);
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
