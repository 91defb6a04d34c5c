//! Who owns a copy. The ownership annotation is the only proof: the UID label narrows watches and
//! lists but is never trusted alone, so a copy whose annotation was removed or changed is left alone.
//! In another cluster the proof includes the annotation naming the source cluster
//! ([`SOURCE_CLUSTER`]); in the CR's own cluster a copy carries none.

use crate::api::keys::{
    OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_CLUSTER_PROJECTION_UID, OWNED_BY_PROJECTION,
    OWNED_BY_PROJECTION_UID, SOURCE_CLUSTER,
};
use crate::api::kind::{CrName, CrView};
use std::collections::BTreeMap;

/// The CR a copy belongs to. Deserializable (`{projection: {namespace, name, uid}}` or
/// `{clusterProjection: {name, uid}}`) for the fixtures that name one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Owner {
    /// A namespaced `Projection`.
    Projection {
        /// Its namespace (also the namespace of its copy).
        namespace: String,
        /// Its name.
        name: String,
        /// Its UID, stamped as a label.
        uid: String,
        /// The identity of the CR's cluster, stamped on copies in another cluster.
        #[serde(default)]
        cluster: Option<String>,
    },
    /// A `ClusterProjection`.
    ClusterProjection {
        /// Its name.
        name: String,
        /// Its UID, stamped as a label.
        uid: String,
        /// The identity of the CR's cluster, stamped on copies in another cluster.
        #[serde(default)]
        cluster: Option<String>,
    },
}

impl Owner {
    /// The owner stamped on the copies of the CR `cr`, whose UID is `uid`.
    pub fn of(cr: &CrName, uid: &str) -> Self {
        match cr {
            CrName::Projection { namespace, name } => Self::Projection {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.to_owned(),
                cluster: None,
            },
            CrName::ClusterProjection { name } => Self::ClusterProjection {
                name: name.clone(),
                uid: uid.to_owned(),
                cluster: None,
            },
        }
    }

    /// The same owner, of copies in another cluster, stamped with `cluster`: the identity of the
    /// CR's own cluster.
    pub fn from_cluster(mut self, id: &str) -> Self {
        match &mut self {
            Self::Projection { cluster, .. } | Self::ClusterProjection { cluster, .. } => {
                *cluster = Some(id.to_owned());
            }
        }
        self
    }

    /// The identity of the CR's cluster its copies carry: `None` in the CR's own cluster.
    pub fn cluster(&self) -> Option<&str> {
        match self {
            Self::Projection { cluster, .. } | Self::ClusterProjection { cluster, .. } => cluster.as_deref(),
        }
    }

    /// The owner stamped on the copies of `cr`.
    pub fn of_cr(cr: &CrView<'_>) -> Self {
        Self::of(&cr.name(), cr.uid())
    }

