//! The `Projection` reconciler: resolve the source kind, read the source, check it may be projected,
//! build the copy, write it, clean up what an earlier spec wrote, report. The pure steps live in
//! `shared`; this module does the I/O around them.

use crate::{
    context::Context,
    error::{Error, api_error},
    events::Action as Verb,
    metrics::{E2eLabels, KindLabels, ReconcileLabels},
    watches::{ObjectKey, Waker},
    writer::{FIELD_MANAGER, Removed, Written, remove_copy, write_copy},
};
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{
        controller::Action,
        finalizer::{Event as Finalizer, finalizer},
        reflector::ObjectRef,
    },
};
use serde_json::json;
use shared::{
    crd::{Projection, ProjectionStatus, WrittenDestination},
    destination::{Target, build_destination},
    keys::PROJECTION_FINALIZER,
    ownership::Owner,
    policy::check_projectable,
    source::{GroupKind, SourceKey},
    status::{Outcome, next_conditions},
};
use std::{sync::Arc, time::Instant};

const KIND: &str = "Projection";

/// How a failed reconcile is retried.
enum Retry {
    /// Only a watch event can change the outcome (source created, stranger gone, CRD installed, spec
    /// edited): no timer.
    OnChange,
    /// A transient failure: retry with backoff.
    Backoff,
}

/// A reconcile that could not put the copy in place; its event is already published.
struct Failure {
    outcome: Outcome,
    retry: Retry,
    /// The copy the status should record afterwards (`None` once copies were removed).
    written: Option<WrittenDestination>,
}

