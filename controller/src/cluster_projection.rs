//! The `ClusterProjection` reconciler: read the source (see `reconcile`), resolve the target
//! namespaces, write one copy per namespace in parallel (with a cap) while removing the copies no
//! longer wanted, report counts and per-namespace failures.
//!
//! Every pass compares all targets, but against the cache of our copies: an unchanged copy costs no
//! request, so a namespace event or a source edit writes exactly the copies that differ.

use crate::{
    content::build_or_report,
    context::Context,
    error::Error,
    index::{CrRef, ObjectKey},
    reconcile::{
        ProjectionKind, Source, conclude, forbidden_namespaces, gvk_display, hold_if_suspended,
        observe_first_copy, read_or_withdraw, spec_fields, written_destination,
    },
    watches::Tier,
    writer::{
        Existing, Removed, WriteError, Written, recorded_resource, release_copy, release_known, write_copy,
    },
};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{controller::Action, reflector::ObjectRef},
};
use shared::{
    apply_once,
    cached_copy::CachedCopy,
    copy::{BuiltContent, CopyRules},
    crd::{AppliedOnce, ClusterProjection, ClusterProjectionStatus, WrittenDestination},
    destination::Target,
    fan_out::{CopyFailure, CopyWrite, EventNote, Tally, name_first, pass_events, verdict},
    keys::CLUSTER_PROJECTION_FINALIZER,
    lifecycle::{Release, handled_request, requested_at, stamp_request},
    ownership::Owner,
    reason::{Reason, Retry},
    source::GroupKind,
    status::{ClusterPass, Failure, Outcome, cluster_status, destination_failure},
    targets::TargetRule,
    unwanted::{earlier_kind, is_unwanted},
};
use std::{collections::BTreeSet, sync::Arc};

const KIND: &str = "ClusterProjection";

impl ProjectionKind for ClusterProjection {
    const KIND: &'static str = KIND;
    const FINALIZER: &'static str = CLUSTER_PROJECTION_FINALIZER;
    const TIER: Tier = Tier::Cluster;
    type Status = ClusterProjectionStatus;

    spec_fields!();

    fn waker(&self) -> CrRef {
        // The name only, as `Projection::waker`.
        CrRef::Cluster(ObjectRef::new(&self.name_any()))
    }

    fn owner(&self) -> Owner {
        Owner::ClusterProjection {
            name: self.name_any(),
            uid: self.uid().unwrap_or_default(),
        }
    }

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::all(client)
    }

    fn runtime_metrics(
        metrics: &crate::runtime_metrics::RuntimeMetrics,
    ) -> &crate::runtime_metrics::ControllerMetrics {
        &metrics.cluster
    }

    fn forget(&self, ctx: &Context) {
        ctx.namespaces.forget(&ObjectRef::from_obj(self));
        ctx.watches.forget(&self.waker());
    }
}

fn destination_name(cp: &ClusterProjection) -> String {
    cp.spec
        .destination
        .name
        .clone()
        .unwrap_or_else(|| cp.spec.source.name.clone())
}

/// Puts the copies in place and reports: one status, built once, whichever step the pass stopped at.
async fn apply(cp: &ClusterProjection, ctx: &Context) -> Result<Action, Error> {
    let current = cp.status.clone().unwrap_or_default();
    let object = (cp.name_any(), cp.uid().unwrap_or_default());
    if let Some(held) = hold_if_suspended(cp, ctx).await? {
        return Ok(held);
    }
    let requested = requested_at(cp.meta().annotations.as_ref());
    let pass = fan_out(cp, ctx, &current, requested).await;
    let built_hash = pass.as_ref().ok().map(|done| done.hash.clone());
    let (outcome, retry, reached) = match &pass {
        Ok(done) => (
            done.outcome.clone(),
            done.retry,
            ClusterPass::FannedOut {
                written: &done.written,
                targets: done.targets,
                failures: &done.tally.failures,
            },
        ),
        Err(failure) => (
            failure.outcome.clone(),
            failure.retry,
            ClusterPass::Stopped {
                written: failure.written.as_ref(),
            },
        ),
    };
    let mut next = cluster_status(
        &current,
        &outcome,
        reached,
        cp.meta().generation,
        &Time(Timestamp::now()),
    );
    next.last_handled_reconcile_at = handled_request(requested, current.last_handled_reconcile_at.as_deref());
    if built_hash.is_some() {
        next.source_hash = built_hash;
    }
    if let Ok(done) = &pass {
        next.applied_once = done.applied_once.clone();
    }
    crate::reconcile::write_status(cp, ctx, &current, &next).await?;
    conclude(ctx, KIND, (&object.0, &object.1), &outcome, retry)
}

