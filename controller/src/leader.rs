//! Leader election through a `coordination.k8s.io` Lease, so several replicas can run and only one
//! writes. A replica that loses the lease exits, and its pod restarts as a standby.

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use std::time::Duration;
use tokio::{sync::watch, task::JoinHandle};

/// The Lease's name, in the controller's namespace.
pub const LEASE_NAME: &str = shared::api::keys::LEADER_LEASE;

/// A held lease.
pub struct Leadership {
    is_leader: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
}

impl Leadership {
    /// Waits until this process holds the lease.
    pub async fn acquire(
        client: Client,
        namespace: &str,
        identity: &str,
        duration: Duration,
    ) -> anyhow::Result<Self> {
        let seconds = duration.as_secs().max(2);
        let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(seconds)
            .with_grace((seconds / 3).clamp(1, 5))
            // One field manager per replica: taking a free Lease is a server-side apply that must
            // conflict when another replica took it first. Under one shared manager the second
            // apply silently overwrote the first's holder, and both led until the next renewal.
            .with_field_manager(format!("projection-controller-{identity}"))
            .build()
            .await?;
        let (mut is_leader, task) = manager.watch().await;
        tracing::info!(lease = LEASE_NAME, namespace, identity, "waiting for leadership");
        is_leader.wait_for(|leader| *leader).await?;
        tracing::info!(lease = LEASE_NAME, identity, "acquired leadership");
        Ok(Self { is_leader, task })
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&mut self) {
        let _ = self.is_leader.wait_for(|leader| !*leader).await;
    }

    /// Gives the lease up so a standby takes over at once.
    pub async fn release(self) {
        drop(self.is_leader);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) => tracing::info!("released leadership"),
            other => {
                tracing::warn!(result = ?other.map(|r| r.map(|r| r.map(|_| ()))), "could not release leadership cleanly")
            }
        }
    }
}
