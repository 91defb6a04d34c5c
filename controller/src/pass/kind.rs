//! What differs between the two CR kinds as the pass drives them: their API, the owner stamped on
//! their copies, where the copies go (their targets), and the shape of their status. Everything
//! else of a pass is written once, generic over [`ProjectionKind`].

use crate::{
    index::CrRef,
    namespace_watch::Namespaces,
    queue_metrics::{ControllerMetrics, QueueMetrics},
    watches::{Tier, WatchRegistry},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, Resource, ResourceExt, runtime::reflector::ObjectRef};
use serde::{Serialize, de::DeserializeOwned};
use shared::{
    api::{
        crd::{
            AppliedOnce, ClusterProjection, ClusterProjectionStatus, Condition, CopyControls, Projection,
            ProjectionStatus, SourceRef, WrittenDestination,
        },
        keys::{CLUSTER_PROJECTION_FINALIZER, PROJECTION_FINALIZER},
    },
    copy::{content::CopyRules, ownership::Owner},
    pass::{
        plan::Destinations,
        status::{Outcome, Reached, cluster_status, projection_status},
        targets::{TargetRule, Targets},
    },
};
use std::{fmt::Debug, sync::Arc};

/// One of the two CR kinds, as the pass drives it.
pub trait ProjectionKind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static
{
    /// `Projection` or `ClusterProjection` (also the metric label).
    const KIND: &'static str;
    /// The finalizer that holds the CR until its copies are gone.
    const FINALIZER: &'static str;
    /// Which copy caches hold this kind's copies.
    const TIER: Tier;
    /// Where its copies go.
    const DESTINATIONS: Destinations;
    /// The kind's status.
    type Status: KindStatus;

    /// `spec.source`.
    fn source(&self) -> &SourceRef;
    /// The spec fields both kinds share.
    fn controls(&self) -> &CopyControls;
    /// What its copies carry of the source.
    fn rules(&self) -> CopyRules<'_>;
    /// The name of its copies (`spec.destination.name`, else the source's).
    fn copy_name(&self) -> String;
    /// Its status as it is (empty before the first pass).
    fn status(&self) -> Self::Status;
    /// How the watch indexes name this CR.
    fn waker(&self) -> CrRef;
    /// The owner stamped on this CR's copies.
    fn owner(&self) -> Owner;
    /// The namespace a Projection lives and writes in; `None` for a ClusterProjection.
    fn home(&self) -> Option<String>;
    /// The API the CR itself is read and written through.
    fn api(&self, client: kube::Client) -> Api<Self>;
    /// This kind's queue metrics.
    fn queue(metrics: &QueueMetrics) -> &ControllerMetrics;
    /// Where the copies go now; `Err` is the `TargetResolutionFailed` message.
    fn targets(&self, namespaces: &Namespaces) -> impl Future<Output = Result<Targets, String>> + Send;
    /// Drops what the indexes keep about this CR, once its copies are gone.
    fn forget(&self, watches: &WatchRegistry, namespaces: &Namespaces);
}

/// The status of either kind, as the pass reads and writes it.
pub trait KindStatus: Serialize + PartialEq + Clone + Default + Send + Sync {
    /// Its conditions.
    fn conditions(&self) -> &[Condition];
    /// Its conditions, to replace.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// Where `syncPolicy: ApplyOnce` created copies.
    fn applied_once(&self) -> Option<&AppliedOnce>;
    /// The copies it records for cleanup.
    fn recorded(&self) -> Option<&WrittenDestination>;
    /// Whether a pass ever wrote a copy (tells `SourceDeleted` from `SourceNotFound`).
    fn ever_projected(&self) -> bool;
    /// The status after a pass that ended with `outcome` having reached `reached`.
    fn after(&self, outcome: &Outcome, reached: Reached<'_>, generation: Option<i64>, now: &Time) -> Self;
    /// Echoes the last reconcile request handled (`projection.sh/requested-at`).
    fn set_handled_request(&mut self, handled: Option<String>);
    /// The last reconcile request handled.
    fn handled_request(&self) -> Option<&str>;
}

macro_rules! kind_status {
    ($status:ty, $after:expr) => {
        impl KindStatus for $status {
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }

            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.conditions
            }

            fn applied_once(&self) -> Option<&AppliedOnce> {
                self.applied_once.as_ref()
            }

            fn recorded(&self) -> Option<&WrittenDestination> {
                self.written_destination.as_ref()
            }

            fn ever_projected(&self) -> bool {
                self.destination_name.is_some() || self.written_destination.is_some()
            }

            fn after(
                &self,
                outcome: &Outcome,
                reached: Reached<'_>,
                generation: Option<i64>,
                now: &Time,
            ) -> Self {
                $after(self, outcome, reached, generation, now)
            }

            fn set_handled_request(&mut self, handled: Option<String>) {
                self.last_handled_reconcile_at = handled;
            }

            fn handled_request(&self) -> Option<&str> {
                self.last_handled_reconcile_at.as_deref()
            }
        }
    };
}

