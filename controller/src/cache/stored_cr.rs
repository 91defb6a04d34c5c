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
//!
//! What the scrape-time gauges count of each CR (its `Ready` condition, a ClusterProjection's
//! namespace counts, `spec.suspend`) is read once, when the CR is stored, into a [`ReadySummary`]
//! of 16 bytes, so a scrape decodes no CR.

use crate::cache::{cache_trim::trim_cr, packed_text::PackedText};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer, Serialize, de::DeserializeOwned};
use shared::api::reason::Reason;
use std::{borrow::Cow, fmt, marker::PhantomData};

/// A CR of kind `K` as the store keeps it (see the module's documentation). It is a `Resource` of
/// the same kind, group, version and scope as `K`, so a watch of `Api<StoredCr<K>>` reads `K`'s
/// objects, each compacted as it is decoded.
pub struct StoredCr<K> {
    metadata: ObjectMeta,
    /// The CR with its `metadata` empty, as packed JSON text.
    body: PackedText,
    /// What the scrape-time gauges read of its status.
    ready: ReadySummary,
    kind: PhantomData<fn() -> K>,
}

/// What the controller's scrape-time gauges (`projection_resources`, `projection_resource_info`,
/// `projection_cluster_projection_namespaces`) count of a CR, read from it when it is stored: the
/// status and reason of its `Ready` condition as bounded label values, a ClusterProjection's
/// `namespacesWritten` and `namespacesFailed` (0 for a Projection), and `spec.suspend`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadySummary {
    status: ReadyStatus,
    reason: ReadyReason,
    pub namespaces_written: i32,
    pub namespaces_failed: i32,
    /// `spec.suspend` is true.
    pub suspended: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ReadyStatus {
    True,
    False,
    /// `Unknown`, any other value, or no `Ready` condition.
    #[default]
    Unknown,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ReadyReason {
    /// No `Ready` condition.
    #[default]
    None,
    Known(Reason),
    /// A reason the controller does not write.
    Other,
}

impl ReadySummary {
    /// The `Ready` condition's status: `True`, `False`, or `Unknown` (also without one).
    pub fn ready(&self) -> &'static str {
        match self.status {
            ReadyStatus::True => "True",
            ReadyStatus::False => "False",
            ReadyStatus::Unknown => "Unknown",
        }
    }

    /// The `Ready` condition's reason (one of [`Reason`]), `Other` for a reason the controller does
    /// not write, empty without a condition.
    pub fn reason(&self) -> &'static str {
        match self.reason {
            ReadyReason::None => "",
            ReadyReason::Known(reason) => reason.as_str(),
            ReadyReason::Other => "Other",
        }
    }

    /// Whose move it is ([`shared::api::reason::Cause`]): empty while `Ready` is `True` or for a
    /// reason the controller does not write; `platform` for a CR with no `Ready` condition (no
    /// controller has reported on it).
    pub fn cause(&self) -> &'static str {
        match (self.status, self.reason) {
            (ReadyStatus::True, _) | (_, ReadyReason::Other) => "",
            (_, ReadyReason::Known(reason)) => reason.cause().as_str(),
            (_, ReadyReason::None) => shared::api::reason::Cause::Platform.as_str(),
        }
    }

    /// Reads it from a CR's JSON text (the fields it needs of `status`; the rest is skipped).
    fn of_text(text: &[u8]) -> Result<Self, serde_json::Error> {
        #[derive(Deserialize)]
        struct Cr<'a> {
            #[serde(default)]
            spec: Option<Spec>,
            #[serde(borrow, default)]
            status: Option<Status<'a>>,
        }
        #[derive(Deserialize)]
        struct Spec {
            #[serde(default)]
            suspend: Option<bool>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Status<'a> {
            #[serde(borrow, default)]
            conditions: Vec<ConditionView<'a>>,
            #[serde(default)]
            namespaces_written: i32,
            #[serde(default)]
            namespaces_failed: i32,
        }
        #[derive(Deserialize)]
        struct ConditionView<'a> {
            #[serde(borrow, rename = "type")]
            type_: Cow<'a, str>,
            #[serde(borrow, default)]
            status: Cow<'a, str>,
            #[serde(borrow, default)]
            reason: Cow<'a, str>,
        }
        let cr = serde_json::from_slice::<Cr<'_>>(text)?;
        let suspended = cr.spec.and_then(|s| s.suspend) == Some(true);
        let Some(status) = cr.status else {
            return Ok(Self {
                suspended,
                ..Self::default()
            });
        };
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        Ok(Self {
            status: match ready.map(|c| &*c.status) {
                Some("True") => ReadyStatus::True,
                Some("False") => ReadyStatus::False,
                _ => ReadyStatus::Unknown,
            },
            reason: ready.map_or(ReadyReason::None, |c| {
                Reason::ALL
                    .iter()
                    .find(|r| r.as_str() == c.reason)
                    .map_or(ReadyReason::Other, |r| ReadyReason::Known(*r))
            }),
            namespaces_written: status.namespaces_written,
            namespaces_failed: status.namespaces_failed,
            suspended,
        })
    }
}

