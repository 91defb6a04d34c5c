//! The `Projection` reconciler: read the source (see `reconcile`), build the copy, write it into the
//! Projection's namespace, clean up what an earlier spec wrote, report. The pure steps live in
//! `shared`; this module does the I/O around them.

use crate::{
    content::build_or_report,
    context::Context,
    error::Error,
    index::{CrRef, ObjectKey},
    reconcile::{
        ProjectionKind, conclude, forbidden_namespaces, gvk_display, hold_if_suspended, observe_first_copy,
        read_or_withdraw, spec_fields, written_destination,
    },
    watches::Tier,
    writer::{Existing, Removed, Written, release_copy, write_copy},
};
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{controller::Action, reflector::ObjectRef},
};
use shared::{
    apply_once,
    copy::CopyRules,
    crd::{AppliedOnce, Projection, ProjectionStatus, WrittenDestination},
    destination::Target,
    keys::PROJECTION_FINALIZER,
    lifecycle::{Release, handled_request, requested_at, stamp_request},
    ownership::Owner,
    reason::{Reason, Retry},
    self_copy::self_copy,
    source::GroupKind,
    status::{Failure, Outcome, destination_failure, projection_status},
    unwanted::earlier_copy,
};

const KIND: &str = "Projection";

impl ProjectionKind for Projection {
    const KIND: &'static str = KIND;
    const FINALIZER: &'static str = PROJECTION_FINALIZER;
    const TIER: Tier = Tier::Projection;
    type Status = ProjectionStatus;

    spec_fields!();

    fn waker(&self) -> CrRef {
        // Name and namespace only: the indexes keep one per CR, and a uid or resourceVersion
        // carried along would be two more strings each.
        CrRef::Projection(ObjectRef::new(&self.name_any()).within(&self.namespace().unwrap_or_default()))
    }

    fn owner(&self) -> Owner {
        Owner::Projection {
            namespace: self.namespace().unwrap_or_default(),
            name: self.name_any(),
            uid: self.uid().unwrap_or_default(),
        }
    }

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }

    fn runtime_metrics(
        metrics: &crate::runtime_metrics::RuntimeMetrics,
    ) -> &crate::runtime_metrics::ControllerMetrics {
        &metrics.projection
    }

    fn forget(&self, ctx: &Context) {
        ctx.watches.forget(&self.waker());
    }
}

/// The copy's coordinates under the current spec.
fn target_of(p: &Projection) -> Target {
    Target {
        namespace: p.namespace().unwrap_or_default(),
        name: p
            .spec
            .destination
            .as_ref()
            .and_then(|d| d.name.clone())
            .unwrap_or_else(|| p.spec.source.name.clone()),
    }
}

/// The reconcile proper: put the copy in place and report.
async fn apply(p: &Projection, ctx: &Context) -> Result<Action, Error> {
    let status = p.status.clone().unwrap_or_default();
    let name = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    let uid = p.uid().unwrap_or_default();
    if let Some(held) = hold_if_suspended(p, ctx).await? {
        return Ok(held);
    }
    let requested = requested_at(p.meta().annotations.as_ref());
    let mut applied_once = None;
    let mut built_hash = None;
    let (outcome, written, retry) = match project(p, ctx, &status, requested).await {
        Ok(done) => {
            applied_once = done.applied_once;
            built_hash = Some(done.hash);
            let outcome = Outcome::Projected {
                resolved: done.resolved,
                note: done.note,
            };
            (outcome, Some(done.written), Retry::OnChange)
        }
        Err(f) => (f.outcome, f.written, f.retry),
    };
    let placed = outcome.is_ready();
    let mut next = projection_status(
        &status,
        &outcome,
        written,
        p.meta().generation,
        &Time(Timestamp::now()),
    );
    next.last_handled_reconcile_at = handled_request(requested, status.last_handled_reconcile_at.as_deref());
    if built_hash.is_some() {
        next.source_hash = built_hash;
    }
    if placed {
        next.applied_once = applied_once;
    }
    crate::reconcile::write_status(p, ctx, &status, &next).await?;
    conclude(ctx, KIND, (&name, &uid), &outcome, retry)
}

/// A pass that put the copy in place.
struct Placed {
    /// The copy as now written.
    written: WrittenDestination,
    /// The `SourceResolved` message.
    resolved: String,
    /// The `DestinationWritten` message.
    note: String,
    /// With `syncPolicy: ApplyOnce`, the record of where the copy was created.
    applied_once: Option<AppliedOnce>,
    /// The copy's source hash.
    hash: String,
}

