//! Either CR kind, as the plugin reads it: seen alike through `shared::api::kind` (its name,
//! source, rules, copies' name and status), read and listed with its events.

use crate::{cluster::Cluster, exit::Failure};
use anyhow::Context as _;
use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ListParams};
use shared::{
    api::{
        crd::{ClusterProjection, Projection},
        kind::{CrName, CrView, ProjectionCr},
    },
    inspect::copy_of::kubectl_name,
};

/// A Projection or a ClusterProjection.
#[derive(Clone, Debug)]
pub enum AnyCr {
    Projection(Projection),
    Cluster(ClusterProjection),
}

impl ProjectionCr for AnyCr {
    fn view(&self) -> CrView<'_> {
        match self {
            Self::Projection(p) => p.view(),
            Self::Cluster(c) => c.view(),
        }
    }
}

impl AnyCr {
    /// `resource.group/name`, as `kubectl get -o name` prints it (a Projection's namespace is not
    /// part of it, as with kubectl).
    pub fn resource_name(&self) -> String {
        match self {
            Self::Projection(p) => format!(
                "projection.projection.sh/{}",
                p.metadata.name.as_deref().unwrap_or_default()
            ),
            Self::Cluster(c) => format!(
                "clusterprojection.projection.sh/{}",
                c.metadata.name.as_deref().unwrap_or_default()
            ),
        }
    }

    /// Takes the UID and the status of `stored`, the CR of the same kind and name in the cluster: a
    /// pass over this spec then finds that CR's copies and records, as the controller's next would.
    pub fn take_state_of(&mut self, stored: &AnyCr) {
        match (self, stored) {
            (Self::Projection(p), Self::Projection(s)) => {
                p.metadata.uid = s.metadata.uid.clone();
                p.status = s.status.clone();
            }
            (Self::Cluster(c), Self::Cluster(s)) => {
                c.metadata.uid = s.metadata.uid.clone();
                c.status = s.status.clone();
            }
            _ => {}
        }
    }

    /// Reads the CR `name` names; `Ok(None)` when it does not exist.
    pub async fn get(cluster: &Cluster, name: &CrName) -> Result<Option<Self>, Failure> {
        let found = match name {
            CrName::Projection { namespace, name } => {
                Api::<Projection>::namespaced(cluster.client.clone(), namespace)
                    .get_opt(name)
                    .await
                    .map(|p| p.map(Self::Projection))
            }
            CrName::ClusterProjection { name } => Api::<ClusterProjection>::all(cluster.client.clone())
                .get_opt(name)
                .await
                .map(|c| c.map(Self::Cluster)),
        };
        Ok(found.with_context(|| format!("reading {}", kubectl_name(name)))?)
    }

    /// Its latest `count` events, oldest first.
    pub async fn events(&self, cluster: &Cluster, count: usize) -> Result<Vec<Event>, Failure> {
        // The controller puts a ClusterProjection's events in `default`.
        let namespace = self.view().home().unwrap_or("default").to_owned();
        let api = Api::<Event>::namespaced(cluster.client.clone(), &namespace);
        let uid = self.view().uid().to_owned();
        let mut events: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .context("listing events")?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .is_some_and(|r| r.uid.as_deref() == Some(uid.as_str()))
            })
            .collect();
        events.sort_by_key(last_seen);
        let skip = events.len().saturating_sub(count);
        Ok(events.split_off(skip))
    }
}

/// When an event was last seen (its series' last observation, else its time).
pub fn last_seen(event: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(event.event_time.as_ref().map(|t| t.0))
        .or(event.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or(event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Every CR of both kinds.
pub async fn every_cr(cluster: &Cluster) -> Result<Vec<AnyCr>, Failure> {
    let (projections, clusters) = cluster.all_crs().await?;
    Ok(projections
        .into_iter()
        .map(AnyCr::Projection)
        .chain(clusters.into_iter().map(AnyCr::Cluster))
        .collect())
}
