//! JSON text as the controller's caches keep it between uses: LZ4-compressed against a dictionary of
//! the JSON those caches hold most. Every CR and every copy stays cached for as long as it exists,
//! and what a cache keeps as text (a CR's spec and status, a copy's content and metadata) is mostly
//! the same keys, condition types, reasons, annotation keys and `managedFields` shapes over and
//! over: with them in the dictionary a CR's 760 bytes of text take about 180. Unpacking costs
//! microseconds, against the milliseconds of the API calls of the reconcile or write that needs it.
//!
//! The text never leaves the process (nothing packed is written or sent), so the dictionary may
//! change from one version to the next.

use kube::core::DynamicObject;
use serde::de::DeserializeOwned;
use serde_json::json;
use shared::{
    api::crd::{ClusterProjection, Projection},
    api::keys::{OWNED_BY_PROJECTION, OWNED_BY_PROJECTION_UID, SOURCE_HASH},
};
use std::sync::LazyLock;

/// Packed JSON text (see the module's documentation).
#[derive(Clone, PartialEq, Eq)]
pub struct PackedText(Box<[u8]>);

impl PackedText {
    /// Packs `text`.
    pub fn pack(text: &[u8]) -> Self {
        Self(lz4_flex::block::compress_prepend_size_with_dict(text, &DICTIONARY).into_boxed_slice())
    }

    /// The text as packed; `None` if it does not unpack (it was packed by [`Self::pack`] in this
    /// process, so it always should).
    pub fn unpack(&self) -> Option<Vec<u8>> {
        lz4_flex::block::decompress_size_prepended_with_dict(&self.0, &DICTIONARY).ok()
    }

    /// Decodes the text as JSON.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        let text = self.unpack().ok_or_else(|| {
            <serde_json::Error as serde::de::Error>::custom("the cached text does not unpack")
        })?;
        serde_json::from_slice(&text)
    }

    #[cfg(test)]
    /// Bytes held.
    pub fn packed_len(&self) -> usize {
        self.0.len()
    }
}

impl std::fmt::Debug for PackedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.unpack() {
            Some(text) => write!(f, "{}", String::from_utf8_lossy(&text)),
            None => write!(f, "<{} packed bytes that do not unpack>", self.0.len()),
        }
    }
}

/// Typical texts of the caches, serialized by the same types as the cached ones, so that field
/// order and spelling match. Built once; a sample that does not decode (none should: the tests
/// check) is left out, which costs compression, not correctness.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut dictionary = Vec::new();
    // Least typical first: LZ4 prefers the nearest match, and the nearest is the dictionary's end.
    for sample in [
        typed::<DynamicObject>(copy_sample()),
        typed::<ClusterProjection>(cluster_projection_sample()),
        typed::<Projection>(projection_sample()),
    ]
    .into_iter()
    .flatten()
    {
        dictionary.extend_from_slice(&sample);
    }
    dictionary
});

/// `value` decoded as a `T` and serialized again.
fn typed<T: DeserializeOwned + serde::Serialize>(value: serde_json::Value) -> Option<Vec<u8>> {
    serde_json::to_vec(&serde_json::from_value::<T>(value).ok()?).ok()
}

fn condition(kind: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": kind, "status": "True", "reason": reason, "message": message,
        "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"
    })
}

/// A Projection as its store keeps it (metadata empty) after a pass that projected it.
fn projection_sample() -> serde_json::Value {
    json!({
        "apiVersion": "projection.sh/v1", "kind": "Projection", "metadata": {},
        "spec": {
            "source": {"group": "", "version": "v1", "kind": "ConfigMap", "namespace": "", "name": ""},
            "destination": {"name": ""}
        },
        "status": {
            "conditions": [
                condition("SourceResolved", "Resolved", "resolved /ConfigMap to preferred version v1"),
                condition("DestinationWritten", "Projected", ""),
                condition("Ready", "Projected", "")
            ],
            "destinationName": "",
            "writtenDestination": {"version": "v1", "kind": "ConfigMap", "name": ""},
            "sourceHash": ""
        }
    })
}

