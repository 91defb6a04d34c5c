//! Waking reconciles from the watch tasks. Wakes go only to a running controller: a standby (which
//! watches and indexes before it holds the lease) drops them, since every CR is reconciled when it
//! takes over.

use crate::index::CrRef;
use kube::runtime::reflector::ObjectRef;
use shared::crd::{ClusterProjection, Projection};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
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
}

impl Wake {
    /// Queues a reconcile of `cr`, if the reconcilers run.
    pub fn send(&self, cr: CrRef) {
        if !self.leading.load(Ordering::Acquire) {
            return;
        }
        // A closed channel means the controller is shutting down: nothing left to wake.
        let _ = match cr {
            CrRef::Projection(r) => self.projections.send(r).map_err(|_| ()),
            CrRef::Cluster(r) => self.clusters.send(r).map_err(|_| ()),
        };
    }
}