kind_status!(ProjectionStatus, projection_status);
kind_status!(ClusterProjectionStatus, cluster_status);

impl ProjectionKind for Projection {
    const KIND: &'static str = "Projection";
    const FINALIZER: &'static str = PROJECTION_FINALIZER;
    const TIER: Tier = Tier::Projection;
    const DESTINATIONS: Destinations = Destinations::OwnNamespace;
    type Status = ProjectionStatus;

    fn source(&self) -> &SourceRef {
        &self.spec.source
    }

    fn controls(&self) -> &CopyControls {
        &self.spec.controls
    }

    fn rules(&self) -> CopyRules<'_> {
        CopyRules::of_projection(&self.spec)
    }

    fn copy_name(&self) -> String {
        self.spec
            .destination
            .as_ref()
            .and_then(|d| d.name.clone())
            .unwrap_or_else(|| self.spec.source.name.clone())
    }

    fn status(&self) -> ProjectionStatus {
        self.status.clone().unwrap_or_default()
    }

    fn waker(&self) -> CrRef {
        // Name and namespace only: the indexes keep one per CR, and a uid or resourceVersion
        // carried along would be two more strings each.
        CrRef::Projection(ObjectRef::new(&self.name_any()).within(&self.namespace().unwrap_or_default()))
    }

    fn owner(&self) -> Owner {
        Owner::Projection {
            namespace: self.namespace().unwrap_or_default(),
            name: self.name_any(),
            uid: self.uid().unwrap_or_default(),
        }
    }

    fn home(&self) -> Option<String> {
        self.namespace()
    }

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }

    fn queue(metrics: &QueueMetrics) -> &ControllerMetrics {
        &metrics.projection
    }

    async fn targets(&self, _: &Namespaces) -> Result<Targets, String> {
        let home = self.namespace().unwrap_or_default();
        Ok(Targets::own_namespace(
            &home,
            &self.spec.source,
            &self.copy_name(),
        ))
    }

    fn forget(&self, watches: &WatchRegistry, _: &Namespaces) {
        watches.forget(&self.waker());
    }
}

impl ProjectionKind for ClusterProjection {
    const KIND: &'static str = "ClusterProjection";
    const FINALIZER: &'static str = CLUSTER_PROJECTION_FINALIZER;
    const TIER: Tier = Tier::Cluster;
    const DESTINATIONS: Destinations = Destinations::Namespaces;
    type Status = ClusterProjectionStatus;

    fn source(&self) -> &SourceRef {
        &self.spec.source
    }

    fn controls(&self) -> &CopyControls {
        &self.spec.controls
    }

    fn rules(&self) -> CopyRules<'_> {
        CopyRules::of_cluster_projection(&self.spec)
    }

    fn copy_name(&self) -> String {
        self.spec
            .destination
            .name
            .clone()
            .unwrap_or_else(|| self.spec.source.name.clone())
    }

    fn status(&self) -> ClusterProjectionStatus {
        self.status.clone().unwrap_or_default()
    }

    fn waker(&self) -> CrRef {
        // The name only, as `Projection::waker`.
        CrRef::Cluster(ObjectRef::new(&self.name_any()))
    }

    fn owner(&self) -> Owner {
        Owner::ClusterProjection {
            name: self.name_any(),
            uid: self.uid().unwrap_or_default(),
        }
    }

    fn home(&self) -> Option<String> {
        None
    }

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::all(client)
    }

    fn queue(metrics: &QueueMetrics) -> &ControllerMetrics {
        &metrics.cluster
    }

    /// The namespaces its destination names or selects, as the namespace watch knows them (the
    /// rule is registered so that namespace events wake this CR).
    async fn targets(&self, namespaces: &Namespaces) -> Result<Targets, String> {
        let cp = ObjectRef::from_obj(self);
        let rule = match TargetRule::of(&self.spec.destination) {
            Ok(rule) => Arc::new(rule),
            Err(e) => {
                namespaces.forget(&cp);
                return Err(e.0);
            }
        };
        namespaces.set_rule(&cp, rule.clone());
        namespaces.synced().await;
        Ok(namespaces.resolve(&rule, &self.spec.source, &self.copy_name()))
    }

    fn forget(&self, watches: &WatchRegistry, namespaces: &Namespaces) {
        namespaces.forget(&ObjectRef::from_obj(self));
        watches.forget(&self.waker());
    }
}
