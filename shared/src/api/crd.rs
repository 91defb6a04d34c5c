//! The `projection.sh/v1` API: `Projection` and `ClusterProjection`.
//!
//! The schema is wire-compatible with the Go operator (projection-operator/projection v0.3.x): same
//! group, kinds, field names, patterns, CEL messages and printer columns. The CRD rules are defence in
//! depth; the admission webhook gives the friendlier messages.

// Every `printcolumn(...)` repeats `type_ = "string"`, which clippy mistakes for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use crate::api::copy_spec::{FieldExclusion, KeySelection, MetadataFilter};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// DNS-1123 subdomain: object names, API groups.
pub const DNS1123_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// DNS-1123 label: namespace names.
pub const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// An API group: empty (the core group) or a DNS-1123 subdomain.
pub const GROUP_PATTERN: &str = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// An API version: empty (the preferred served version) or `v1`, `v2beta1`, ...
pub const VERSION_PATTERN: &str = r"^$|^v[0-9]+((alpha|beta)[0-9]+)?$";
/// A kind in PascalCase, matched case-sensitively by discovery.
pub const KIND_PATTERN: &str = r"^[A-Z][a-zA-Z0-9]*$";

/// The fields of both kinds the apiserver can select on (the CRDs' `selectableFields`), as a field
/// selector names them: the source's namespace and name. `kubectl get projections -A
/// --field-selector spec.source.namespace=platform,spec.source.name=settings` lists the CRs reading
/// one object; a replica taking CRs over lists those of the sources changed lately first.
pub const SOURCE_SELECTABLE_FIELDS: [&str; 2] = ["spec.source.namespace", "spec.source.name"];

/// The object to mirror. Only namespaced kinds can be sources.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceRef {
    /// API group of the source; empty for the core group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(pattern(GROUP_PATTERN), length(max = 253))]
    pub group: String,
    /// API version of the source; empty means the preferred served version, re-resolved on every
    /// reconcile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(pattern(VERSION_PATTERN))]
    pub version: String,
    /// Kind of the source, in PascalCase (e.g. `ConfigMap`).
    #[schemars(pattern(KIND_PATTERN), length(min = 1))]
    pub kind: String,
    /// Namespace of the source.
    #[schemars(pattern(DNS1123_LABEL), length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the source.
    #[schemars(pattern(DNS1123_SUBDOMAIN), length(min = 1, max = 253))]
    pub name: String,
}

/// Labels and annotations merged over the source's metadata (the overlay wins). Data and spec are
/// never touched. Keys under `projection.sh/` are reserved for ownership and are refused.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overlay {
    /// Labels set on every copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('projection.sh/'))").message("overlay.labels keys under projection.sh/ are reserved for the operator"))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations set on every copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('projection.sh/'))").message("overlay.annotations keys under projection.sh/ are reserved for the operator"))]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Where a `Projection` writes its copy: always its own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionDestination {
    /// Name of the copy; defaults to the source's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS1123_SUBDOMAIN), length(max = 253))]
    pub name: Option<String>,
    /// Writes the copy into another cluster, in the namespace of the same name as the Projection's,
    /// with the credentials of a kubeconfig held in a Secret of the Projection's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config: Option<KubeConfigReference>,
}

/// The kubeconfig of another cluster the copies go to, held in a Secret (Flux's convention). Only
/// its inline credentials are used: a bearer token or a client certificate, with the cluster's CA;
/// a kubeconfig that names files or runs a program (exec or auth-provider plugins) is refused.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeConfigReference {
    /// The Secret holding the kubeconfig.
    pub secret_ref: SecretKeyReference,
}

/// A key of a Secret named from the CR: in a Projection's own namespace, or in the controller's
/// namespace for a ClusterProjection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyReference {
    /// Name of the Secret.
    #[schemars(pattern(DNS1123_SUBDOMAIN), length(min = 1, max = 253))]
    pub name: String,
    /// Key of the kubeconfig in the Secret's data; `value` when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(SECRET_KEY_PATTERN), length(min = 1, max = 253))]
    pub key: Option<String>,
}

/// A key of a Secret's data.
pub const SECRET_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";

impl SecretKeyReference {
    /// The key of the kubeconfig: `value` unless named.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("value")
    }
}

// What happens to copies whose CR or source goes. (A plain comment: a doc comment here would replace
// the fields' own descriptions in the CRD schema.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum CopyPolicy {
    /// The copies are deleted.
    #[default]
    Delete,
    /// The copies stay, stripped of our ownership annotation, label and source hash.
    Orphan,
}