/// A pass that reached the fan-out.
struct FannedOut {
    written: WrittenDestination,
    targets: usize,
    tally: Tally,
    outcome: Outcome,
    retry: Retry,
    /// The source hash every copy of this pass carries.
    hash: String,
    /// With `syncPolicy: ApplyOnce`, the record of where the copies were created.
    applied_once: Option<AppliedOnce>,
}

/// One pass: read the source and the targets, build and write a copy per target namespace (stamped
/// with the `requested` reconcile, if any), remove the copies no longer wanted, report. Every
/// decision on the way is `shared`'s.
async fn fan_out(
    cp: &ClusterProjection,
    ctx: &Context,
    current: &ClusterProjectionStatus,
    requested: Option<&str>,
) -> Result<FannedOut, Failure> {
    let cp_ref = ObjectRef::from_obj(cp);
    let owner = cp.owner();
    let about = cp.object_ref(&());
    let source = &cp.spec.source;
    let recorded = current.written_destination.clone();
    let ever_projected = current.destination_name.is_some() || recorded.is_some();

    // Read: the source, then the target namespaces.
    let read = read_or_withdraw(ctx, cp, recorded.as_ref(), ever_projected).await?;
    let resolved = read.resolved_message.clone();
    let failed = |reason, message| destination_failure(&resolved, reason, message, recorded.clone());
    let rule = match TargetRule::of(&cp.spec.destination) {
        Ok(rule) => Arc::new(rule),
        Err(e) => {
            ctx.namespaces.forget(&cp_ref);
            ctx.events
                .publish(&about, Reason::TargetResolutionFailed, e.0.clone())
                .await;
            return Err(failed(Reason::TargetResolutionFailed, e.0));
        }
    };
    ctx.namespaces.set_rule(&cp_ref, rule.clone());
    ctx.namespaces.synced().await;
    let name = destination_name(cp);
    let targets = ctx.namespaces.resolve(&rule, source, &name);
    // Namespaces where the author may not create the kind get no copy, and lose the one they had;
    // they stay targets, counted as failed.
    let forbidden = forbidden_namespaces(ctx, &read, &targets.write).await;
    let is_forbidden = |n: &String| forbidden.iter().any(|(f, _)| f == n);
    let allowed: Vec<String> = targets
        .write
        .iter()
        .filter(|n| !is_forbidden(n))
        .cloned()
        .collect();

    // Build and write, and remove the copies no longer wanted.
    // The content is the same in every namespace: built (and refused) once.
    let rules = CopyRules::of_cluster_projection(&cp.spec);
    let built = build_or_report(ctx, &about, &read.object, &rules, failed).await?;
    let written = written_destination(&read.resource, &name);
    // ApplyOnce: only namespaces without a recorded copy are written, and existing copies are kept.
    let once = apply_once::is_apply_once(cp.spec.controls.sync_policy);
    let record = apply_once::recorded(current.applied_once.as_ref(), &written);
    let exist = read
        .copies
        .all()
        .iter()
        .filter(|c| c.is_owned_by(&owner) && c.name() == name)
        .map(|c| c.namespace().to_owned())
        .collect();
    let plan = apply_once::plan(&allowed, &record, &exist);
    let (to_write, existing) = if once {
        (&plan.create, Existing::Keep)
    } else {
        (&allowed, Existing::Update)
    };
    let copies = Copies {
        name: &name,
        requested,
        existing,
    };
    // The copies no longer wanted go at the same time: a namespace that lost its label need not
    // wait for the comparison of every other target.
    let earlier = earlier_kind(recorded.as_ref(), &written);
    let mut keep = targets.keep();
    keep.retain(|n| !is_forbidden(n));
    let (writes, cleaned) = futures::join!(
        write_all(ctx, &read, &built, &owner, to_write, copies),
        remove_unwanted(cp, ctx, &read, &keep, &name, earlier),
    );
    let mut tally = Tally::of(writes);
    tally
        .failures
        .extend(forbidden.into_iter().map(|(namespace, message)| CopyFailure {
            namespace,
            reason: Reason::DestinationForbidden,
            message,
        }));
    let waiting = tally
        .conflicts()
        .map(|namespace| ObjectKey {
            group_kind: read.group_kind.clone(),
            namespace: namespace.to_owned(),
            name: name.clone(),
        })
        .collect();
    ctx.watches.set_waiting(&cp.waker(), waiting);

    // Report.
    if tally.first_copy(current.destination_name.is_some()) {
        observe_first_copy(cp, ctx);
    }
    let from = format!("{}/{}", source.namespace, source.name);
    let events = pass_events(&tally, &gvk_display(&read.resource), &from, &name);
    ctx.events.publish_all(&about, events).await;
    let (outcome, retry) = verdict(resolved, &targets, &tally, cleaned);
    let (outcome, holding, applied_once) = if once {
        let failed: BTreeSet<&String> = tally.failures.iter().map(|f| &f.namespace).collect();
        let placed = plan.create.iter().filter(|n| !failed.contains(n));
        let next = apply_once::next_record(&record, &targets.write, placed);
        let holding = targets.write.len() - plan.left_deleted.len();
        let outcome = apply_once::with_note(outcome, &plan);
        (outcome, holding, Some(apply_once::record(&written, &next)))
    } else {
        (outcome, targets.write.len(), None)
    };
    Ok(FannedOut {
        written,
        targets: holding,
        tally,
        outcome,
        retry,
        hash: built.hash().to_owned(),
        applied_once,
    })
}