    /// The authoritative annotation key of this owner's tier.
    pub fn annotation_key(&self) -> &'static str {
        match self {
            Self::Projection { .. } => OWNED_BY_PROJECTION,
            Self::ClusterProjection { .. } => OWNED_BY_CLUSTER_PROJECTION,
        }
    }

    /// The annotation value naming this owner: `<namespace>/<name>` or `<name>`.
    pub fn annotation_value(&self) -> String {
        match self {
            Self::Projection { namespace, name, .. } => format!("{namespace}/{name}"),
            Self::ClusterProjection { name, .. } => name.clone(),
        }
    }

    /// The UID label key of this owner's tier.
    pub fn uid_label_key(&self) -> &'static str {
        match self {
            Self::Projection { .. } => OWNED_BY_PROJECTION_UID,
            Self::ClusterProjection { .. } => OWNED_BY_CLUSTER_PROJECTION_UID,
        }
    }

    /// The owner's UID.
    pub fn uid(&self) -> &str {
        match self {
            Self::Projection { uid, .. } | Self::ClusterProjection { uid, .. } => uid,
        }
    }

    /// The kind of the owning CR.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Projection { .. } => "Projection",
            Self::ClusterProjection { .. } => "ClusterProjection",
        }
    }

    /// Whether an object with these annotations is this owner's copy: its ownership annotation
    /// names the owner, and its source-cluster annotation names the owner's cluster (none in the
    /// CR's own cluster).
    pub fn owns(&self, annotations: Option<&BTreeMap<String, String>>) -> bool {
        annotations
            .and_then(|a| a.get(self.annotation_key()))
            .is_some_and(|v| self.is_annotation_value(v))
            && self.is_from(
                annotations
                    .and_then(|a| a.get(SOURCE_CLUSTER))
                    .map(String::as_str),
            )
    }

    /// Whether `cluster` (a copy's source-cluster annotation) is this owner's.
    pub fn is_from(&self, cluster: Option<&str>) -> bool {
        self.cluster() == cluster
    }

    /// Whether `value` (of this tier's ownership annotation) names this owner; the same as comparing
    /// with [`Self::annotation_value`], without building it.
    pub fn is_annotation_value(&self, value: &str) -> bool {
        match self {
            Self::Projection { namespace, name, .. } => value
                .split_once('/')
                .is_some_and(|(n, rest)| n == namespace && rest == name),
            Self::ClusterProjection { name, .. } => value == name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection() -> Owner {
        Owner::Projection {
            namespace: "team-a".into(),
            name: "p".into(),
            uid: "u-1".into(),
            cluster: None,
        }
    }

    #[test]
    fn only_the_annotation_proves_ownership() {
        let owner = projection();
        let ours = BTreeMap::from([(OWNED_BY_PROJECTION.to_owned(), "team-a/p".to_owned())]);
        assert!(owner.owns(Some(&ours)));
        let other = BTreeMap::from([(OWNED_BY_PROJECTION.to_owned(), "team-b/p".to_owned())]);
        assert!(!owner.owns(Some(&other)));
        // The other tier's key with the same value is not ours either.
        let cluster = BTreeMap::from([(OWNED_BY_CLUSTER_PROJECTION.to_owned(), "team-a/p".to_owned())]);
        assert!(!owner.owns(Some(&cluster)));
        assert!(!owner.owns(None));
    }

    #[test]
    fn in_another_cluster_the_source_cluster_is_part_of_the_proof() {
        let local = projection();
        let remote = projection().from_cluster("uid-of-a");
        let mut ours = BTreeMap::from([(OWNED_BY_PROJECTION.to_owned(), "team-a/p".to_owned())]);
        assert!(local.owns(Some(&ours)) && !remote.owns(Some(&ours)));
        ours.insert(SOURCE_CLUSTER.to_owned(), "uid-of-a".to_owned());
        assert!(remote.owns(Some(&ours)), "written by cluster a's controller");
        assert!(
            !local.owns(Some(&ours)),
            "a same-named CR of the cluster the copy is in does not own it"
        );
        ours.insert(SOURCE_CLUSTER.to_owned(), "uid-of-b".to_owned());
        assert!(!remote.owns(Some(&ours)), "another cluster's CR of the same name");
        assert_eq!(remote.cluster(), Some("uid-of-a"));
    }

    #[test]
    fn the_annotation_value_check_agrees_with_the_built_value() {
        let cluster = Owner::ClusterProjection {
            name: "c".into(),
            uid: "u-2".into(),
            cluster: None,
        };
        for owner in [projection(), cluster] {
            for value in ["team-a/p", "c", "team-a/p/x", "team-a/", "/p", "p", "team-ap", ""] {
                assert_eq!(
                    owner.is_annotation_value(value),
                    value == owner.annotation_value(),
                    "{owner:?} and {value:?}"
                );
            }
        }
    }

    #[test]
    fn keys_per_tier() {
        let cluster = Owner::ClusterProjection {
            name: "c".into(),
            uid: "u-2".into(),
            cluster: None,
        };
        assert_eq!(cluster.annotation_value(), "c");
        assert_eq!(cluster.uid_label_key(), OWNED_BY_CLUSTER_PROJECTION_UID);
        assert_eq!(projection().annotation_value(), "team-a/p");
        assert_eq!(projection().uid_label_key(), OWNED_BY_PROJECTION_UID);
    }
}
