//! The `Projection` reconciler: read the source (see `reconcile`), build the copy, write it into the
//! Projection's namespace, clean up what an earlier spec wrote, report. The pure steps live in
//! `shared`; this module does the I/O around them.

use crate::{
    context::Context,
    error::Error,
    index::{CrRef, ObjectKey},
    reconcile::{
        ProjectionKind, conclude, copies_remain, gvk_display, observe_first_copy, read_or_withdraw,
        resolved_kind, written_destination,
    },
    watches::Tier,
    writer::{Removed, Written, remove_copy, write_copy},
};
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{controller::Action, reflector::ObjectRef},
};
use shared::{
    crd::{Projection, ProjectionStatus, WrittenDestination},
    destination::{Target, build_destination},
    keys::PROJECTION_FINALIZER,
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

    fn runtime_metrics(
        metrics: &crate::runtime_metrics::RuntimeMetrics,
    ) -> &crate::runtime_metrics::ControllerMetrics {
        &metrics.projection
    }

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }

    fn apply(&self, ctx: &Context) -> impl std::future::Future<Output = Result<Action, Error>> + Send {
        apply(self, ctx)
    }

    fn cleanup(&self, ctx: &Context) -> impl std::future::Future<Output = Result<Action, Error>> + Send {
        cleanup(self, ctx)
    }
}

fn owner_of(p: &Projection) -> Owner {
    Owner::Projection {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.uid().unwrap_or_default(),
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
    let (outcome, written, retry) = match project(p, ctx, &status).await {
        Ok((written, resolved)) => (
            Outcome::Projected {
                resolved,
                note: String::new(),
            },
            Some(written),
            Retry::OnChange,
        ),
        Err(f) => (f.outcome, f.written, f.retry),
    };
    let next = projection_status(
        &status,
        &outcome,
        written,
        p.meta().generation,
        &Time(Timestamp::now()),
    );
    crate::reconcile::write_status(p, ctx, &status, &next).await?;
    let name = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    conclude(ctx, KIND, (&name, &p.uid().unwrap_or_default()), &outcome, retry)
}

/// Reads, checks, builds and writes. Returns what was written and the `SourceResolved` message.
async fn project(
    p: &Projection,
    ctx: &Context,
    status: &ProjectionStatus,
) -> Result<(WrittenDestination, String), Failure> {
    let waker = CrRef::Projection(ObjectRef::from_obj(p));
    let owner = owner_of(p);
    let about = p.object_ref(&());
    let source = &p.spec.source;
    let recorded = status.written_destination.clone();
    let ever_projected = status.destination_name.is_some() || recorded.is_some();

    let read = read_or_withdraw(
        ctx,
        source,
        &waker,
        Tier::Projection,
        &about,
        recorded.as_ref(),
        ever_projected,
        |resource| {
            let current = (source.group_kind(), resource);
            let (owner, about, recorded) = (&owner, &about, recorded.as_ref());
            async move { retract(p, ctx, owner, about, recorded, Some((&current.0, &current.1))).await }
        },
    )
    .await?;

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
    let source_value = serde_json::to_value(&read.object)
        .map_err(|e| failed(Reason::DestinationCreateFailed, e.to_string()))?;
    let desired = build_destination(&source_value, p.spec.overlay.as_ref(), &owner, &target);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &target.namespace, &read.resource);
    let copy = format!("{}/{}", target.namespace, target.name);
    let from = format!("{}/{}", source.namespace, source.name);
    let gvk = gvk_display(&read.resource);
    match write_copy(
        &ctx.watches,
        &api,
        &read.group_kind,
        &read.resource,
        &read.copies,
        &desired,
        &owner,
    )
    .await
    {
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
    let now_written = written_destination(&read.resource, &target.name);
    if let Some(old) = earlier_copy(recorded.as_ref(), &now_written)
        && remove_recorded(p, ctx, &owner, &about, &old).await.is_err()
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
    Ok((now_written, read.resolved_message))
}

/// Removes every copy this Projection may have written: the recorded one and the one at the current
/// coordinates. Returns whether all are gone.
async fn retract(
    p: &Projection,
    ctx: &Context,
    owner: &Owner,
    about: &ObjectReference,
    recorded: Option<&WrittenDestination>,
    current: Option<(&GroupKind, &ApiResource)>,
) -> bool {
    let mut all_gone = true;
    if let Some(old) = recorded {
        all_gone &= remove_recorded(p, ctx, owner, about, old).await.is_ok();
    }
    if let Some((group_kind, resource)) = current {
        let target = target_of(p);
        let already = recorded
            .is_some_and(|r| r.group == resource.group && r.kind == resource.kind && r.name == target.name);
        if !already {
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &target.namespace, resource);
            match remove_copy(&ctx.watches, &api, group_kind, &target.name, owner).await {
                Ok(Removed::Deleted) => {
                    let note = format!("{}/{}", target.namespace, target.name);
                    ctx.events.publish(about, Reason::DestinationDeleted, note).await;
                }
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

/// Removes the copy recorded in status, if it still is ours; a copy whose ownership annotation was
/// removed or changed is left alone, with an event.
async fn remove_recorded(
    p: &Projection,
    ctx: &Context,
    owner: &Owner,
    about: &ObjectReference,
    recorded: &WrittenDestination,
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
    match remove_copy(&ctx.watches, &api, &group_kind, &recorded.name, owner).await {
        Ok(Removed::Deleted) => ctx.events.publish(about, Reason::DestinationDeleted, note).await,
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

/// Deletion of the Projection: its copies go first (the finalizer holds it until then).
async fn cleanup(p: &Projection, ctx: &Context) -> Result<Action, Error> {
    let owner = owner_of(p);
    let about = p.object_ref(&());
    let recorded = p.status.as_ref().and_then(|s| s.written_destination.clone());
    let current = resolved_kind(ctx, &p.spec.source).await;
    let all_gone = retract(
        p,
        ctx,
        &owner,
        &about,
        recorded.as_ref(),
        current.as_ref().map(|(gk, r)| (gk, r)),
    )
    .await;
    if !all_gone {
        return Err(copies_remain());
    }
    ctx.watches.forget(&CrRef::Projection(ObjectRef::from_obj(p)));
    // The backoff is reset by `reconcile` once the finalizer is removed too.
    Ok(Action::await_change())
}
