//! What a replica does before it leads: it watches the CRs, the namespaces and the source kinds
//! its CRs name, and keeps the indexes, exactly as the leader does; only reconciles (which write)
//! wait for the lease. A standby that takes over thus starts with synced caches: its first
//! reconciles find the source kinds resolved and the copies' stores listed.

use crate::{cache::stored_cr::StoredCr, context::SourceAccess, pass::kind::ProjectionKind};
use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use shared::api::{crd::SourceRef, kind::Scope, source::GroupKind};
use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};
use tokio::sync::mpsc::UnboundedSender;

/// A CR (as the store keeps it) whose source kind a standby prepares watches for.
pub trait Warmable {
    /// Its source and the scope of its copies; `None` if the CR does not decode (reported by its
    /// reconcile once this replica leads).
    fn warm_up(&self) -> Option<(SourceRef, Scope)>;
}

impl<K: ProjectionKind> Warmable for StoredCr<K> {
    fn warm_up(&self) -> Option<(SourceRef, Scope)> {
        Some((self.expand().ok()?.view().source.clone(), K::SCOPE))
    }
}

/// Drives the watch of one CR kind (which keeps its store): while this replica leads, each relevant
/// change goes to the reconciler (`reconcile`); before, its source kind goes to the warm-up.
pub async fn feed<K: Warmable>(
    changes: impl Stream<Item = Result<K, watcher::Error>>,
    reconcile: UnboundedSender<K>,
    warm: UnboundedSender<(SourceRef, Scope)>,
    leading: Arc<AtomicBool>,
) {
    changes
        .for_each(|change| {
            match change {
                Ok(cr) if leading.load(Ordering::Acquire) => {
                    // Closed when the reconciler shuts down: nothing left to do.
                    let _ = reconcile.send(cr);
                }
                Ok(cr) => {
                    if let Some(source) = cr.warm_up() {
                        let _ = warm.send(source);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "CR watch error; retrying"),
            }
            std::future::ready(())
        })
        .await;
}

/// Starts the watches of every source kind the CRs of a standby name (once per kind and scope), so
/// they have synced when it takes over. Read-only: discovery and the watches.
pub async fn warm_up(
    access: Arc<SourceAccess>,
    mut sources: tokio::sync::mpsc::UnboundedReceiver<(SourceRef, Scope)>,
) {
    let mut warmed: HashSet<(GroupKind, String, Scope)> = HashSet::new();
    while let Some((source, scope)) = sources.recv().await {
        let group_kind = source.group_kind();
        let key = (group_kind.clone(), source.version.clone(), scope);
        if warmed.contains(&key) {
            continue;
        }
        let Ok(resolved) = access.discovery.resolve(&source).await else {
            // Unknown kinds are resolved by the reconcile once this replica leads.
            continue;
        };
        match access
            .watches
            .ensure(&group_kind, &resolved.resource, scope)
            .await
        {
            Ok(_) => tracing::debug!(kind = %group_kind, ?scope, "standby: watches warm"),
            Err(e) => tracing::debug!(kind = %group_kind, error = %e, "standby: could not warm the watches"),
        }
        warmed.insert(key);
    }
}