impl<K> StoredCr<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    /// Compacts `cr` (its metadata trimmed to what decisions read).
    pub fn new(mut cr: K) -> Result<Self, serde_json::Error> {
        let mut metadata = std::mem::take(cr.meta_mut());
        trim_cr(&mut metadata);
        let text = serde_json::to_vec(&cr)?;
        Ok(Self {
            metadata,
            ready: ReadySummary::of_text(&text)?,
            body: PackedText::pack(&text),
            kind: PhantomData,
        })
    }

    /// What the scrape-time gauges count of it, read when it was stored.
    pub fn ready_summary(&self) -> ReadySummary {
        self.ready
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
            ready: self.ready,
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for StoredCr<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCr")
            .field("metadata", &self.metadata)
            .field("body", &self.body)
            .field("ready", &self.ready)
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
    fn keeps_the_ready_summary_the_gauges_count() {
        let summary = |status: serde_json::Value| {
            let mut cr = serde_json::to_value(projection()).unwrap();
            cr["status"] = status;
            let cr: Projection = serde_json::from_value(cr).expect("a Projection");
            let s = StoredCr::new(cr).expect("compacts").ready_summary();
            (s.ready(), s.reason(), s.namespaces_written, s.namespaces_failed)
        };
        let condition = |type_: &str, status: &str, reason: &str| {
            serde_json::json!({"type": type_, "status": status, "reason": reason, "message": "",
                "lastTransitionTime": "2026-11-25T00:00:00Z"})
        };
        assert_eq!(
            summary(serde_json::json!({"conditions": [condition("Ready", "True", "Projected")]})),
            ("True", "Projected", 0, 0)
        );
        assert_eq!(
            summary(serde_json::json!({"conditions": [
                condition("SourceResolved", "False", "SourceNotFound"),
                condition("Ready", "False", "SourceNotFound"),
            ]})),
            ("False", "SourceNotFound", 0, 0)
        );
        assert_eq!(
            summary(serde_json::json!({})),
            ("Unknown", "", 0, 0),
            "no condition yet"
        );
        assert_eq!(
            summary(serde_json::Value::Null),
            ("Unknown", "", 0, 0),
            "no status yet"
        );
        // Whatever else a status writer put there, the values stay in a fixed set.
        assert_eq!(
            summary(serde_json::json!({"conditions": [condition("Ready", "Maybe", "SomethingElse")]})),
            ("Unknown", "Other", 0, 0)
        );
        let cluster: ClusterProjection = serde_json::from_value(serde_json::json!({
            "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
            "metadata": {"name": "c"},
            "spec": {
                "source": {"version": "v1", "kind": "ConfigMap", "namespace": "src", "name": "cm"},
                "destination": {"namespaces": ["a", "b", "c"]},
            },
            "status": {"conditions": [condition("Ready", "False", "DestinationConflict")],
                "namespacesWritten": 2, "namespacesFailed": 1},
        }))
        .expect("a ClusterProjection");
        let s = StoredCr::new(cluster).expect("compacts").ready_summary();
        assert_eq!(
            (s.ready(), s.reason(), s.namespaces_written, s.namespaces_failed),
            ("False", "DestinationConflict", 2, 1)
        );
        // It stays small beside the packed text.
        assert!(std::mem::size_of::<ReadySummary>() <= 12);
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