// How copies are kept (a plain comment, as for `CopyPolicy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum SyncPolicy {
    /// Every copy follows its source and is repaired when edited or deleted.
    #[default]
    Reconcile,
    /// Each copy is created once per target, then left as it is.
    ApplyOnce,
}

/// Where `syncPolicy: ApplyOnce` has created its copy once, so that a copy deleted by hand is not
/// created again.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedOnce {
    /// API group of the copies the record is for; empty for the core group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind of the copies the record is for.
    pub kind: String,
    /// Name of the copies the record is for.
    pub name: String,
    /// How many namespaces the record holds.
    pub count: i32,
    /// The namespaces, sorted and front-coded so the record stays small at thousands of namespaces:
    /// per name, a capital letter giving the length of the prefix shared with the previous name
    /// (`A` = 0, ..., `Z` = 25), then the rest of the name.
    pub namespaces: String,
}

/// Mirror one namespaced object into this Projection's namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "projection.sh",
    version = "v1",
    kind = "Projection",
    doc = "Mirrors one namespaced object (any kind) into this Projection's namespace and keeps the copy in sync.",
    namespaced,
    status = "ProjectionStatus",
    shortname = "proj",
    category = "projection-sh",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.source.kind"),
    printcolumn(
        name = "Source-Group",
        type_ = "string",
        json_path = ".spec.source.group",
        priority = 1
    ),
    printcolumn(
        name = "Source-Namespace",
        type_ = "string",
        json_path = ".spec.source.namespace"
    ),
    printcolumn(name = "Source-Name", type_ = "string", json_path = ".spec.source.name"),
    printcolumn(
        name = "Destination-Name",
        type_ = "string",
        json_path = ".status.destinationName"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].message",
        priority = 1
    ),
    printcolumn(
        name = "Suspended",
        type_ = "boolean",
        json_path = ".spec.suspend",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.source.namespace",
    selectable = ".spec.source.name"
)]
#[x_kube(
    validation = Rule::new("(has(self.destination) && has(self.destination.kubeConfig)) == (has(oldSelf.destination) && has(oldSelf.destination.kubeConfig)) && (!has(self.destination) || !has(self.destination.kubeConfig) || self.destination.kubeConfig == oldSelf.destination.kubeConfig)").message("destination.kubeConfig cannot change: delete the Projection (its copy goes with it) and create it again to write into another cluster")
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionSpec {
    /// The object to mirror.
    pub source: SourceRef,
    /// Optional rename of the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ProjectionDestination>,
    /// What the copies carry and how they are kept.
    #[serde(flatten)]
    pub controls: CopyControls,
}

/// The optional fields both kinds share: what a copy carries and how copies are kept. Flattened
/// into each spec, so on the wire they stay top-level `spec` fields, as in the Go operator. The
/// content controls are boxed: most CRs set none, and the controller caches every CR, so each
/// costs a pointer rather than its whole size when absent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyControls {
    /// Labels and annotations merged over the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<Box<Overlay>>,
    /// Which of the source's labels and annotations travel, over the default hygiene list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<MetadataFilter>>,
    /// Which keys of `data` / `binaryData` travel, and under which name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Box<KeySelection>>,
    /// Fields removed from the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Box<FieldExclusion>>,
    /// While true, no copy is written, updated or deleted, except that the copies are still
    /// withdrawn when the source's owner vetoes or the author may no longer read the source
    /// (deleting the CR still follows `deletionPolicy`); setting it back to false catches up with
    /// one full reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// What deleting this CR does to its copies: `Delete` (the default) removes them, `Orphan`
    /// leaves them without our ownership annotation, label and source hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<CopyPolicy>,
    /// What a source that no longer exists does to the copies: `Delete` (the default) or `Orphan`.
    /// A source that vetoes projection always has its copies removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_deletion_policy: Option<CopyPolicy>,
    /// `Reconcile` (the default) keeps every copy equal to its source; `ApplyOnce` creates each copy
    /// once per target and never updates, repairs or re-creates it afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_policy: Option<SyncPolicy>,
}

