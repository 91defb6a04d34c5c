//! The `ClusterProjection` reconciler: read the source (see `reconcile`), resolve the target
//! namespaces, write one copy per namespace in parallel (with a cap), remove the copies no longer
//! wanted, report counts and per-namespace failures.
//!
//! Every pass compares all targets, but against the cache of our copies: an unchanged copy costs no
//! request, so a namespace event or a source edit writes exactly the copies that differ.

use crate::{
    context::Context,
    error::Error,
    events::Action as Verb,
    metrics::E2eLabels,
    reconcile::{Failure, Problem, ProjectionKind, Retry, conclude, gvk_display, read_source},
    watches::{ObjectKey, Tier, Waker},
    writer::{Removed, WriteError, Written, recorded_resource, remove_known, write_copy},
};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use shared::{
    crd::{ClusterProjection, ClusterProjectionStatus, NamespaceFailure, WrittenDestination},
    destination::{Target, build_destination},
    keys::CLUSTER_PROJECTION_FINALIZER,
    ownership::Owner,
    source::GroupKind,
    status::{Outcome, next_conditions},
    targets::{TargetRule, Targets, summarize_failures},
};
use std::{collections::BTreeSet, sync::Arc};

const KIND: &str = "ClusterProjection";
/// How many namespaces an event note names before summarising the rest.
const NAMED_IN_EVENTS: usize = 10;

impl ProjectionKind for ClusterProjection {
    const KIND: &'static str = KIND;
    const FINALIZER: &'static str = CLUSTER_PROJECTION_FINALIZER;

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::all(client)
    }

    fn apply(&self, ctx: &Context) -> impl std::future::Future<Output = Result<Action, Error>> + Send {
        apply(self, ctx)
    }

    fn cleanup(&self, ctx: &Context) -> impl std::future::Future<Output = Result<Action, Error>> + Send {
        cleanup(self, ctx)
    }
}

fn owner_of(cp: &ClusterProjection) -> Owner {
    Owner::ClusterProjection {
        name: cp.name_any(),
        uid: cp.uid().unwrap_or_default(),
    }
}

fn destination_name(cp: &ClusterProjection) -> String {
    cp.spec
        .destination
        .name
        .clone()
        .unwrap_or_else(|| cp.spec.source.name.clone())
}

/// A pass that reached the fan-out.
struct FanOut {
    written: WrittenDestination,
    namespaces_written: i32,
    failures: Vec<NamespaceFailure>,
    outcome: Outcome,
    retry: Option<Retry>,
}

async fn apply(cp: &ClusterProjection, ctx: &Context) -> Result<Action, Error> {
    let status = cp.status.clone().unwrap_or_default();
    let next = match fan_out(cp, ctx, &status).await {
        Ok(pass) => {
            let failed_list = summarize_failures(&pass.failures)
                .map(|(_, _, list)| list)
                .unwrap_or_default();
            let next = ClusterProjectionStatus {
                conditions: next_conditions(
                    &status.conditions,
                    &pass.outcome,
                    cp.meta().generation,
                    &Time(Timestamp::now()),
                ),
                destination_name: Some(pass.written.name.clone()),
                namespaces_written: pass.namespaces_written,
                namespaces_failed: pass.failures.len() as i32,
                failed_namespaces: failed_list,
                written_destination: Some(pass.written),
            };
            (next, pass.outcome, pass.retry)
        }
        Err(f) => {
            let copies_gone = f.written.is_none();
            let next = ClusterProjectionStatus {
                conditions: next_conditions(
                    &status.conditions,
                    &f.outcome,
                    cp.meta().generation,
                    &Time(Timestamp::now()),
                ),
                destination_name: status.destination_name.clone(),
                // Counts stay honest: once copies are withdrawn, none are written.
                namespaces_written: if copies_gone { 0 } else { status.namespaces_written },
                namespaces_failed: if copies_gone { 0 } else { status.namespaces_failed },
                failed_namespaces: if copies_gone {
                    Vec::new()
                } else {
                    status.failed_namespaces.clone()
                },
                written_destination: f.written,
            };
            (next, f.outcome, Some(f.retry))
        }
    };
    let (next, outcome, retry) = next;
    crate::reconcile::write_status(cp, ctx, &status, &next).await?;
    conclude(
        ctx,
        KIND,
        (&cp.name_any(), &cp.uid().unwrap_or_default()),
        &outcome,
        retry,
    )
}

