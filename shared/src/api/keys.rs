//! Well-known annotation, label and finalizer keys, identical to the Go operator's so that a cluster
//! can switch implementations without touching a manifest and existing copies are adopted.

/// Prefix reserved for the operator: never copied from a source, refused in overlays.
pub const RESERVED_PREFIX: &str = "projection.sh/";

/// Source annotation: `"true"` opts the source in, `"false"` vetoes every projection of it.
pub const PROJECTABLE: &str = "projection.sh/projectable";

/// Destination annotation naming the owning Projection as `<namespace>/<name>`. Authoritative.
pub const OWNED_BY_PROJECTION: &str = "projection.sh/owned-by-projection";
/// Destination label holding the owning Projection's UID. A watch and list hint, never trusted alone.
pub const OWNED_BY_PROJECTION_UID: &str = "projection.sh/owned-by-projection-uid";

/// Destination annotation naming the owning ClusterProjection. Authoritative.
pub const OWNED_BY_CLUSTER_PROJECTION: &str = "projection.sh/owned-by-cluster-projection";
/// Destination label holding the owning ClusterProjection's UID. A hint, never trusted alone.
pub const OWNED_BY_CLUSTER_PROJECTION_UID: &str = "projection.sh/owned-by-cluster-projection-uid";

/// Annotation on a copy in another cluster (`spec.destination.kubeConfig`): the identity of the
/// cluster whose CR owns it (its About API `cluster.clusterset.k8s.io` ClusterProperty where
/// served, else the UID of its `kube-system` namespace). Part of the ownership proof
/// there: a copy is ours only when it names our cluster, and a copy in our own cluster that names
/// any is another cluster's, so two clusters' controllers never fight over one object and nothing
/// is adopted across clusters by accident.
pub const SOURCE_CLUSTER: &str = "projection.sh/source-cluster";

/// The controllers' leader Lease, in their namespace (`kubectl projection check api` reads it).
pub const LEADER_LEASE: &str = "projection-controller-leader";

/// Finalizer on Projections, so their copy is removed before they go.
pub const PROJECTION_FINALIZER: &str = "projection.sh/finalizer";
/// Finalizer on ClusterProjections, so every copy is swept before they go.
pub const CLUSTER_PROJECTION_FINALIZER: &str = "projection.sh/cluster-finalizer";

/// Written by `kubectl apply`; describes the source, not the copy, so it is never copied.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// CR annotation: a new value asks for a full reconcile that rewrites every copy, even one that looks
/// current; echoed in `status.lastHandledReconcileAt` (Flux's `requestedAt` convention). Copies carry
/// the value they were last rewritten for under the same key.
pub const REQUESTED_AT: &str = "projection.sh/requested-at";

/// Annotation on an existing object: its owner consents to adoption by the CR it names,
/// `<namespace>/<name>` for a Projection or `cluster/<name>` for a ClusterProjection.
pub const ADOPT_BY: &str = "projection.sh/adopt-by";

/// Copy annotation: SHA-256 (hex) of what was built from the source, before the ownership keys and
/// without the copy's name and namespace, so every copy of one CR carries the same value and a copy
/// is current exactly when it carries the hash its CR reports in `status.sourceHash`. Removed with
/// our other keys when a copy is orphaned.
pub const SOURCE_HASH: &str = "projection.sh/source-hash";

/// The field manager of every write of the controller (copies, status).
pub const FIELD_MANAGER: &str = "projection-controller";