/// Reads, checks, builds and writes (stamped with the `requested` reconcile, if any; only created
/// once with `syncPolicy: ApplyOnce`).
async fn project(
    p: &Projection,
    ctx: &Context,
    status: &ProjectionStatus,
    requested: Option<&str>,
) -> Result<Placed, Failure> {
    let waker = p.waker();
    let owner = p.owner();
    let about = p.object_ref(&());
    let source = &p.spec.source;
    let recorded = status.written_destination.clone();
    let ever_projected = status.destination_name.is_some() || recorded.is_some();
    let read = read_or_withdraw(ctx, p, recorded.as_ref(), ever_projected).await?;

    let target = target_of(p);
    let failed =
        |reason, message| destination_failure(&read.resolved_message, reason, message, recorded.clone());
    if let Some(found) = self_copy(source, &target.namespace, &target.name) {
        let message = found.projection_message();
        ctx.events
            .publish(&about, Reason::DestinationConflict, message.clone())
            .await;
        return Err(failed(Reason::DestinationConflict, message));
    }
    let own = std::slice::from_ref(&target.namespace);
    if let Some((_, message)) = forbidden_namespaces(ctx, &read, own).await.into_iter().next() {
        ctx.events
            .publish(&about, Reason::DestinationForbidden, message.clone())
            .await;
        // Its author could not have made the copy: it goes.
        let current = Some((&read.group_kind, &read.resource));
        p.withdraw(ctx, recorded.as_ref(), current, Release::Delete).await;
        return Err(failed(Reason::DestinationForbidden, message));
    }
    let rules = CopyRules::of_projection(&p.spec);
    let built = build_or_report(ctx, &about, &read.object, &rules, failed).await?;
    let mut desired = built.place(&owner, &target);
    stamp_request(&mut desired, requested);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &target.namespace, &read.resource);
    let copy = format!("{}/{}", target.namespace, target.name);
    let from = format!("{}/{}", source.namespace, source.name);
    let gvk = gvk_display(&read.resource);
    let now_written = written_destination(&read.resource, &target.name);

    // ApplyOnce: a copy created once is never written again, even when it was deleted since.
    let once = apply_once::is_apply_once(p.spec.controls.sync_policy);
    let record = apply_once::recorded(status.applied_once.as_ref(), &now_written);
    let exists: std::collections::BTreeSet<String> = read
        .copies
        .get(&target.namespace, &target.name)
        .filter(|c| c.is_owned_by(&owner))
        .map(|_| target.namespace.clone())
        .into_iter()
        .collect();
    let targets = [target.namespace.clone()];
    let plan = apply_once::plan(&targets, &record, &exists);
    let existing = if once { Existing::Keep } else { Existing::Update };
    let write = if once && plan.create.is_empty() {
        Ok(Written::Unchanged)
    } else {
        write_copy(
            &ctx.watches,
            &api,
            &read.group_kind,
            &read.copies,
            &desired,
            &owner,
            existing,
        )
        .await
    };
    match write {
        Ok(written) => {
            ctx.watches.set_waiting(&waker, Vec::new());
            match written {
                Written::Created => {
                    if status.destination_name.is_none() {
                        observe_first_copy(p, ctx);
                    }
                    ctx.events
                        .publish(
                            &about,
                            Reason::Projected,
                            format!("projected {gvk} {from} to {copy}"),
                        )
                        .await;
                }
                Written::Updated => {
                    ctx.events
                        .publish(&about, Reason::Updated, format!("updated {gvk} {from} to {copy}"))
                        .await;
                }
                Written::Recreated(why) => {
                    let note = format!("recreated {copy} because an in-place update was refused: {why}");
                    ctx.events
                        .publish(&about, Reason::DestinationRecreated, note)
                        .await;
                }
                Written::Adopted => {
                    let note = format!("adopted {copy} as the copy of {from}");
                    ctx.events.publish(&about, Reason::DestinationAdopted, note).await;
                }
                Written::Unchanged => {}
            }
        }
        Err(e) => {
            let reason = e.reason();
            if reason == Reason::DestinationConflict {
                // Only the stranger's departure can help: its watch event wakes us.
                let key = ObjectKey {
                    group_kind: read.group_kind.clone(),
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                };
                ctx.watches.set_waiting(&waker, vec![key]);
            }
            ctx.events.publish(&about, reason, e.message()).await;
            return Err(failed(reason, e.message()));
        }
    }

    // What an earlier spec wrote elsewhere goes (a rename, another source or kind).
    if let Some(old) = earlier_copy(recorded.as_ref(), &now_written)
        && remove_recorded(p, ctx, (&owner, &about), &old, Release::Delete)
            .await
            .is_err()
    {
        // Keep a record of the old copy until it is gone: retry with backoff.
        let message = format!(
            "could not remove the earlier copy {}/{}",
            target.namespace, old.name
        );
        return Err(destination_failure(
            &read.resolved_message,
            Reason::DestinationDeleteFailed,
            message,
            Some(old),
        ));
    }
    let (note, applied_once) = if once {
        let placed = if plan.create.is_empty() {
            &[][..]
        } else {
            &targets[..]
        };
        let next = apply_once::next_record(&record, &targets, placed);
        (
            apply_once::note(&plan),
            Some(apply_once::record(&now_written, &next)),
        )
    } else {
        (String::new(), None)
    };
    Ok(Placed {
        written: now_written,
        resolved: read.resolved_message,
        note,
        applied_once,
        hash: built.hash().to_owned(),
    })
}