async fn fan_out(
    cp: &ClusterProjection,
    ctx: &Context,
    status: &ClusterProjectionStatus,
) -> Result<FanOut, Failure> {
    let cp_ref = ObjectRef::from_obj(cp);
    let waker = Waker::Cluster(cp_ref.clone());
    let owner = owner_of(cp);
    let about = cp.object_ref(&());
    let source = &cp.spec.source;
    let recorded = status.written_destination.clone();
    let ever_projected = status.destination_name.is_some() || recorded.is_some();

    let read = match read_source(ctx, source, &waker, Tier::Cluster, ever_projected).await {
        Ok(read) => read,
        Err(problem) => {
            let withdrawn = match &problem {
                Problem::Withdraw { resource, .. } => {
                    sweep(
                        ctx,
                        &owner,
                        &about,
                        recorded.as_ref(),
                        Some((&source.group_kind(), resource)),
                        &BTreeSet::new(),
                    )
                    .await
                }
                Problem::Report { .. } => false,
            };
            return Err(problem.fail(ctx, &about, recorded, withdrawn).await);
        }
    };
    let resolved = read.resolved_message.clone();

    let rule = match TargetRule::of(&cp.spec.destination) {
        Ok(rule) => Arc::new(rule),
        Err(e) => {
            ctx.namespaces.forget(&cp_ref);
            ctx.events
                .warning(&about, "TargetResolutionFailed", Verb::Validate, e.0.clone())
                .await;
            return Err(Failure {
                outcome: Outcome::DestinationFailed {
                    resolved,
                    reason: "TargetResolutionFailed".into(),
                    message: e.0,
                },
                retry: Retry::OnChange,
                written: recorded,
            });
        }
    };
    ctx.namespaces.set_rule(&cp_ref, rule.clone());
    ctx.namespaces.synced().await;
    let name = destination_name(cp);
    let source_namespace = (name == source.name).then_some(source.namespace.as_str());
    let targets = rule.resolve(&ctx.namespaces.snapshot(), source_namespace);

    let source_value = serde_json::to_value(&read.object).map_err(|e| Failure {
        outcome: Outcome::DestinationFailed {
            resolved: resolved.clone(),
            reason: "DestinationCreateFailed".into(),
            message: e.to_string(),
        },
        retry: Retry::Backoff,
        written: recorded.clone(),
    })?;
    let results: Vec<(String, Result<Written, WriteError>)> =
        futures::stream::iter(targets.write.iter().cloned())
            .map(|namespace| {
                let target = Target {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                let desired = build_destination(&source_value, cp.spec.overlay.as_ref(), &owner, &target);
                let api =
                    Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &read.resource);
                let (read, owner) = (&read, &owner);
                async move {
                    let result = write_copy(
                        &ctx.watches,
                        &api,
                        &read.group_kind,
                        &read.resource,
                        &read.copies,
                        &desired,
                        owner,
                    )
                    .await;
                    (namespace, result)
                }
            })
            .buffer_unordered(ctx.settings.write_concurrency.max(1))
            .collect()
            .await;

    let mut created = Vec::new();
    let mut updated = Vec::new();
    let mut failures = Vec::new();
    let mut waiting = Vec::new();
    for (namespace, result) in results {
        match result {
            Ok(Written::Created) => created.push(namespace),
            Ok(Written::Updated) => updated.push(namespace),
            Ok(Written::Recreated(why)) => {
                let note =
                    format!("recreated {namespace}/{name} because an in-place update was refused: {why}");
                ctx.events
                    .normal(&about, "DestinationRecreated", Verb::Update, note)
                    .await;
                updated.push(namespace);
            }
            Ok(Written::Unchanged) => {}
            Err(e) => {
                if e.is_conflict() {
                    waiting.push(ObjectKey {
                        group_kind: read.group_kind.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    });
                }
                ctx.events
                    .warning(
                        &about,
                        e.reason(),
                        e.verb(),
                        format!("{namespace}/{name}: {}", e.message()),
                    )
                    .await;
                failures.push(NamespaceFailure {
                    namespace,
                    reason: e.reason().to_owned(),
                    message: e.message(),
                });
            }
        }
    }
    ctx.watches.set_waiting(&waker, waiting);
    let gvk = gvk_display(&read.resource);
    let from = format!("{}/{}", source.namespace, source.name);
    if !created.is_empty() {
        if status.destination_name.is_none() {
            observe_first_copy(cp, ctx);
        }
        let note = format!(
            "projected {gvk} {from} to {}",
            list_namespaces(&mut created, &name)
        );
        ctx.events.normal(&about, "Projected", Verb::Create, note).await;
    }
    if !updated.is_empty() {
        let note = format!("updated {gvk} {from} to {}", list_namespaces(&mut updated, &name));
        ctx.events.normal(&about, "Updated", Verb::Update, note).await;
    }

    // Copies no longer wanted: namespaces that left the list or the selector, an old name, an old kind.
    let keep: BTreeSet<String> = targets
        .write
        .iter()
        .chain(&targets.terminating)
        .cloned()
        .collect();
    let stale = recorded.filter(|old| old.group != read.resource.group || old.kind != read.resource.kind);
    let mut cleaned = remove_unwanted(
        ctx,
        &owner,
        &about,
        &read.group_kind,
        &read.resource,
        &read.copies,
        &keep,
        &name,
    )
    .await;
    if stale.is_some() {
        cleaned &= sweep(ctx, &owner, &about, stale.as_ref(), None, &BTreeSet::new()).await;
    }

    let written = WrittenDestination {
        group: read.resource.group.clone(),
        version: read.resource.version.clone(),
        kind: read.resource.kind.clone(),
        name: name.clone(),
    };
    let namespaces_written = (targets.write.len() - failures.len()) as i32;
    let (outcome, retry) = match summarize_failures(&failures) {
        Some((reason, message, _)) => {
            let only_conflicts = failures.iter().all(|f| f.reason == "DestinationConflict");
            let retry = if only_conflicts && cleaned {
                Retry::OnChange
            } else {
                Retry::Backoff
            };
            (
                Outcome::DestinationFailed {
                    resolved,
                    reason,
                    message,
                },
                Some(retry),
            )
        }
        None if !cleaned => (
            Outcome::DestinationFailed {
                resolved,
                reason: "DestinationDeleteFailed".into(),
                message: "copies no longer wanted could not be removed yet".into(),
            },
            Some(Retry::Backoff),
        ),
        None => (
            Outcome::Projected {
                resolved,
                note: note_for(&targets),
            },
            None,
        ),
    };
    Ok(FanOut {
        written,
        namespaces_written,
        failures,
        outcome,
        retry,
    })
}