/// Where a `ClusterProjection` writes its copies: exactly one of `namespaces` or
/// `namespaceSelector`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!(has(self.namespaces) && has(self.namespaceSelector))").message("namespaces and namespaceSelector are mutually exclusive"),
    validation = Rule::new("has(self.namespaces) || has(self.namespaceSelector)").message("one of namespaces or namespaceSelector must be set"),
    validation = Rule::new("!has(self.namespaceSelector) || (has(self.namespaceSelector.matchLabels) && size(self.namespaceSelector.matchLabels) > 0) || (has(self.namespaceSelector.matchExpressions) && size(self.namespaceSelector.matchExpressions) > 0)").message("namespaceSelector must not be empty: an empty selector would select every namespace"),
    validation = Rule::new("has(self.kubeConfig) == has(oldSelf.kubeConfig) && (!has(self.kubeConfig) || self.kubeConfig == oldSelf.kubeConfig)").message("destination.kubeConfig cannot change: delete the ClusterProjection (its copies go with it) and create it again to write into another cluster")
)]
pub struct ClusterProjectionDestination {
    /// An explicit set of target namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(pattern(DNS1123_LABEL), length(max = 63)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub namespaces: Option<Vec<String>>,
    /// Every namespace whose labels match; copies follow the namespaces as they come and go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub namespace_selector: Option<LabelSelector>,
    /// Name of the copies; defaults to the source's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS1123_SUBDOMAIN), length(max = 253))]
    pub name: Option<String>,
    /// Writes the copies into another cluster, whose namespaces `namespaces` or
    /// `namespaceSelector` then name, with the credentials of a kubeconfig held in a Secret of the
    /// controller's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config: Option<KubeConfigReference>,
}

/// Mirror one namespaced object into many namespaces, by list or by label selector.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "projection.sh",
    version = "v1",
    kind = "ClusterProjection",
    doc = "Mirrors one namespaced object into an explicit list of namespaces or every namespace matching a selector.",
    status = "ClusterProjectionStatus",
    shortname = "cproj",
    category = "projection-sh",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.source.kind"),
    printcolumn(
        name = "Source-Group",
        type_ = "string",
        json_path = ".spec.source.group",
        priority = 1
    ),
    printcolumn(
        name = "Source-Namespace",
        type_ = "string",
        json_path = ".spec.source.namespace"
    ),
    printcolumn(name = "Source-Name", type_ = "string", json_path = ".spec.source.name"),
    printcolumn(
        name = "Destination-Name",
        type_ = "string",
        json_path = ".status.destinationName"
    ),
    printcolumn(name = "Targets", type_ = "integer", json_path = ".status.namespacesWritten"),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.namespacesFailed",
        priority = 1
    ),
    printcolumn(
        name = "Selector",
        type_ = "string",
        json_path = ".spec.destination.namespaceSelector.matchLabels",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].message",
        priority = 1
    ),
    printcolumn(
        name = "Suspended",
        type_ = "boolean",
        json_path = ".spec.suspend",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.source.namespace",
    selectable = ".spec.source.name"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProjectionSpec {
    /// The object to mirror.
    pub source: SourceRef,
    /// The target namespaces and an optional rename.
    pub destination: ClusterProjectionDestination,
    /// What the copies carry and how they are kept, the same on every copy.
    #[serde(flatten)]
    pub controls: CopyControls,
}

/// A standard Kubernetes condition (the schema of `metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `SourceResolved`, `DestinationWritten`, `Ready` or `Suspended`.
    #[schemars(
        pattern(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"),
        length(max = 316)
    )]
    pub r#type: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// A CamelCase reason, e.g. `Projected` or `DestinationConflict`.
    #[schemars(
        pattern(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
        length(min = 1, max = 1024)
    )]
    pub reason: String,
    /// What happened, for a person.
    #[schemars(length(max = 32768))]
    pub message: String,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When `status` last changed.
    pub last_transition_time: Time,
}

/// What a reconcile last wrote, so cleanup never depends on the current spec (a rename, another
/// source or another kind must remove the old copies).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WrittenDestination {
    /// API group of the copies; empty for the core group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// API version the copies were written with.
    pub version: String,
    /// Kind of the copies.
    pub kind: String,
    /// Name of the copies.
    pub name: String,
    /// For copies in another cluster (`destination.kubeConfig`): which apiserver they were written
    /// to, `server-` and 12 hex digits of a SHA-256 of its URL (not the URL). A kubeconfig Secret
    /// later pointed at another apiserver is refused rather than leave these copies behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// For copies in another cluster: that cluster's identity, as `projection.sh/source-cluster`
    /// names clusters (its About API `cluster.clusterset.k8s.io` ClusterProperty, else the UID of its
    /// `kube-system` namespace), when the kubeconfig's credentials may read it. Admission knows
    /// through it that two Secrets reach one cluster, or that one reaches this very cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_identity: Option<String>,
}