/// The name of the copies, the reconcile request they are stamped with, and what is done with a
/// copy that exists already.
#[derive(Clone, Copy)]
struct Copies<'a> {
    name: &'a str,
    requested: Option<&'a str>,
    existing: Existing,
}

/// Builds and writes the copy in each of `namespaces`, a capped number at a time.
async fn write_all(
    ctx: &Context,
    read: &Source,
    built: &BuiltContent,
    owner: &Owner,
    namespaces: &[String],
    copies: Copies<'_>,
) -> Vec<(String, CopyWrite)> {
    futures::stream::iter(namespaces.iter().cloned())
        .map(|namespace| {
            let target = Target {
                namespace: namespace.clone(),
                name: copies.name.to_owned(),
            };
            let mut desired = built.place(owner, &target);
            stamp_request(&mut desired, copies.requested);
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &read.resource);
            async move {
                let written = write_copy(
                    &ctx.watches,
                    &api,
                    &read.group_kind,
                    &read.copies,
                    &desired,
                    owner,
                    copies.existing,
                )
                .await;
                (namespace, copy_write(written))
            }
        })
        .buffer_unordered(ctx.settings.write_concurrency.max(1))
        .collect()
        .await
}

/// Removes the copies of the current kind outside `keep` or under another name than `name`, and
/// every copy of an `earlier` kind. Returns whether all are gone.
async fn remove_unwanted(
    cp: &ClusterProjection,
    ctx: &Context,
    read: &Source,
    keep: &BTreeSet<String>,
    name: &str,
    earlier: Option<WrittenDestination>,
) -> bool {
    let (owner, about) = (&cp.owner(), &cp.object_ref(&()));
    let unwanted: Vec<Arc<CachedCopy>> = read
        .copies
        .all()
        .into_iter()
        .filter(|c| is_unwanted(c, owner, keep, name))
        .collect();
    let release = Releasing {
        release: Release::Delete,
        report_left_alone: false,
    };
    let mut cleaned = remove_all(
        ctx,
        (owner, about),
        (&read.group_kind, &read.resource),
        &unwanted,
        release,
    )
    .await;
    if let Some(old) = earlier {
        cleaned &= withdraw_copies(cp, ctx, Some(&old), None, Release::Delete).await;
    }
    cleaned
}

/// A write's result as the fan-out's decisions read it.
fn copy_write(written: Result<Written, WriteError>) -> CopyWrite {
    match written {
        Ok(Written::Created) => CopyWrite::Created,
        Ok(Written::Updated) => CopyWrite::Updated,
        Ok(Written::Recreated(why)) => CopyWrite::Recreated(why),
        Ok(Written::Unchanged) => CopyWrite::Unchanged,
        Ok(Written::Adopted) => CopyWrite::Adopted,
        Err(e) => CopyWrite::Failed {
            reason: e.reason(),
            message: e.message(),
        },
    }
}

