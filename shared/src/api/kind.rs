//! The seam between the two kinds: what a `Projection` and a `ClusterProjection` say about their
//! copies, read the same way for both ([`ProjectionCr::view`]). Everything that differs between the
//! kinds as data is answered here, once; the controller's kind trait keeps only what differs in I/O.

use crate::api::{
    crd::{
        ClusterProjection, ClusterProjectionDestination, CopyControls, CopyStatus, NamespaceCounts,
        Projection, SecretKeyReference, SourceRef, WrittenDestination,
    },
    keys::{CLUSTER_PROJECTION_FINALIZER, PROJECTION_FINALIZER},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::fmt;

/// Which of the two kinds a CR is, and so where its copies go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A Projection: one copy, in the CR's own namespace. A copy that would be the source itself
    /// refuses the whole pass, and a failure is reported in the copy's own words.
    OwnNamespace,
    /// A ClusterProjection: one copy per target namespace; a namespace where the copy would be the
    /// source itself is skipped, and failures are rolled up per namespace.
    Namespaces,
}

impl Scope {
    /// `Projection` or `ClusterProjection` (also the metric label).
    pub fn kind(self) -> &'static str {
        match self {
            Self::OwnNamespace => "Projection",
            Self::Namespaces => "ClusterProjection",
        }
    }

    /// The finalizer that holds a CR of this kind until its copies are gone.
    pub fn finalizer(self) -> &'static str {
        match self {
            Self::OwnNamespace => PROJECTION_FINALIZER,
            Self::Namespaces => CLUSTER_PROJECTION_FINALIZER,
        }
    }
}

/// A CR, by kind and name (serialized as `{kind, namespace, name}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "kind")]
pub enum CrName {
    /// A Projection.
    Projection {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A ClusterProjection.
    ClusterProjection {
        /// Its name.
        name: String,
    },
}

impl CrName {
    /// Its kind.
    pub fn scope(&self) -> Scope {
        match self {
            Self::Projection { .. } => Scope::OwnNamespace,
            Self::ClusterProjection { .. } => Scope::Namespaces,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Self::Projection { name, .. } | Self::ClusterProjection { name } => name,
        }
    }

    /// Its namespace: a Projection's, where it writes its copy; `None` for a ClusterProjection.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Self::Projection { namespace, .. } => Some(namespace),
            Self::ClusterProjection { .. } => None,
        }
    }

    /// `<namespace>/<name>` or `<name>`, as the work queue and the logs name it.
    pub fn key(&self) -> String {
        match self {
            Self::Projection { namespace, name } => format!("{namespace}/{name}"),
            Self::ClusterProjection { name } => name.clone(),
        }
    }
}

impl fmt::Display for CrName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Projection { namespace, name } => write!(f, "Projection {namespace}/{name}"),
            Self::ClusterProjection { name } => write!(f, "ClusterProjection {name}"),
        }
    }
}

/// Either kind, seen alike: borrowed from the CR, nothing copied but its name.
#[derive(Clone, Copy, Debug)]
pub struct CrView<'a> {
    /// Its kind.
    pub scope: Scope,
    /// Its metadata.
    pub meta: &'a ObjectMeta,
    /// `spec.source`.
    pub source: &'a SourceRef,
    /// The spec fields both kinds share.
    pub controls: &'a CopyControls,
    /// The name of its copies: `spec.destination.name`, else the source's.
    pub copy_name: &'a str,
    /// A ClusterProjection's target namespaces (`None`: a Projection writes in its own).
    pub namespaces: Option<&'a ClusterProjectionDestination>,
    /// The Secret holding the kubeconfig of the cluster the copies go to (`None`: this one).
    pub cluster: Option<&'a SecretKeyReference>,
    /// What its last pass reported (`None` before its first).
    pub status: Option<&'a CopyStatus>,
    /// A ClusterProjection's counts of namespaces, once reported.
    pub counts: Option<&'a NamespaceCounts>,
}

impl CrView<'_> {
    /// Its kind and name.
    pub fn name(&self) -> CrName {
        let name = self.meta.name.clone().unwrap_or_default();
        match self.scope {
            Scope::OwnNamespace => CrName::Projection {
                namespace: self.meta.namespace.clone().unwrap_or_default(),
                name,
            },
            Scope::Namespaces => CrName::ClusterProjection { name },
        }
    }

    /// The namespace a Projection lives and writes in; `None` for a ClusterProjection.
    pub fn home(&self) -> Option<&str> {
        match self.scope {
            Scope::OwnNamespace => Some(self.meta.namespace.as_deref().unwrap_or_default()),
            Scope::Namespaces => None,
        }
    }

    /// Its UID (empty for a manifest not stored yet).
    pub fn uid(&self) -> &str {
        self.meta.uid.as_deref().unwrap_or_default()
    }

    /// The copies its status recorded for cleanup.
    pub fn recorded(&self) -> Option<&WrittenDestination> {
        self.status?.written_destination.as_ref()
    }

    /// Whether a pass ever wrote a copy (tells `SourceDeleted` from `SourceNotFound`).
    pub fn ever_projected(&self) -> bool {
        self.status.is_some_and(CopyStatus::ever_projected)
    }
}

/// A CR of either kind.
pub trait ProjectionCr {
    /// The CR seen as both kinds are.
    fn view(&self) -> CrView<'_>;
}

impl ProjectionCr for Projection {
    fn view(&self) -> CrView<'_> {
        let destination = self.spec.destination.as_ref();
        let renamed = destination.and_then(|d| d.name.as_deref());
        CrView {
            scope: Scope::OwnNamespace,
            meta: &self.metadata,
            source: &self.spec.source,
            controls: &self.spec.controls,
            copy_name: renamed.unwrap_or(&self.spec.source.name),
            namespaces: None,
            cluster: destination
                .and_then(|d| d.kube_config.as_ref())
                .map(|k| &k.secret_ref),
            status: self.status.as_ref().map(|s| &s.copy),
            counts: None,
        }
    }
}

impl ProjectionCr for ClusterProjection {
    fn view(&self) -> CrView<'_> {
        let destination = &self.spec.destination;
        CrView {
            scope: Scope::Namespaces,
            meta: &self.metadata,
            source: &self.spec.source,
            controls: &self.spec.controls,
            copy_name: destination.name.as_deref().unwrap_or(&self.spec.source.name),
            namespaces: Some(destination),
            cluster: destination.kube_config.as_ref().map(|k| &k.secret_ref),
            status: self.status.as_ref().map(|s| &s.copy),
            counts: self.status.as_ref().map(|s| &s.counts),
        }
    }
}
