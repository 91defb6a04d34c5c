//! What the controller keeps of each of its copies between watch events. The copies' cache holds one
//! entry per copy for as long as it exists, and most passes only ask whose copy it is and at which
//! resourceVersion (a copy already verified is not compared again, see [`crate::cache::verified`]). So an
//! entry keeps those answers as plain strings, and the rest of the copy (content, labels,
//! annotations, our `managedFields` entry), which only a write or a removal reads, as packed JSON
//! text ([`crate::cache::packed_text`]) decoded on demand: a `serde_json` map costs a B-tree node of
//! several hundred bytes however few keys it has, the packed text a fraction of its length.

use crate::cache::{cache_trim::trim_copy, packed_text::PackedText};
use kube::core::DynamicObject;
use shared::{
    api::keys::{
        OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_CLUSTER_PROJECTION_UID, OWNED_BY_PROJECTION,
        OWNED_BY_PROJECTION_UID, SOURCE_CLUSTER,
    },
    copy::ownership::Owner,
};

/// One copy as the cache keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedCopy {
    /// `<namespace>/<name>`: the cache's key.
    path: Box<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    /// The ownership annotation of each tier (Projection, ClusterProjection), if present.
    owned_by: [Option<Box<str>>; 2],
    /// The UID label of each tier, if present.
    uid_labels: [Option<Box<str>>; 2],
    /// The cluster whose CR wrote it, on a copy in another cluster.
    source_cluster: Option<Box<str>>,
    /// The rest of the object, trimmed (see [`trim_copy`]), without what the fields above hold.
    rest: PackedText,
}

/// The index of a tier in [`CachedCopy`]'s per-tier fields.
fn tier(owner: &Owner) -> usize {
    match owner {
        Owner::Projection { .. } => 0,
        Owner::ClusterProjection { .. } => 1,
    }
}

impl CachedCopy {
    /// The entry for a copy as the watch delivered it; `field_manager` is ours (the `managedFields`
    /// entry the write plan reads).
    pub fn new(mut object: DynamicObject, field_manager: &str) -> Self {
        let meta = &mut object.metadata;
        trim_copy(meta, field_manager);
        let path = format!(
            "{}/{}",
            meta.namespace.take().unwrap_or_default(),
            meta.name.take().unwrap_or_default()
        );
        let text = |value: Option<&String>| value.map(|v| v.as_str().into());
        let annotations = meta.annotations.as_ref();
        let labels = meta.labels.as_ref();
        let owned_by = [OWNED_BY_PROJECTION, OWNED_BY_CLUSTER_PROJECTION]
            .map(|key| text(annotations.and_then(|a| a.get(key))));
        let uid_labels = [OWNED_BY_PROJECTION_UID, OWNED_BY_CLUSTER_PROJECTION_UID]
            .map(|key| text(labels.and_then(|l| l.get(key))));
        let source_cluster = text(annotations.and_then(|a| a.get(SOURCE_CLUSTER)));
        let uid = meta.uid.take().map(Into::into);
        let resource_version = meta.resource_version.take().map(Into::into);
        // Read by nothing the controller decides.
        meta.creation_timestamp = None;
        // Serializing a DynamicObject cannot fail (its content is already JSON).
        let rest = PackedText::pack(&serde_json::to_vec(&object).unwrap_or_default());
        Self {
            path: path.into(),
            uid,
            resource_version,
            owned_by,
            uid_labels,
            source_cluster,
            rest,
        }
    }