impl WrittenDestination {
    /// The record of copies named `name` of `resource`.
    pub fn of(resource: &kube::core::ApiResource, name: &str) -> Self {
        Self {
            group: resource.group.clone(),
            version: resource.version.clone(),
            kind: resource.kind.clone(),
            name: name.to_owned(),
            cluster: None,
            cluster_identity: None,
        }
    }

    /// The same record, of copies written into the cluster `cluster` names (`None`: this one),
    /// whose identity is `identity` when known.
    #[must_use]
    pub fn in_cluster(self, cluster: Option<String>, identity: Option<String>) -> Self {
        Self {
            cluster,
            cluster_identity: identity,
            ..self
        }
    }
}

/// What a pass last reported about the copies, the same for both kinds: flattened into each
/// status, so on the wire its fields stay top-level `status` fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyStatus {
    /// The `metadata.generation` the last pass worked on: while it differs from the CR's, the
    /// controller has not acted on the latest spec yet (kstatus reads it so). `0` until the first
    /// pass (the schema's default, so that a CR read before then is not taken for done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// `SourceResolved`, `DestinationWritten` and `Ready`; `Reconciling` or `Stalled` while the CR
    /// is not ready (kstatus), and `Suspended` while `spec.suspend` is true.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Name of the copies once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_name: Option<String>,
    /// The copies as last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_destination: Option<WrittenDestination>,
    /// `projection.sh/source-hash` of the copies as last built (the same in every namespace): a
    /// copy carrying another value is not current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_hash: Option<String>,
    /// The last `projection.sh/requested-at` value a reconcile handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
    /// With `syncPolicy: ApplyOnce`: where the copy was created once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_once: Option<AppliedOnce>,
}

impl CopyStatus {
    /// Whether a pass ever wrote a copy (tells `SourceDeleted` from `SourceNotFound`).
    pub fn ever_projected(&self) -> bool {
        self.destination_name.is_some() || self.written_destination.is_some()
    }

    /// Whether a pass ever reported on the CR. Not the mere presence of `observedGeneration`: the
    /// schema defaults the status of a CR no pass has reported on to `{observedGeneration: 0}`,
    /// and a reported one holds the CR's `metadata.generation`, which starts at 1.
    pub fn ever_reported(&self) -> bool {
        self.observed_generation.is_some_and(|generation| generation > 0)
    }
}

/// Observed state of a `Projection`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionStatus {
    /// What the last pass reported.
    #[serde(flatten)]
    pub copy: CopyStatus,
}

/// One namespace a `ClusterProjection` could not write, and why.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceFailure {
    /// The target namespace.
    pub namespace: String,
    /// A CamelCase reason, e.g. `DestinationConflict`.
    pub reason: String,
    /// A short explanation.
    pub message: String,
}

/// How many target namespaces of a `ClusterProjection` hold a copy, and which could not.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceCounts {
    /// Namespaces holding an up-to-date copy (always present, 0 included).
    #[serde(default)]
    pub namespaces_written: i32,
    /// Namespaces that could not be written (always present, 0 included).
    #[serde(default)]
    pub namespaces_failed: i32,
    /// The first failed namespaces, sorted, each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub failed_namespaces: Vec<NamespaceFailure>,
}

/// Observed state of a `ClusterProjection`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProjectionStatus {
    /// What the last pass reported.
    #[serde(flatten)]
    pub copy: CopyStatus,
    /// Where the copies are.
    #[serde(flatten)]
    pub counts: NamespaceCounts,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn both_crds_declare_the_source_fields_selectable() {
        for crd in [Projection::crd(), ClusterProjection::crd()] {
            let declared: Vec<String> = crd.spec.versions[0]
                .selectable_fields
                .iter()
                .flatten()
                .map(|field| field.json_path.trim_start_matches('.').to_owned())
                .collect();
            assert_eq!(declared, SOURCE_SELECTABLE_FIELDS, "{}", crd.spec.names.kind);
        }
    }

    #[test]
    fn a_cr_is_reported_on_once_a_pass_wrote_its_generation_not_by_the_schemas_default() {
        let status =
            |json: serde_json::Value| -> ProjectionStatus { serde_json::from_value(json).expect("a status") };
        // What the apiserver serves for a CR no pass has reported on: the schema's default.
        assert!(
            !status(serde_json::json!({"observedGeneration": 0}))
                .copy
                .ever_reported()
        );
        assert!(!status(serde_json::json!({})).copy.ever_reported());
        assert!(
            status(serde_json::json!({"observedGeneration": 1}))
                .copy
                .ever_reported()
        );
        assert!(
            status(serde_json::json!({"observedGeneration": 7, "conditions": []}))
                .copy
                .ever_reported()
        );
    }
}
