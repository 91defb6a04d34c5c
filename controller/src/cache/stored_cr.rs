//! A CR as the controller's store keeps it between reconciles: its metadata parsed (the store's
//! key, the relevance filter and the queue read it; trimmed by [`crate::cache::cache_trim::trim_cr`]) and
//! everything else (spec and status) as packed JSON text ([`crate::cache::packed_text`]), decoded back
//! into the full CR for each reconcile.
//!
//! The store holds every CR for as long as it exists, and a parsed CR is mostly fixed costs: the
//! `Projection` struct is 840 bytes before any string, and each string of the spec and of the
//! status's conditions (four per condition) is an allocation of its own. The packed text is one
//! allocation of about a quarter of the text's length. A reconcile decodes it again in
//! microseconds, against the milliseconds of the API calls it makes.

use crate::cache::{cache_trim::trim_cr, packed_text::PackedText};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer, Serialize, de::DeserializeOwned};
use std::{borrow::Cow, fmt, marker::PhantomData};

/// A CR of kind `K` as the store keeps it (see the module's documentation). It is a `Resource` of
/// the same kind, group, version and scope as `K`, so a watch of `Api<StoredCr<K>>` reads `K`'s
/// objects, each compacted as it is decoded.
pub struct StoredCr<K> {
    metadata: ObjectMeta,
    /// The CR with its `metadata` empty, as packed JSON text.
    body: PackedText,
    kind: PhantomData<fn() -> K>,
}

impl<K> StoredCr<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    /// Compacts `cr` (its metadata trimmed to what decisions read).
    pub fn new(mut cr: K) -> Result<Self, serde_json::Error> {
        let mut metadata = std::mem::take(cr.meta_mut());
        trim_cr(&mut metadata);
        Ok(Self {
            metadata,
            body: PackedText::pack(&serde_json::to_vec(&cr)?),
            kind: PhantomData,
        })
    }

    /// The CR as it was compacted (its metadata trimmed).
    pub fn expand(&self) -> Result<K, serde_json::Error> {
        let mut cr: K = self.body.decode()?;
        *cr.meta_mut() = self.metadata.clone();
        Ok(cr)
    }
}

impl<K> Clone for StoredCr<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for StoredCr<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCr")
            .field("metadata", &self.metadata)
            .field("body", &self.body)
            .finish()
    }
}

impl<K> Resource for StoredCr<K>
where
    K: Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dynamic: &()) -> Cow<'_, str> {
        K::kind(dynamic)
    }
    fn group(dynamic: &()) -> Cow<'_, str> {
        K::group(dynamic)
    }
    fn version(dynamic: &()) -> Cow<'_, str> {
        K::version(dynamic)
    }
    fn api_version(dynamic: &()) -> Cow<'_, str> {
        K::api_version(dynamic)
    }
    fn plural(dynamic: &()) -> Cow<'_, str> {
        K::plural(dynamic)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Decodes a `K` and compacts it: what a watch of `Api<StoredCr<K>>` does with each object.
impl<'de, K> Deserialize<'de> for StoredCr<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let cr = K::deserialize(deserializer)?;
        Self::new(cr).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::api::crd::{ClusterProjection, Projection};

    fn projection() -> Projection {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "projection.sh/v1",
            "kind": "Projection",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "generation": 3, "finalizers": ["projection.sh/finalizer"],
                "labels": {"team": "a"},
                "annotations": {"projection.sh/reconcile-request": "1", "note": "x"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {
                "source": {"group": "", "version": "v1", "kind": "ConfigMap", "namespace": "src", "name": "cm"},
                "destination": {"name": "copy"},
                "overlay": {"labels": {"env": "prod"}}
            },
            "status": {
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Projected",
                    "message": "projected to ns/copy", "lastTransitionTime": "2026-11-24T10:00:00Z",
                    "observedGeneration": 3
                }]
            }
        }))
        .expect("a valid Projection")
    }

    #[test]
    fn expands_to_the_cr_with_its_metadata_trimmed() {
        let original = projection();
        let stored = StoredCr::new(original.clone()).expect("compacts");
        let expanded = stored.expand().expect("expands");
        let mut trimmed = original;
        trim_cr(&mut trimmed.metadata);
        assert_eq!(
            serde_json::to_value(&expanded).unwrap(),
            serde_json::to_value(&trimmed).unwrap()
        );
        assert_eq!(expanded.metadata.labels, None);
        assert_eq!(expanded.metadata.managed_fields, None);
        assert_eq!(
            expanded.metadata.finalizers.as_deref(),
            Some(&["projection.sh/finalizer".to_string()][..])
        );
    }

    #[test]
    fn the_body_holds_no_metadata_and_is_packed() {
        let stored = StoredCr::new(projection()).expect("compacts");
        let body: serde_json::Value = stored.body.decode().unwrap();
        assert_eq!(body["metadata"], serde_json::json!({}));
        let text = serde_json::to_vec(&body).unwrap();
        assert!(
            stored.body.packed_len() * 2 < text.len(),
            "{} of {}",
            stored.body.packed_len(),
            text.len()
        );
        assert_eq!(stored.meta().resource_version.as_deref(), Some("42"));
        assert_eq!(stored.meta().generation, Some(3));
    }

    #[test]
    fn decodes_from_a_watch_object_like_the_kind_itself() {
        let wire = serde_json::to_string(&projection()).unwrap();
        let stored: StoredCr<Projection> = serde_json::from_str(&wire).expect("decodes");
        assert_eq!(stored.expand().unwrap().spec.source.name, "cm");
        let invalid = r#"{"apiVersion":"projection.sh/v1","kind":"Projection","metadata":{"name":"p"},"spec":{"source":7}}"#;
        let refused = serde_json::from_str::<StoredCr<Projection>>(invalid).unwrap_err();
        assert!(refused.to_string().contains("SourceRef"), "{refused}");
    }

    #[test]
    fn is_a_resource_of_the_same_kind_and_path() {
        assert_eq!(StoredCr::<Projection>::kind(&()), Projection::kind(&()));
        assert_eq!(
            StoredCr::<Projection>::url_path(&(), Some("ns")),
            Projection::url_path(&(), Some("ns"))
        );
        assert_eq!(
            StoredCr::<ClusterProjection>::url_path(&(), None),
            ClusterProjection::url_path(&(), None)
        );
    }
}