    /// The cache key of the copy at `namespace`/`name`.
    pub fn path_of(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    /// `<namespace>/<name>`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The copy's namespace.
    pub fn namespace(&self) -> &str {
        self.path.split_once('/').map_or("", |(namespace, _)| namespace)
    }

    /// The copy's name.
    pub fn name(&self) -> &str {
        self.path.split_once('/').map_or(&*self.path, |(_, name)| name)
    }

    /// The copy's resourceVersion as last seen.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Whether `owner`'s ownership annotation names it: the only proof that it is `owner`'s copy.
    pub fn is_owned_by(&self, owner: &Owner) -> bool {
        self.owned_by[tier(owner)]
            .as_deref()
            .is_some_and(|value| owner.is_annotation_value(value))
            && owner.is_from(self.source_cluster.as_deref())
    }

    /// Whether it carries `owner`'s UID label: a candidate when every copy of the owner goes.
    pub fn is_labelled_for(&self, owner: &Owner) -> bool {
        self.uid_labels[tier(owner)].as_deref() == Some(owner.uid())
    }

    /// The whole copy as last seen, for a decision that reads more than the fields above; `None` if
    /// the text does not decode (it was encoded from the same type, so it always should).
    pub fn object(&self) -> Option<DynamicObject> {
        let mut object: DynamicObject = self.rest.decode().ok()?;
        let meta = &mut object.metadata;
        meta.namespace = Some(self.namespace().to_owned());
        meta.name = Some(self.name().to_owned());
        meta.uid = self.uid.as_deref().map(str::to_owned);
        meta.resource_version = self.resource_version.as_deref().map(str::to_owned);
        Some(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ME: &str = "projection-controller";

    fn watched() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "cfg", "namespace": "team-a", "uid": "u-copy", "resourceVersion": "42",
                "creationTimestamp": "2026-11-24T00:00:00Z",
                "labels": {OWNED_BY_PROJECTION_UID: "u-p", "app": "web"},
                "annotations": {OWNED_BY_PROJECTION: "team-a/p", "projection.sh/source-hash": "h"},
                "managedFields": [
                    {"manager": ME, "operation": "Update", "apiVersion": "v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}}}},
                    {"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}},
                ],
            },
            "data": {"k": "v", "x": "y"},
        }))
        .expect("a ConfigMap")
    }

    fn projection(name: &str, uid: &str) -> Owner {
        Owner::Projection {
            namespace: "team-a".into(),
            name: name.into(),
            uid: uid.into(),
            cluster: None,
        }
    }

    #[test]
    fn the_header_answers_whose_copy_it_is_without_decoding() {
        let cached = CachedCopy::new(watched(), ME);
        assert_eq!(cached.path(), "team-a/cfg");
        assert_eq!((cached.namespace(), cached.name()), ("team-a", "cfg"));
        assert_eq!(cached.resource_version(), Some("42"));
        assert!(
            cached.is_owned_by(&projection("p", "u-other")),
            "the annotation proves it"
        );
        assert!(
            !cached.is_owned_by(&projection("q", "u-p")),
            "the label alone does not"
        );
        let cluster = Owner::ClusterProjection {
            name: "team-a/p".into(),
            uid: "u-p".into(),
            cluster: None,
        };
        assert!(
            !cached.is_owned_by(&cluster),
            "the other tier's key is another annotation"
        );
        assert!(!cached.is_labelled_for(&cluster));
        assert!(cached.is_labelled_for(&projection("q", "u-p")));
        assert!(!cached.is_labelled_for(&projection("p", "u-other")));
        assert!(
            !cached.is_owned_by(&projection("p", "u-p").from_cluster("a")),
            "a copy without a source cluster is no other cluster's"
        );
    }

    #[test]
    fn a_copy_from_another_cluster_is_ours_only_from_there() {
        let mut object = watched();
        object
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(SOURCE_CLUSTER.into(), "a".into());
        let cached = CachedCopy::new(object, ME);
        assert!(cached.is_owned_by(&projection("p", "u-p").from_cluster("a")));
        assert!(!cached.is_owned_by(&projection("p", "u-p").from_cluster("b")));
        assert!(
            !cached.is_owned_by(&projection("p", "u-p")),
            "not the same-named CR of the cluster it is in"
        );
    }

    #[test]
    fn the_decoded_copy_is_the_trimmed_copy() {
        let cached = CachedCopy::new(watched(), ME);
        let decoded = serde_json::to_value(cached.object().expect("decodes")).expect("serializes");
        let mut expected = watched();
        trim_copy(&mut expected.metadata, ME);
        expected.metadata.creation_timestamp = None;
        assert_eq!(decoded, serde_json::to_value(expected).expect("serializes"));
        assert_eq!(
            decoded["metadata"]["managedFields"].as_array().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn the_text_is_smaller_than_the_object_it_came_from() {
        let cached = CachedCopy::new(watched(), ME);
        let whole = serde_json::to_string(&watched()).expect("serializes");
        let rest = String::from_utf8(cached.rest.unpack().expect("unpacks")).expect("text");
        assert!(rest.len() < whole.len());
        assert!(
            cached.rest.packed_len() * 2 < rest.len(),
            "packed: {} of {}",
            cached.rest.packed_len(),
            rest.len()
        );
        assert!(!rest.contains("u-copy"), "the uid is held once, in the header");
        assert!(!rest.contains("kubectl"), "other managers' entries are dropped");
    }
}
