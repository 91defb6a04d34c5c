//! The apply step of a pass: the plan's writes and removals, a capped number at a time, and the
//! withdrawal of every copy of a CR (its deletion, or its source gone). Every write and removal
//! goes through `writer`, the only code that changes copies; what to write and remove is decided by
//! `shared::pass::plan`.

use crate::{
    cache::{cached_copy::CachedCopy, copy_store::CopyStore},
    context::CopyCluster,
    discovery::recorded_resource,
    events::Events,
    pass::{kind::ProjectionKind, read::Source},
    writer::{CopyApis, WriteError, Written, release_copy, release_known, write_copy},
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};
use shared::{
    api::{crd::WrittenDestination, reason::Reason, source::GroupKind},
    copy::{content::BuiltContent, destination::Target, ownership::Owner},
    pass::{
        lifecycle::{Release, stamp_request},
        plan::{CopyAt, CopyView, Destinations, Plan, Removed, removal_events, withdrawal},
        tally::CopyWrite,
    },
    policy::write_as::CopyWriter,
};
use std::sync::Arc;

/// Our copies of the current kind as the plan reads them: for a ClusterProjection every copy in
/// its tier's cache that it owns; for a Projection, whose copies can only be in its own namespace,
/// those under the names it knows (`names`), looked up rather than scanned.
pub fn existing_copies(
    store: &CopyStore,
    owner: &Owner,
    scope: Destinations,
    home: Option<&str>,
    names: &[&str],
) -> Vec<Arc<CachedCopy>> {
    let mut found: Vec<Arc<CachedCopy>> = match (scope, home) {
        (Destinations::OwnNamespace, Some(home)) => {
            names.iter().filter_map(|name| store.get(home, name)).collect()
        }
        _ => store.all(),
    };
    found.retain(|c| c.is_owned_by(owner));
    found.dedup_by(|a, b| a.path() == b.path());
    found
}

/// The plan's view of cached copies.
pub fn views(copies: &[Arc<CachedCopy>]) -> Vec<CopyView<'_>> {
    copies
        .iter()
        .map(|c| CopyView {
            namespace: c.namespace(),
            name: c.name(),
            ours: true,
        })
        .collect()
}

/// Builds and writes the copy in each namespace the plan writes, a capped number at a time,
/// stamped with the `requested` reconcile, if any.
pub async fn write_all(
    cluster: &CopyCluster,
    read: &Source,
    built: &BuiltContent,
    owner: &Owner,
    plan: &Plan,
    requested: Option<&str>,
) -> Vec<(String, CopyWrite)> {
    let recreatable = cluster.recreate_on_immutable.allows(&read.group_kind);
    // Written as the author where the controller impersonates authors (`CopyWriter::Author`).
    let author = match (cluster.writer, read.author.as_ref()) {
        (CopyWriter::Author, Some(grant)) => match cluster.author_clients.of(&grant.author) {
            Ok(client) => Some((client, &grant.author)),
            Err(message) => {
                let failed = CopyWrite::Failed {
                    reason: Reason::DestinationForbidden,
                    message: format!("the copies cannot be written as their author: {message}"),
                };
                return plan.write.iter().map(|ns| (ns.clone(), failed.clone())).collect();
            }
        },
        _ => None,
    };
    futures::stream::iter(plan.write.iter().cloned())
        .map(|namespace| {
            let target = Target {
                namespace: namespace.clone(),
                name: plan.copies.name.clone(),
            };
            let mut desired = built.place(owner, &target);
            stamp_request(&mut desired, requested);
            let own =
                Api::<DynamicObject>::namespaced_with(cluster.client.clone(), &namespace, &read.resource);
            let apis = match &author {
                Some((client, author)) => CopyApis {
                    own,
                    writer: Api::namespaced_with(client.clone(), &namespace, &read.resource),
                    author: Some((*author).clone()),
                },
                None => CopyApis::own(own),
            };
            async move {
                let written = write_copy(
                    &cluster.journal,
                    &apis,
                    &read.group_kind,
                    &read.copies,
                    &desired,
                    owner,
                    plan.existing,
                    recreatable,
                )
                .await;
                (namespace, copy_write(written))
            }
        })
        .buffer_unordered(cluster.concurrency)
        .collect()
        .await
}

/// A write's result as the plan's conclusion reads it.
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

/// The copies of one kind a removal works on.
pub struct KindCopies<'a> {
    /// Their group and kind.
    pub group_kind: &'a GroupKind,
    /// Their API resource.
    pub resource: &'a ApiResource,
    /// Our cached copies of the kind, when its watch runs.
    pub store: Option<&'a CopyStore>,
}