/// `DestinationWritten`'s message on success: what was not written, and why.
fn note_for(targets: &Targets) -> String {
    let mut parts = vec![format!("{} namespaces", targets.write.len())];
    if !targets.pending.is_empty() {
        parts.push(format!("pending until created: {}", targets.pending.join(", ")));
    }
    if !targets.terminating.is_empty() {
        parts.push(format!(
            "skipped while terminating: {}",
            targets.terminating.join(", ")
        ));
    }
    if let Some(ns) = &targets.skipped_source {
        parts.push(format!("skipped {ns}: the copy would be the source itself"));
    }
    parts.join("; ")
}

/// `ns-a/name, ns-b/name, ... and N more`, sorted.
fn list_namespaces(namespaces: &mut [String], name: &str) -> String {
    namespaces.sort();
    let named: Vec<String> = namespaces
        .iter()
        .take(NAMED_IN_EVENTS)
        .map(|ns| format!("{ns}/{name}"))
        .collect();
    let more = namespaces.len().saturating_sub(NAMED_IN_EVENTS);
    if more > 0 {
        format!("{} and {more} more", named.join(", "))
    } else {
        named.join(", ")
    }
}

fn observe_first_copy(cp: &ClusterProjection, ctx: &Context) {
    if let Some(created) = cp.meta().creation_timestamp.as_ref() {
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

/// Removes our copies of one kind that are outside `keep` or carry another name. Returns whether
/// all are gone.
#[allow(clippy::too_many_arguments)]
async fn remove_unwanted(
    ctx: &Context,
    owner: &Owner,
    about: &ObjectReference,
    group_kind: &GroupKind,
    resource: &ApiResource,
    copies: &Store<DynamicObject>,
    keep: &BTreeSet<String>,
    name: &str,
) -> bool {
    let unwanted: Vec<Arc<DynamicObject>> = copies
        .state()
        .into_iter()
        .filter(|o| owner.owns(o.metadata.annotations.as_ref()))
        .filter(|o| !keep.contains(&o.namespace().unwrap_or_default()) || o.name_any() != name)
        .collect();
    remove_all(ctx, owner, about, group_kind, resource, &unwanted, false).await
}

/// Removes every copy of `owner` of the recorded kind and of the current kind (all namespaces but
/// `keep`). Returns whether all are gone.
async fn sweep(
    ctx: &Context,
    owner: &Owner,
    about: &ObjectReference,
    recorded: Option<&WrittenDestination>,
    current: Option<(&GroupKind, &ApiResource)>,
    keep: &BTreeSet<String>,
) -> bool {
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
        let mine: Vec<Arc<DynamicObject>> = copies
            .state()
            .into_iter()
            .filter(|o| o.labels().get(owner.uid_label_key()).map(String::as_str) == Some(owner.uid()))
            .filter(|o| !keep.contains(&o.namespace().unwrap_or_default()))
            .collect();
        all_gone &= remove_all(ctx, owner, about, &group_kind, &resource, &mine, true).await;
    }
    all_gone
}

/// Deletes the given copies that `owner` still owns, reporting deletions (and, when
/// `report_left_alone`, copies kept because their ownership annotation was removed or changed).
async fn remove_all(
    ctx: &Context,
    owner: &Owner,
    about: &ObjectReference,
    group_kind: &GroupKind,
    resource: &ApiResource,
    objects: &[Arc<DynamicObject>],
    report_left_alone: bool,
) -> bool {
    let results: Vec<(String, Result<Removed, kube::Error>)> = futures::stream::iter(objects.iter().cloned())
        .map(|object| async move {
            let namespace = object.namespace().unwrap_or_default();
            let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, resource);
            let result = remove_known(&ctx.watches, &api, group_kind, &object, owner).await;
            (format!("{namespace}/{}", object.name_any()), result)
        })
        .buffer_unordered(ctx.settings.write_concurrency.max(1))
        .collect()
        .await;
    let mut deleted = Vec::new();
    let mut all_gone = true;
    for (copy, result) in results {
        match result {
            Ok(Removed::Deleted) => deleted.push(copy),
            Ok(Removed::LeftAlone) if report_left_alone => {
                ctx.events
                    .normal(
                        about,
                        "DestinationLeftAlone",
                        Verb::Delete,
                        format!("{copy} (not owned)"),
                    )
                    .await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(copy, error = %e, "could not remove copy");
                all_gone = false;
            }
        }
    }
    if !deleted.is_empty() {
        deleted.sort();
        let more = deleted.len().saturating_sub(NAMED_IN_EVENTS);
        deleted.truncate(NAMED_IN_EVENTS);
        let note = if more > 0 {
            format!("{} and {more} more", deleted.join(", "))
        } else {
            deleted.join(", ")
        };
        ctx.events
            .normal(about, "DestinationDeleted", Verb::Delete, note)
            .await;
    }
    all_gone
}

/// Deletion of the ClusterProjection: every copy it owns goes first, across the cluster.
async fn cleanup(cp: &ClusterProjection, ctx: &Context) -> Result<Action, Error> {
    let owner = owner_of(cp);
    let about = cp.object_ref(&());
    let recorded = cp.status.as_ref().and_then(|s| s.written_destination.clone());
    let current = ctx
        .discovery
        .resolve(&cp.spec.source)
        .await
        .ok()
        .map(|r| (cp.spec.source.group_kind(), r.resource));
    let all_gone = sweep(
        ctx,
        &owner,
        &about,
        recorded.as_ref(),
        current.as_ref().map(|(gk, r)| (gk, r)),
        &BTreeSet::new(),
    )
    .await;
    if !all_gone {
        return Err(Error::Retry {
            reason: "DestinationDeleteFailed".into(),
            message: "copies could not be removed yet".into(),
        });
    }
    let cp_ref = ObjectRef::from_obj(cp);
    ctx.namespaces.forget(&cp_ref);
    ctx.watches.forget(&Waker::Cluster(cp_ref));
    // The backoff is reset by `reconcile` once the finalizer is removed too.
    Ok(Action::await_change())
}
