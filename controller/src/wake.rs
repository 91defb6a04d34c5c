//! Waking reconciles from the watch tasks. Wakes go only to a running controller: a standby (which
//! watches before it holds the lease) keeps the set of CRs it would have woken, and the source
//! objects that changed lately, and reconciles the CRs of both first when it takes over (every other
//! CR follows).

use crate::index::CrRef;
use kube::runtime::reflector::ObjectRef;
use shared::{
    api::crd::{ClusterProjection, Projection, SourceRef},
    shard::recent::{RecentChanges, SourceObject},
};
use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// How many source changes are remembered (within twice the Lease): enough for the edits made
/// while a departed replica's Lease runs out, bounded under a flood of edits.
const SOURCE_CHANGES_KEPT: usize = 8192;

/// The source objects that changed lately, kept for twice the Lease's duration. A replica that
/// takes CRs over (the lease, or with shards the ring's CRs of a departed replica) sends first the
/// ones reading one of them: an edit made while no one reconciled them left their copies stale,
/// and no watch of its own woke them (a standby indexes no CR's reads; with shards a replica wakes
/// only its own CRs).
pub struct RecentSources(Mutex<RecentChanges<SourceObject>>);

impl RecentSources {
    /// Kept for twice `lease`.
    pub fn new(lease: Duration) -> Arc<Self> {
        Arc::new(Self(Mutex::new(RecentChanges::new(
            lease * 2,
            SOURCE_CHANGES_KEPT,
        ))))
    }

    fn record(&self, object: SourceObject) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(object, Instant::now());
    }

    /// The source objects that changed lately, the latest first.
    pub fn newest_first(&self) -> Vec<SourceObject> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .newest_first(Instant::now())
            .into_iter()
            .cloned()
            .collect()
    }

    /// Whether the object `source` names changed lately.
    pub fn changed_lately(&self, source: &SourceRef) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .changed_lately(&SourceObject::named_by(source), Instant::now())
    }
}
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
    /// With shards: whose CR a copy is.
    pub shard: Option<Arc<crate::shard::Shard>>,
    /// The source objects that changed lately.
    pub recent_sources: Arc<RecentSources>,
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

    /// Queues a reconcile of `cr` woken by a watch's list (its start, or a relist): a standby does
    /// not keep it, since the takeover sends every CR anyway, and kept, the list would make every
    /// CR a "missed" one, leaving nothing to send first.
    pub fn send_listed(&self, cr: CrRef) {
        if self.leading.load(Ordering::Acquire) {
            self.send(cr);
        }
    }

    /// A source object changed: remembered for a while, for a takeover (`RecentSources`).
    pub fn source_changed(&self, object: impl FnOnce() -> Option<SourceObject>) {
        if let Some(object) = object() {
            self.recent_sources.record(object);
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

    /// The wakes of a standby, and what reaches its Projection reconciler.
    fn standby() -> (Wake, tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Projection>>) {
        let (projections, woken) = tokio::sync::mpsc::unbounded_channel();
        let (clusters, _) = tokio::sync::mpsc::unbounded_channel();
        let wake = Wake {
            projections,
            clusters,
            leading: Arc::default(),
            missed: Arc::default(),
            shard: None,
            recent_sources: RecentSources::new(Duration::from_secs(15)),
        };
        (wake, woken)
    }

    #[test]
    fn a_standby_keeps_its_wakes_for_the_takeover() {
        let (wake, mut woken) = standby();
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

    #[test]
    fn a_standby_does_not_keep_what_its_lists_wake() {
        let (wake, mut woken) = standby();
        let listed = CrRef::Projection(ObjectRef::new("listed").within("ns"));
        let changed = CrRef::Projection(ObjectRef::new("changed").within("ns"));
        wake.send_listed(listed.clone());
        wake.send(changed.clone());
        assert_eq!(wake.take_missed(), vec![changed], "only the change is kept");
        wake.leading.store(true, Ordering::Release);
        wake.send_listed(listed);
        assert_eq!(woken.try_recv().ok().map(|r| r.name), Some("listed".to_owned()));
    }
}