/// Releases (deletes or orphans, as `release` says) the copies at `copies` that `owner` still
/// owns, a capped number at a time, and reports what it did with one event per kind of result.
/// `Ok` when all are out of our hands, else what kept the first one.
pub async fn remove(
    (cluster, events): (&CopyCluster, &Events),
    (owner, about): (&Owner, &ObjectReference),
    kind: KindCopies<'_>,
    copies: &[CopyAt],
    release: Release,
) -> Result<(), String> {
    let KindCopies {
        group_kind,
        resource,
        store,
    } = kind;
    let results: Vec<(String, Result<Removed, kube::Error>)> = futures::stream::iter(copies.iter().cloned())
        .map(|at| async move {
            let api = Api::<DynamicObject>::namespaced_with(cluster.client.clone(), &at.namespace, resource);
            let known = store
                .and_then(|s| s.get(&at.namespace, &at.name))
                .and_then(|c| c.object());
            let result = match known {
                Some(object) => {
                    release_known(&cluster.journal, &api, group_kind, &object, owner, release).await
                }
                // Not cached (or undecodable, never expected): read it instead.
                None => release_copy(&cluster.journal, &api, group_kind, &at.name, owner, release).await,
            };
            (at.path(), result)
        })
        .buffer_unordered(cluster.concurrency)
        .collect()
        .await;
    let mut done = Vec::new();
    let mut left = Ok(());
    for (copy, result) in results {
        match result {
            Ok(removed) => done.push((copy, removed)),
            Err(e) => {
                let error = crate::error::describe_removal(&e);
                tracing::warn!(copy, error, "could not remove copy");
                left = left.and(Err(format!("{} {copy}: {error}", group_kind.kind)));
            }
        }
    }
    done.sort();
    events.publish_all(about, removal_events(&done)).await;
    left
}

/// Releases (deletes or orphans, as `release` says) every copy `cr` may have written, of the
/// `recorded` kind and of the `current` one (`shared::pass::plan::withdrawal`). `Ok` when none is
/// left in our hands, else what kept one.
pub async fn withdraw<K: ProjectionKind>(
    (cluster, events): (&CopyCluster, &Events),
    cr: &K,
    recorded: Option<&WrittenDestination>,
    current: Option<(GroupKind, ApiResource)>,
    release: Release,
) -> Result<(), String> {
    let current_copies = current
        .as_ref()
        .map(|(_, resource)| WrittenDestination::of(resource, &cr.copy_name()));
    let home = cr.home();
    let plan = withdrawal(
        K::DESTINATIONS,
        home.as_deref(),
        recorded,
        current_copies.as_ref(),
    );
    let mut left = Ok(());
    for (copies, named) in plan.kinds {
        let group_kind = GroupKind {
            group: copies.group.clone(),
            kind: copies.kind.clone(),
        };
        let resource = match &current {
            Some((gk, resource)) if *gk == group_kind => resource.clone(),
            _ => match recorded_resource(&cluster.client, &copies).await {
                Ok(Some(resource)) => resource,
                // Its kind is no longer served: its objects went with its CRD.
                Ok(None) => continue,
                Err(e) => {
                    left = left.and(Err(e));
                    continue;
                }
            },
        };
        left = left.and(sweep((cluster, events), cr, (&group_kind, &resource), &named, release).await);
    }
    left
}

/// Releases every copy of one kind that carries `cr`'s UID label, and the copies at `named` (the
/// coordinates a Projection knows, found or not by their label). A kind whose copies cannot be
/// listed is still released at the named coordinates; without any, that is what kept them.
pub async fn sweep<K: ProjectionKind>(
    (cluster, events): (&CopyCluster, &Events),
    cr: &K,
    (group_kind, resource): (&GroupKind, &ApiResource),
    named: &[CopyAt],
    release: Release,
) -> Result<(), String> {
    let owner = cr.owner();
    let about = cr.object_ref(&());
    let store = match cluster.watches.ensure(group_kind, resource, K::TIER).await {
        Ok(store) => Some(store),
        Err(e) if named.is_empty() => {
            tracing::warn!(error = %e, "cannot list copies to remove");
            return Err(format!("listing the {} copies: {e}", group_kind.kind));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot list copies to remove; removing those at known coordinates");
            None
        }
    };
    let mut copies: Vec<CopyAt> = store
        .iter()
        .flat_map(|s| s.all())
        .filter(|c| c.is_labelled_for(&owner))
        .map(|c| CopyAt {
            namespace: c.namespace().to_owned(),
            name: c.name().to_owned(),
        })
        .collect();
    for at in named {
        if !copies.contains(at) {
            copies.push(at.clone());
        }
    }
    let kind = KindCopies {
        group_kind,
        resource,
        store: store.as_ref(),
    };
    let removed = remove((cluster, events), (&owner, &about), kind, &copies, release).await;
    // A kind swept only for this removal (an earlier spec's) needs no watch afterwards.
    cluster.watches.release_if_unread(group_kind);
    removed
}
