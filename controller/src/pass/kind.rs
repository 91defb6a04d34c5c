//! What differs between the two CR kinds as the pass drives them, in I/O only: which kind it is,
//! and the API the CR itself is read and written through. Everything else (source, rules, copy
//! name, targets, status) the CRD types answer alike in `shared::api::kind`, and a pass is written
//! once, generic over [`ProjectionKind`].

use kube::{Api, Resource, ResourceExt};
use serde::{Serialize, de::DeserializeOwned};
use shared::api::{
    crd::{ClusterProjection, Projection},
    kind::{ProjectionCr, Scope},
};
use std::fmt::Debug;

/// One of the two CR kinds, as the pass drives it.
pub trait ProjectionKind:
    ProjectionCr
    + Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Which kind: its name, finalizer, and where its copies go.
    const SCOPE: Scope;

    /// The API the CR itself is read and written through.
    fn api(&self, client: kube::Client) -> Api<Self>;
}

impl ProjectionKind for Projection {
    const SCOPE: Scope = Scope::OwnNamespace;

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::namespaced(client, &self.namespace().unwrap_or_default())
    }
}

impl ProjectionKind for ClusterProjection {
    const SCOPE: Scope = Scope::Namespaces;

    fn api(&self, client: kube::Client) -> Api<Self> {
        Api::all(client)
    }
}
