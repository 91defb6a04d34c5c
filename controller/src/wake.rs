//! Waking reconciles from the watch tasks. Wakes go only to a running controller: a standby (which
//! watches and indexes before it holds the lease) keeps the set of CRs it would have woken, and
//! reconciles those first when it takes over (every other CR follows).

use crate::index::CrRef;
use kube::runtime::reflector::ObjectRef;
use shared::{
    api::crd::{ClusterProjection, Projection},
    shard::recent::SourceObject,
};
use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};
use tokio::sync::mpsc::UnboundedSender;

/// Senders that wake each kind of CR.
#[derive(Clone)]
pub struct Wake {
    /// Wakes Projections.
    pub projections: UnboundedSender<ObjectRef<Projection>>,
    /// Wakes ClusterProjections.
    pub clusters: UnboundedSender<ObjectRef<ClusterProjection>>,
    /// Whether the reconcilers run (this replica leads).
    pub leading: Arc<AtomicBool>,
    /// The CRs woken while the reconcilers did not run.
    pub missed: Arc<Mutex<HashSet<CrRef>>>,
    /// With shards: told of each source change.
    pub shard: Option<Arc<crate::shard::Shard>>,
}

impl Wake {
    /// Queues a reconcile of `cr`, if the reconcilers run.
    pub fn send(&self, cr: CrRef) {
        if !self.leading.load(Ordering::Acquire) {
            self.missed.lock().unwrap_or_else(|e| e.into_inner()).insert(cr);
            return;
        }
        // A closed channel means the controller is shutting down: nothing left to wake.
        let _ = match cr {
            CrRef::Projection(r) => self.projections.send(r).map_err(|_| ()),
            CrRef::Cluster(r) => self.clusters.send(r).map_err(|_| ()),
        };
    }

    /// A source object changed: with shards, remembered for a while, since the ring may move a CR
    /// of another replica that reads it here (`Shard::source_changed`).
    pub fn source_changed(&self, object: impl FnOnce() -> Option<SourceObject>) {
        if let Some((shard, object)) = self.shard.as_ref().zip(object()) {
            shard.source_changed(object);
        }
    }

    /// Whether, with shards, the CR with this uid is another replica's in the current ring.
    pub fn owned_elsewhere(&self, uid: Option<&str>) -> bool {
        self.shard
            .as_ref()
            .zip(uid)
            .is_some_and(|(shard, uid)| shard.owned_by_another(uid))
    }

    /// The CRs woken while the reconcilers did not run, forgotten once returned.
    pub fn take_missed(&self) -> Vec<CrRef> {
        std::mem::take(&mut *self.missed.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_keeps_its_wakes_for_the_takeover() {
        let (projections, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let (clusters, _) = tokio::sync::mpsc::unbounded_channel();
        let wake = Wake {
            projections,
            clusters,
            leading: Arc::default(),
            missed: Arc::default(),
            shard: None,
        };
        let a = CrRef::Projection(ObjectRef::new("a").within("ns"));
        wake.send(a.clone());
        wake.send(a.clone());
        assert!(woken.try_recv().is_err(), "nothing runs before the lease");
        assert_eq!(wake.take_missed(), vec![a.clone()]);
        assert!(wake.take_missed().is_empty(), "taken once");
        wake.leading.store(true, Ordering::Release);
        wake.send(a);
        assert_eq!(woken.try_recv().ok().map(|r| r.name), Some("a".to_owned()));
        assert!(wake.take_missed().is_empty());
    }
}
