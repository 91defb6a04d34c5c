//! The indexes that map a watch event to the CRs it concerns, with no API call: plain data
//! structures, no I/O, no tasks. The watch tasks feed them, the reconcilers update them, and each is
//! unit-tested from tables.
//!
//! - [`ObjectIndex`]: source key → the CRs reading it, coordinates → the CRs waiting for a stranger
//!   to leave them, copy → its owner (from its ownership annotation), API group → the CRs following
//!   its discovery; with the [`Journal`] of our own writes, whose watch events wake nothing.
//! - [`NamespaceIndex`]: the namespaces as ClusterProjections see them, and namespace → the
//!   ClusterProjections listing or selecting it.
//!
//! A CR is named by a [`CrRef`] only, so a replica that owns a subset of the CRs can filter what
//! the indexes return without changing them.

mod journal;
mod namespaces;
mod objects;

pub use journal::Journal;
pub use namespaces::NamespaceIndex;
pub use objects::ObjectIndex;

use kube::{ResourceExt, api::DynamicObject, runtime::reflector::ObjectRef};
use shared::{
    api::crd::{ClusterProjection, Projection},
    api::source::GroupKind,
    copy::ownership::Owner,
};

/// A CR the indexes can name, and that can be woken.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CrRef {
    /// A Projection.
    Projection(ObjectRef<Projection>),
    /// A ClusterProjection.
    Cluster(ObjectRef<ClusterProjection>),
}

impl CrRef {
    /// The CR named `name`: how the watch indexes name it (its name and namespace only: the indexes
    /// keep one per CR, and a uid or resourceVersion carried along would be two more strings each).
    pub fn named(name: &shared::api::kind::CrName) -> Self {
        match name {
            shared::api::kind::CrName::Projection { namespace, name } => {
                Self::Projection(ObjectRef::new(name).within(namespace))
            }
            shared::api::kind::CrName::ClusterProjection { name } => Self::Cluster(ObjectRef::new(name)),
        }
    }

    /// The CR that owns copies stamped for `owner`.
    pub fn of(owner: &Owner) -> Self {
        match owner {
            Owner::Projection { namespace, name, .. } => {
                Self::Projection(ObjectRef::new(name).within(namespace))
            }
            Owner::ClusterProjection { name, .. } => Self::Cluster(ObjectRef::new(name)),
        }
    }
}

/// Coordinates of one object of a kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Its group and kind.
    pub group_kind: GroupKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ObjectKey {
    /// The key of an object we read or wrote.
    pub fn of(group_kind: &GroupKind, object: &DynamicObject) -> Self {
        Self {
            group_kind: group_kind.clone(),
            namespace: object.namespace().unwrap_or_default(),
            name: object.name_any(),
        }
    }
}