/// Releases (deletes or orphans, as `release` says) every copy this Projection may have written: the
/// recorded one and the one at the current coordinates. Returns whether all are out of our hands.
async fn withdraw_copies(
    p: &Projection,
    ctx: &Context,
    recorded: Option<&WrittenDestination>,
    current: Option<(&GroupKind, &ApiResource)>,
    release: Release,
) -> bool {
    let (owner, about) = (&p.owner(), &p.object_ref(&()));
    let mut all_gone = true;
    if let Some(old) = recorded {
        all_gone &= remove_recorded(p, ctx, (owner, about), old, release)
            .await
            .is_ok();
    }
    if let Some((group_kind, resource)) = current {
        let target = target_of(p);
        let already = recorded
            .is_some_and(|r| r.group == resource.group && r.kind == resource.kind && r.name == target.name);
        if !already {
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &target.namespace, resource);
            let note = format!("{}/{}", target.namespace, target.name);
            match release_copy(&ctx.watches, &api, group_kind, &target.name, owner, release).await {
                Ok(Removed::Deleted) => ctx.events.publish(about, Reason::DestinationDeleted, note).await,
                Ok(Removed::Orphaned) => publish_orphaned(ctx, about, note).await,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %crate::error::describe(&e), "could not remove copy");
                    all_gone = false;
                }
            }
        }
    }
    all_gone
}

async fn publish_orphaned(ctx: &Context, about: &ObjectReference, copy: String) {
    let note = format!("{copy} left in place, no longer managed");
    ctx.events.publish(about, Reason::DestinationOrphaned, note).await;
}

/// Releases the copy recorded in status, if it still is ours; a copy whose ownership annotation was
/// removed or changed is left alone, with an event.
async fn remove_recorded(
    p: &Projection,
    ctx: &Context,
    (owner, about): (&Owner, &ObjectReference),
    recorded: &WrittenDestination,
    release: Release,
) -> Result<(), ()> {
    let namespace = p.namespace().unwrap_or_default();
    let Some(resource) = crate::writer::recorded_resource(ctx, recorded).await? else {
        return Ok(());
    };
    let group_kind = GroupKind {
        group: recorded.group.clone(),
        kind: recorded.kind.clone(),
    };
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let note = format!("{namespace}/{}", recorded.name);
    match release_copy(&ctx.watches, &api, &group_kind, &recorded.name, owner, release).await {
        Ok(Removed::Deleted) => ctx.events.publish(about, Reason::DestinationDeleted, note).await,
        Ok(Removed::Orphaned) => publish_orphaned(ctx, about, note).await,
        Ok(Removed::LeftAlone) => {
            ctx.events
                .publish(about, Reason::DestinationLeftAlone, format!("{note} (not owned)"))
                .await
        }
        Ok(Removed::Absent) => {}
        Err(e) => {
            tracing::warn!(error = %crate::error::describe(&e), copy = %note, "could not remove copy");
            return Err(());
        }
    }
    Ok(())
}
