//! The apply step of a pass: the plan's writes and removals, a capped number at a time, and the
//! withdrawal of every copy of a CR (its deletion, or its source gone). Every write and removal
//! goes through [`writer::Writer`], the only code that changes copies; what to write and remove is
//! decided by `shared::pass::plan`. Nothing here publishes: what a removal did comes back as a
//! [`Removal`], for the report.

pub mod writer;

use crate::{
    cache::{cached_copy::CachedCopy, copy_store::CopyStore},
    context::CopyCluster,
    discovery::recorded_resource,
    pass::{apply::writer::Writer, read::Source},
};
use futures::StreamExt;
use kube::{
    Api,
    api::{ApiResource, DynamicObject},
};
use shared::{
    api::{crd::WrittenDestination, kind::CrView, kind::Scope, reason::Reason, source::GroupKind},
    copy::{content::BuiltContent, destination::Target, ownership::Owner},
    pass::{
        lifecycle::{Release, stamp_request},
        plan::{CopyAt, CopyView, Plan, withdrawal},
        tally::{CopyWrite, Removal, Removed, removal_events},
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
    scope: Scope,
    home: Option<&str>,
    names: &[&str],
) -> Vec<Arc<CachedCopy>> {
    let mut found: Vec<Arc<CachedCopy>> = match (scope, home) {
        (Scope::OwnNamespace, Some(home)) => names.iter().filter_map(|name| store.get(home, name)).collect(),
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

/// Builds and writes the copy in each namespace the plan writes, a capped number at a time: the
/// `built` content placed for `owner` and stamped with the `requested` reconcile, if any.
pub async fn write_all(
    cluster: &CopyCluster,
    read: &Source,
    owner: &Owner,
    plan: &Plan,
    (built, requested): (&BuiltContent, Option<&str>),
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
            let writer = match &author {
                Some((client, author)) => (
                    Api::namespaced_with(client.clone(), &namespace, &read.resource),
                    Some(*author),
                ),
                None => (own.clone(), None),
            };
            let writer = Writer {
                journal: &cluster.journal,
                group_kind: &read.group_kind,
                owner,
                own,
                writer,
                remote: cluster.is_remote(),
            };
            async move {
                let written = writer
                    .write(&read.copies, &desired, plan.existing, recreatable)
                    .await;
                (namespace, written)
            }
        })
        .buffer_unordered(cluster.concurrency)
        .collect()
        .await
}

/// Releases (deletes or orphans, as `release` says) the copies at `copies` that `owner` still owns,
/// of `kind` (its group and kind, its API resource, and our cached copies of it when its watch
/// runs), a capped number at a time: what it did, and what kept any.
pub async fn remove(
    cluster: &CopyCluster,
    owner: &Owner,
    kind: (&GroupKind, &ApiResource, Option<&CopyStore>),
    copies: &[CopyAt],
    release: Release,
) -> Removal {
    let (group_kind, resource, store) = kind;
    let results: Vec<(String, Result<Removed, kube::Error>)> = futures::stream::iter(copies.iter().cloned())
        .map(|at| async move {
            let writer = Writer {
                journal: &cluster.journal,
                group_kind,
                owner,
                own: Api::namespaced_with(cluster.client.clone(), &at.namespace, resource),
                writer: (
                    Api::namespaced_with(cluster.client.clone(), &at.namespace, resource),
                    None,
                ),
                remote: cluster.is_remote(),
            };
            let known = store
                .and_then(|s| s.get(&at.namespace, &at.name))
                .and_then(|c| c.object());
            let result = match known {
                Some(object) => writer.release(&object, release).await,
                // Not cached (or undecodable, never expected): read it instead.
                None => writer.release_named(&at.name, release).await,
            };
            (at.path(), result)
        })
        .buffer_unordered(cluster.concurrency)
        .collect()
        .await;
    let mut done = Vec::new();
    let mut left = Vec::new();
    for (copy, result) in results {
        match result {
            Ok(removed) => done.push((copy, removed)),
            Err(e) => {
                let error = crate::error::describe_removal(&e);
                tracing::warn!(copy, error, "could not remove copy");
                left.push(format!("{} {copy}: {error}", group_kind.kind));
            }
        }
    }
    done.sort();
    left.sort();
    Removal {
        events: removal_events(&done),
        left,
    }
}

/// Releases (deletes or orphans, as `release` says) every copy `cr` may have written, of the
/// `recorded` kind and of the `current` one (`shared::pass::plan::withdrawal`): what it did, and
/// what kept any copy in our hands.
pub async fn withdraw(
    cluster: &CopyCluster,
    cr: &CrView<'_>,
    (recorded, current): (Option<&WrittenDestination>, Option<(GroupKind, ApiResource)>),
    release: Release,
) -> Removal {
    let current_copies = current
        .as_ref()
        .map(|(_, resource)| WrittenDestination::of(resource, cr.copy_name));
    let plan = withdrawal(cr.scope, cr.home(), recorded, current_copies.as_ref());
    let mut removal = Removal::default();
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
                    removal.left.push(e);
                    continue;
                }
            },
        };
        removal = removal.and(sweep(cluster, cr, (&group_kind, &resource), &named, release).await);
    }
    removal
}

/// Releases every copy of one kind that carries `cr`'s UID label, and the copies at `named` (the
/// coordinates a Projection knows, found or not by their label). A kind whose copies cannot be
/// listed is still released at the named coordinates; without any, that is what kept them.
pub async fn sweep(
    cluster: &CopyCluster,
    cr: &CrView<'_>,
    (group_kind, resource): (&GroupKind, &ApiResource),
    named: &[CopyAt],
    release: Release,
) -> Removal {
    let owner = cluster.owner_of(cr);
    let store = match cluster.watches.ensure(group_kind, resource, cr.scope).await {
        Ok(store) => Some(store),
        Err(e) if named.is_empty() => {
            tracing::warn!(error = %e, "cannot list copies to remove");
            return Removal {
                events: Vec::new(),
                left: vec![format!("listing the {} copies: {e}", group_kind.kind)],
            };
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
    let kind = (group_kind, resource, store.as_ref());
    let removed = remove(cluster, &owner, kind, &copies, release).await;
    // A kind swept only for this removal (an earlier spec's) needs no watch afterwards.
    cluster.watches.release_if_unread(group_kind);
    removed
}
