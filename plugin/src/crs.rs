//! Either CR kind, as the plugin reads it: its name, source, rules, copies' name, status and events.

use crate::{cluster::Cluster, exit::Failure};
use anyhow::Context as _;
use k8s_openapi::api::events::v1::Event;
use kube::{Api, ResourceExt, api::ListParams};
use shared::{
    api::crd::{ClusterProjection, Condition, Projection, SourceRef},
    copy::content::CopyRules,
    inspect::{
        copy_of::{CrName, kubectl_name},
        summary::{Summary, of_cluster, of_projection},
    },
};

/// A Projection or a ClusterProjection.
#[derive(Clone, Debug)]
pub enum AnyCr {
    Projection(Projection),
    Cluster(ClusterProjection),
}

impl AnyCr {
    /// Its kind and name.
    pub fn name(&self) -> CrName {
        match self {
            Self::Projection(p) => CrName::Projection {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
            },
            Self::Cluster(c) => CrName::ClusterProjection { name: c.name_any() },
        }
    }

    /// `Projection` or `ClusterProjection`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Projection(_) => "Projection",
            Self::Cluster(_) => "ClusterProjection",
        }
    }

    /// Its namespace (empty for a ClusterProjection).
    pub fn namespace(&self) -> String {
        match self {
            Self::Projection(p) => p.namespace().unwrap_or_default(),
            Self::Cluster(_) => String::new(),
        }
    }

    /// Its metadata.
    pub fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            Self::Projection(p) => &p.metadata,
            Self::Cluster(c) => &c.metadata,
        }
    }

    /// `spec.source`.
    pub fn source(&self) -> &SourceRef {
        match self {
            Self::Projection(p) => &p.spec.source,
            Self::Cluster(c) => &c.spec.source,
        }
    }

    /// What its copies carry.
    pub fn rules(&self) -> CopyRules<'_> {
        match self {
            Self::Projection(p) => CopyRules::of_projection(&p.spec),
            Self::Cluster(c) => CopyRules::of_cluster_projection(&c.spec),
        }
    }

    /// The name of its copies.
    pub fn copy_name(&self) -> String {
        match self {
            Self::Projection(p) => p
                .spec
                .destination
                .as_ref()
                .and_then(|d| d.name.clone())
                .unwrap_or_else(|| p.spec.source.name.clone()),
            Self::Cluster(c) => c
                .spec
                .destination
                .name
                .clone()
                .unwrap_or_else(|| c.spec.source.name.clone()),
        }
    }

    /// Its conditions.
    pub fn conditions(&self) -> &[Condition] {
        match self {
            Self::Projection(p) => p.status.as_ref().map(|s| s.conditions.as_slice()),
            Self::Cluster(c) => c.status.as_ref().map(|s| s.conditions.as_slice()),
        }
        .unwrap_or_default()
    }

    /// Its status summed up.
    pub fn summary(&self) -> Summary {
        match self {
            Self::Projection(p) => of_projection(p.spec.controls.suspend, p.status.as_ref()),
            Self::Cluster(c) => of_cluster(c.spec.controls.suspend, c.status.as_ref()),
        }
    }

    /// `status.lastHandledReconcileAt`.
    pub fn last_handled(&self) -> Option<&str> {
        match self {
            Self::Projection(p) => p.status.as_ref()?.last_handled_reconcile_at.as_deref(),
            Self::Cluster(c) => c.status.as_ref()?.last_handled_reconcile_at.as_deref(),
        }
    }

    /// The namespace its events are in (the controller puts a ClusterProjection's in `default`).
    pub fn events_namespace(&self) -> String {
        match self {
            Self::Projection(p) => p.namespace().unwrap_or_default(),
            Self::Cluster(_) => "default".to_owned(),
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
        let api = Api::<Event>::namespaced(cluster.client.clone(), &self.events_namespace());
        let uid = self.meta().uid.clone().unwrap_or_default();
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