/// A ClusterProjection as its store keeps it after a pass that projected it.
fn cluster_projection_sample() -> serde_json::Value {
    json!({
        "apiVersion": "projection.sh/v1", "kind": "ClusterProjection", "metadata": {},
        "spec": {
            "source": {"group": "", "version": "v1", "kind": "Secret", "namespace": "", "name": ""},
            "destination": {"namespaceSelector": {"matchLabels": {"": ""}}, "name": ""}
        },
        "status": {
            "conditions": [
                condition("SourceResolved", "Resolved", "resolved /Secret to preferred version v1"),
                condition("DestinationWritten", "Projected", "projected to 1 of 1 namespaces"),
                condition("Ready", "Projected", "")
            ],
            "destinationName": "", "namespacesWritten": 1, "namespacesFailed": 0,
            "writtenDestination": {"version": "v1", "kind": "Secret", "name": ""},
            "sourceHash": ""
        }
    })
}

/// A copy as the copies' cache keeps it: name, namespace, uid and resourceVersion apart, our
/// `managedFields` entry only, its `fieldsV1` as text.
fn copy_sample() -> serde_json::Value {
    let [owner_field, hash_field, uid_field] =
        [OWNED_BY_PROJECTION, SOURCE_HASH, OWNED_BY_PROJECTION_UID].map(|key| format!("f:{key}"));
    let fields = json!({
        "f:metadata": {
            "f:annotations": {".": {}, owner_field: {}, hash_field: {}},
            "f:labels": {".": {}, uid_field: {}}
        },
        "f:data": {".": {}}
    });
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "annotations": {OWNED_BY_PROJECTION: "/", SOURCE_HASH: ""},
            "labels": {OWNED_BY_PROJECTION_UID: ""},
            "managedFields": [{
                "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields.to_string(),
                "manager": "projection-controller", "operation": "Update", "time": "2026-01-01T00:00:00Z"
            }]
        },
        "data": {}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_is_in_the_dictionary() {
        for sample in [
            typed::<DynamicObject>(copy_sample()),
            typed::<ClusterProjection>(cluster_projection_sample()),
            typed::<Projection>(projection_sample()),
        ] {
            assert!(sample.is_some(), "a sample does not decode as its type");
        }
        assert!(DICTIONARY.len() > 1500, "{}", DICTIONARY.len());
    }

    #[test]
    fn packs_and_unpacks_any_text() {
        for text in [
            &b""[..],
            b"{}",
            "naïve ✓ text, not even JSON".as_bytes(),
            &[0xff, 0x00, 0x7f],
        ] {
            assert_eq!(PackedText::pack(text).unpack().as_deref(), Some(text));
        }
        let long: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(PackedText::pack(&long).unpack(), Some(long));
    }

    #[test]
    fn a_typical_projection_takes_a_quarter_of_its_text() {
        let text = br#"{"apiVersion":"projection.sh/v1","kind":"Projection","metadata":{},"spec":{"source":{"kind":"ConfigMap","namespace":"b95515969-src","name":"s-0"}},"status":{"conditions":[{"type":"SourceResolved","status":"True","reason":"Resolved","message":"resolved /ConfigMap to preferred version v1","observedGeneration":1,"lastTransitionTime":"2026-11-24T10:26:10Z"},{"type":"DestinationWritten","status":"True","reason":"Projected","message":"","observedGeneration":1,"lastTransitionTime":"2026-11-24T10:26:10Z"},{"type":"Ready","status":"True","reason":"Projected","message":"","observedGeneration":1,"lastTransitionTime":"2026-11-24T10:26:10Z"}],"destinationName":"s-0","writtenDestination":{"version":"v1","kind":"ConfigMap","name":"s-0"},"sourceHash":"c7633df9d7e00bcc73dd4602dc3a1eec3ad3f29e61e27be0e99c44802c2d2191"}}"#;
        let packed = PackedText::pack(text);
        assert!(
            packed.packed_len() * 4 <= text.len(),
            "{} of {}",
            packed.packed_len(),
            text.len()
        );
        assert_eq!(packed.unpack().as_deref(), Some(&text[..]));
    }

    #[test]
    fn corrupt_bytes_do_not_unpack_and_do_not_panic() {
        let corrupt = PackedText(vec![200, 0, 0, 0, 0xf0, 1, 2].into_boxed_slice());
        assert_eq!(corrupt.unpack(), None);
        assert!(corrupt.decode::<serde_json::Value>().is_err());
        assert!(format!("{corrupt:?}").contains("do not unpack"));
    }
}