/// Reconciles one Projection (the entry point handed to the kube controller runtime).
pub async fn reconcile(projection: Arc<Projection>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = projection.namespace().unwrap_or_default();
    let api: Api<Projection> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, PROJECTION_FINALIZER, projection, |event| async {
        match event {
            Finalizer::Apply(p) => apply(&p, &ctx).await,
            Finalizer::Cleanup(p) => cleanup(&p, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconcile_duration_seconds
        .get_or_create(&KindLabels { kind: KIND })
        .observe(started.elapsed().as_secs_f64());
    result
}

/// Decides when to retry after an error (capped exponential backoff per object).
pub fn error_policy(projection: Arc<Projection>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors_total
        .get_or_create(&crate::metrics::ErrorLabels {
            kind: KIND,
            category: error.category(),
        })
        .inc();
    let uid = projection.uid().unwrap_or_default();
    let delay = ctx.backoff.next_delay(&uid, ctx.settings.requeue_cap);
    tracing::info!(projection = %ObjectRef::from_obj(&*projection), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn owner_of(p: &Projection) -> Owner {
    Owner::Projection {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.uid().unwrap_or_default(),
    }
}

fn reference(p: &Projection) -> ObjectReference {
    p.object_ref(&())
}

/// The reconcile proper: put the copy in place and report.
async fn apply(p: &Projection, ctx: &Context) -> Result<Action, Error> {
    let waker: Waker = ObjectRef::from_obj(p);
    let status = p.status.clone().unwrap_or_default();
    let result = project(p, ctx, &waker, &status).await;
    let (outcome, written, retry) = match result {
        Ok(written) => (Outcome::Projected { resolved: written.1 }, Some(written.0), None),
        Err(f) => (f.outcome, f.written, Some(f.retry)),
    };
    let result_label = match (&outcome, &retry) {
        (Outcome::Projected { .. }, _) => "success",
        (
            Outcome::DestinationFailed {
                reason: "DestinationConflict",
                ..
            },
            _,
        ) => "conflict",
        (Outcome::DestinationFailed { .. }, _) => "destination_error",
        (Outcome::SourceFailed { .. }, _) => "source_error",
    };
    write_status(p, ctx, &status, &outcome, written).await?;
    ctx.metrics
        .reconcile_total
        .get_or_create(&ReconcileLabels {
            kind: KIND,
            result: result_label,
        })
        .inc();
    match retry {
        None => {
            ctx.backoff.reset(&p.uid().unwrap_or_default());
            Ok(Action::await_change())
        }
        Some(Retry::OnChange) => {
            ctx.backoff.reset(&p.uid().unwrap_or_default());
            Ok(Action::await_change())
        }
        Some(Retry::Backoff) => Err(Error::Retry {
            reason: outcome.reason(),
            message: ready_message(&outcome),
        }),
    }
}

fn ready_message(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Projected { .. } => String::new(),
        Outcome::SourceFailed { message, .. } | Outcome::DestinationFailed { message, .. } => message.clone(),
    }
}

/// Resolves, reads, checks, builds and writes. Returns what was written and the `SourceResolved`
/// message.
async fn project(
    p: &Projection,
    ctx: &Context,
    waker: &Waker,
    status: &ProjectionStatus,
) -> Result<(WrittenDestination, String), Failure> {
    let owner = owner_of(p);
    let about = reference(p);
    let source = &p.spec.source;
    let recorded = status.written_destination.clone();

    // 1. The source kind, pinned or at its preferred version.
    let resolved = match ctx.discovery.resolve(source).await {
        Ok(r) => {
            ctx.watches.set_unresolved(waker, false);
            r
        }
        Err(e) => {
            let (message, retry) = match e {
                crate::discovery::ResolveError::Unusable(m) => {
                    ctx.watches.set_unresolved(waker, true);
                    (m, Retry::OnChange)
                }
                crate::discovery::ResolveError::Api(e) => (format!("discovery failed: {e}"), Retry::Backoff),
            };
            ctx.events
                .warning(&about, "SourceResolutionFailed", Verb::Resolve, message.clone())
                .await;
            return Err(Failure {
                outcome: Outcome::SourceFailed {
                    reason: "SourceResolutionFailed",
                    message,
                },
                retry,
                written: recorded,
            });
        }
    };
    let resource = resolved.resource;
    let group_kind = source.group_kind();
    ctx.watches.set_reads(waker, SourceKey::of(source));
    let copies = ctx
        .watches
        .ensure(&group_kind, &resource)
        .await
        .map_err(|message| Failure {
            outcome: Outcome::SourceFailed {
                reason: "SourceFetchFailed",
                message,
            },
            retry: Retry::Backoff,
            written: recorded.clone(),
        })?;

    // 2. The source itself.
    let source_api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &source.namespace, &resource);
    let object = match source_api.get_opt(&source.name).await {
        Ok(Some(o)) => o,
        Ok(None) => {
            let ever_projected = status.destination_name.is_some() || recorded.is_some();
            let (reason, message) = if ever_projected {
                (
                    "SourceDeleted",
                    format!("source {}/{} has been deleted", source.namespace, source.name),
                )
            } else {
                (
                    "SourceNotFound",
                    format!("source {}/{} not found", source.namespace, source.name),
                )
            };
            let why = Withdrawal {
                reason,
                message,
                verb: Verb::Get,
            };
            return Err(withdraw(p, ctx, recorded, (&group_kind, &resource), why).await);
        }
        Err(e) => {
            let message = e.to_string();
            ctx.events
                .warning(&about, "SourceFetchFailed", Verb::Get, message.clone())
                .await;
            return Err(Failure {
                outcome: Outcome::SourceFailed {
                    reason: "SourceFetchFailed",
                    message,
                },
                retry: Retry::Backoff,
                written: recorded,
            });
        }
    };

    // 3. May it be projected? A veto retracts existing copies.
    if let Err(blocked) = check_projectable(
        ctx.settings.source_mode,
        object.metadata.annotations.as_ref(),
        &source.namespace,
        &source.name,
    ) {
        let why = Withdrawal {
            reason: blocked.reason,
            message: blocked.message,
            verb: Verb::Validate,
        };
        return Err(withdraw(p, ctx, recorded, (&group_kind, &resource), why).await);
    }

    // 4. Build and write the copy.
    let target = Target {
        namespace: p.namespace().unwrap_or_default(),
        name: p
            .spec
            .destination
            .as_ref()
            .and_then(|d| d.name.clone())
            .unwrap_or_else(|| source.name.clone()),
    };
    let failed = |reason: &'static str, message: String, retry: Retry| Failure {
        outcome: Outcome::DestinationFailed {
            resolved: resolved.message.clone(),
            reason,
            message,
        },
        retry,
        written: recorded.clone(),
    };
    if target.namespace == source.namespace && target.name == source.name {
        let message = format!(
            "destination {}/{} is the source object itself; set spec.destination.name or create the Projection in another namespace",
            target.namespace, target.name
        );
        ctx.events
            .warning(&about, "DestinationConflict", Verb::Validate, message.clone())
            .await;
        return Err(failed("DestinationConflict", message, Retry::OnChange));
    }
    let source_value = serde_json::to_value(&object)
        .map_err(|e| failed("DestinationCreateFailed", e.to_string(), Retry::Backoff))?;
    let desired = build_destination(&source_value, p.spec.overlay.as_ref(), &owner, &target);
    let dest_api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &target.namespace, &resource);
    let gvk_text = gvk_display(&resource);
    let copy = format!("{}/{}", target.namespace, target.name);
    let from = format!("{}/{}", source.namespace, source.name);
    match write_copy(
        &ctx.watches,
        &dest_api,
        &group_kind,
        &resource,
        &copies,
        &desired,
        &owner,
    )
    .await
    {
        Ok(written) => {
            ctx.watches.set_waiting(waker, None);
            match written {
                Written::Created => {
                    if status.destination_name.is_none() {
                        observe_first_copy(p, ctx);
                    }
                    ctx.events
                        .normal(
                            &about,
                            "Projected",
                            Verb::Create,
                            format!("projected {gvk_text} {from} to {copy}"),
                        )
                        .await;
                }
                Written::Updated => {
                    ctx.events
                        .normal(
                            &about,
                            "Updated",
                            Verb::Update,
                            format!("updated {gvk_text} {from} to {copy}"),
                        )
                        .await;
                }
                Written::Recreated(why) => {
                    ctx.events
                        .normal(
                            &about,
                            "DestinationRecreated",
                            Verb::Update,
                            format!("recreated {copy} because an in-place update was refused: {why}"),
                        )
                        .await;
                }
                Written::Unchanged => {}
            }
        }
        Err(e) => {
            let retry = if let crate::writer::WriteError::Conflict(_) = e {
                ctx.watches.set_waiting(
                    waker,
                    Some(ObjectKey {
                        group_kind: group_kind.clone(),
                        namespace: target.namespace.clone(),
                        name: target.name.clone(),
                    }),
                );
                Retry::OnChange
            } else {
                Retry::Backoff
            };
            let verb = match e {
                crate::writer::WriteError::Conflict(_) => Verb::Validate,
                crate::writer::WriteError::Fetch(_) => Verb::Get,
                crate::writer::WriteError::Create(_) => Verb::Create,
                crate::writer::WriteError::Update(_) => Verb::Update,
            };
            ctx.events.warning(&about, e.reason(), verb, e.message()).await;
            return Err(failed(e.reason(), e.message(), retry));
        }
    }

    // 5. What an earlier spec wrote elsewhere goes (a rename, another source or kind).
    let now_written = WrittenDestination {
        group: resource.group.clone(),
        version: resource.version.clone(),
        kind: resource.kind.clone(),
        name: target.name.clone(),
    };
    let stale = recorded.filter(|old| {
        old.group != now_written.group || old.kind != now_written.kind || old.name != now_written.name
    });
    if let Some(old) = stale
        && remove_recorded(p, ctx, &owner, &about, &old).await.is_err()
    {
        // Keep a record of the old copy until it is gone: retry with backoff.
        return Err(Failure {
            outcome: Outcome::DestinationFailed {
                resolved: resolved.message.clone(),
                reason: "DestinationDeleteFailed",
                message: format!(
                    "could not remove the earlier copy {}/{}",
                    target.namespace, old.name
                ),
            },
            retry: Retry::Backoff,
            written: Some(old),
        });
    }
    Ok((now_written, resolved.message))
}

/// `<group>/<version>, Kind=<Kind>` as the Go operator prints a GVK (`/v1, Kind=ConfigMap`).
fn gvk_display(resource: &ApiResource) -> String {
    format!("{}/{}, Kind={}", resource.group, resource.version, resource.kind)
}

fn observe_first_copy(p: &Projection, ctx: &Context) {
    if let Some(created) = p.meta().creation_timestamp.as_ref() {
        let seconds = Timestamp::now().duration_since(created.0).as_secs_f64();
        ctx.metrics
            .e2e_seconds
            .get_or_create(&E2eLabels {
                kind: KIND,
                event: "create",
            })
            .observe(seconds.max(0.0));
    }
}

/// A source failure after which every copy goes: the source is gone, or vetoes projection.
struct Withdrawal {
    reason: &'static str,
    message: String,
    verb: Verb,
}

/// Removes the copies, publishes the failure, and says how to retry: on a change once every copy is
/// gone, with backoff while one could not be removed (its record is kept until then).
async fn withdraw(
    p: &Projection,
    ctx: &Context,
    recorded: Option<WrittenDestination>,
    current: (&GroupKind, &ApiResource),
    why: Withdrawal,
) -> Failure {
    let owner = owner_of(p);
    let about = reference(p);
    let removed = retract(p, ctx, &owner, &about, recorded.as_ref(), Some(current)).await;
    ctx.events
        .warning(&about, why.reason, why.verb, why.message.clone())
        .await;
    Failure {
        outcome: Outcome::SourceFailed {
            reason: why.reason,
            message: why.message,
        },
        retry: if removed { Retry::OnChange } else { Retry::Backoff },
        written: if removed { None } else { recorded },
    }
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
        let name = p
            .spec
            .destination
            .as_ref()
            .and_then(|d| d.name.clone())
            .unwrap_or_else(|| p.spec.source.name.clone());
        let already =
            recorded.is_some_and(|r| r.group == resource.group && r.kind == resource.kind && r.name == name);
        if !already {
            let api = Api::<DynamicObject>::namespaced_with(
                ctx.client.clone(),
                &p.namespace().unwrap_or_default(),
                resource,
            );
            match remove_copy(&ctx.watches, &api, group_kind, &name, owner).await {
                Ok(Removed::Deleted) => {
                    let note = format!("{}/{name}", p.namespace().unwrap_or_default());
                    ctx.events
                        .normal(about, "DestinationDeleted", Verb::Delete, note)
                        .await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not remove copy");
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
    let gvk = kube::core::GroupVersionKind::gvk(&recorded.group, &recorded.version, &recorded.kind);
    let resource = match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
        Ok((resource, _)) => resource,
        // The kind is gone (CRD deleted): so are its objects.
        Err(kube::Error::Discovery(_)) => return Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "could not resolve the recorded copy's kind");
            return Err(());
        }
    };
    let group_kind = GroupKind {
        group: recorded.group.clone(),
        kind: recorded.kind.clone(),
    };
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let note = format!("{namespace}/{}", recorded.name);
    match remove_copy(&ctx.watches, &api, &group_kind, &recorded.name, owner).await {
        Ok(Removed::Deleted) => {
            ctx.events
                .normal(about, "DestinationDeleted", Verb::Delete, note)
                .await
        }
        Ok(Removed::LeftAlone) => {
            ctx.events
                .normal(
                    about,
                    "DestinationLeftAlone",
                    Verb::Delete,
                    format!("{note} (not owned)"),
                )
                .await
        }
        Ok(Removed::Absent) => {}
        Err(e) => {
            tracing::warn!(error = %e, copy = %note, "could not remove copy");
            return Err(());
        }
    }
    Ok(())
}

/// Deletion of the Projection: its copies go first (the finalizer holds it until then).
async fn cleanup(p: &Projection, ctx: &Context) -> Result<Action, Error> {
    let owner = owner_of(p);
    let about = reference(p);
    let recorded = p.status.as_ref().and_then(|s| s.written_destination.clone());
    let current = ctx.discovery.resolve(&p.spec.source).await.ok();
    let current = current
        .as_ref()
        .map(|r| (p.spec.source.group_kind(), r.resource.clone()));
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
        return Err(Error::Retry {
            reason: "DestinationDeleteFailed",
            message: "copies could not be removed yet".into(),
        });
    }
    ctx.watches.forget(&ObjectRef::from_obj(p));
    ctx.backoff.reset(&p.uid().unwrap_or_default());
    Ok(Action::await_change())
}

/// Writes the status when it differs from what is stored (server-side apply of the status only).
async fn write_status(
    p: &Projection,
    ctx: &Context,
    current: &ProjectionStatus,
    outcome: &Outcome,
    written: Option<WrittenDestination>,
) -> Result<(), Error> {
    let destination_name = match outcome {
        Outcome::Projected { .. } => written.as_ref().map(|w| w.name.clone()),
        _ => current.destination_name.clone(),
    };
    let next = ProjectionStatus {
        conditions: next_conditions(
            &current.conditions,
            outcome,
            p.meta().generation,
            &Time(Timestamp::now()),
        ),
        destination_name,
        written_destination: written,
    };
    if next == *current {
        return Ok(());
    }
    let api: Api<Projection> = Api::namespaced(ctx.client.clone(), &p.namespace().unwrap_or_default());
    let body = json!({"apiVersion": "projection.sh/v1", "kind": KIND, "status": next});
    api.patch_status(
        &p.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(api_error("writing status"))?;
    Ok(())
}