/// Releases (deletes or orphans, as `release` says) every copy of `owner` of the recorded kind and
/// of the current kind, in every namespace. Returns whether all are out of our hands.
async fn withdraw_copies(
    cp: &ClusterProjection,
    ctx: &Context,
    recorded: Option<&WrittenDestination>,
    current: Option<(&GroupKind, &ApiResource)>,
    release: Release,
) -> bool {
    let (owner, about) = (&cp.owner(), &cp.object_ref(&()));
    let mut kinds: Vec<(GroupKind, ApiResource)> = current
        .map(|(gk, r)| (gk.clone(), r.clone()))
        .into_iter()
        .collect();
    if let Some(old) = recorded {
        let old_kind = GroupKind {
            group: old.group.clone(),
            kind: old.kind.clone(),
        };
        if !kinds.iter().any(|(gk, _)| *gk == old_kind) {
            match recorded_resource(ctx, old).await {
                Ok(Some(resource)) => kinds.push((old_kind, resource)),
                Ok(None) => {}
                Err(()) => return false,
            }
        }
    }
    let mut all_gone = true;
    for (group_kind, resource) in kinds {
        let copies = match ctx.watches.ensure(&group_kind, &resource, Tier::Cluster).await {
            Ok(copies) => copies,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list copies to remove");
                all_gone = false;
                continue;
            }
        };
        let mine: Vec<Arc<CachedCopy>> = copies
            .all()
            .into_iter()
            .filter(|c| c.is_labelled_for(owner))
            .collect();
        let releasing = Releasing {
            release,
            report_left_alone: true,
        };
        all_gone &= remove_all(ctx, (owner, about), (&group_kind, &resource), &mine, releasing).await;
    }
    all_gone
}

/// How a removal treats the copies it finds.
#[derive(Clone, Copy)]
struct Releasing {
    /// Delete or orphan them.
    release: Release,
    /// Report copies kept because their ownership annotation was removed or changed.
    report_left_alone: bool,
}

/// Deletes (or orphans) the given copies that `owner` still owns, reporting what it did with one
/// event per kind of result.
async fn remove_all(
    ctx: &Context,
    (owner, about): (&Owner, &ObjectReference),
    (group_kind, resource): (&GroupKind, &ApiResource),
    copies: &[Arc<CachedCopy>],
    releasing: Releasing,
) -> bool {
    let Releasing {
        release,
        report_left_alone,
    } = releasing;
    let results: Vec<(String, Result<Removed, kube::Error>)> = futures::stream::iter(copies.iter().cloned())
        .map(|copy| async move {
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), copy.namespace(), resource);
            let result = match copy.object() {
                Some(object) => release_known(&ctx.watches, &api, group_kind, &object, owner, release).await,
                // Undecodable (never expected): read it instead.
                None => release_copy(&ctx.watches, &api, group_kind, copy.name(), owner, release).await,
            };
            (copy.path().to_owned(), result)
        })
        .buffer_unordered(ctx.settings.write_concurrency.max(1))
        .collect()
        .await;
    let mut deleted = Vec::new();
    let mut orphaned = Vec::new();
    let mut events = Vec::new();
    let mut all_gone = true;
    for (copy, result) in results {
        match result {
            Ok(Removed::Deleted) => deleted.push(copy),
            Ok(Removed::Orphaned) => orphaned.push(copy),
            Ok(Removed::LeftAlone) if report_left_alone => events.push(EventNote {
                reason: Reason::DestinationLeftAlone,
                note: format!("{copy} (not owned)"),
            }),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(copy, error = %crate::error::describe(&e), "could not remove copy");
                all_gone = false;
            }
        }
    }
    if !deleted.is_empty() {
        events.push(EventNote {
            reason: Reason::DestinationDeleted,
            note: name_first(deleted),
        });
    }
    if !orphaned.is_empty() {
        events.push(EventNote {
            reason: Reason::DestinationOrphaned,
            note: format!("{} left in place, no longer managed", name_first(orphaned)),
        });
    }
    ctx.events.publish_all(about, events).await;
    all_gone
}
