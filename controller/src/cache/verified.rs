//! Copies known to be up to date, so that a pass over many unchanged copies costs no comparison.
//!
//! A ClusterProjection pass compares every target's cached copy with the copy it would write; at
//! 1000 namespaces that comparison (serialising the cached object, reading its `managedFields`,
//! walking both trees) was about 12 ms of CPU per pass, spent before a namespace event's one write
//! could go out. The comparison is a pure function of the copy as stored (named by its
//! resourceVersion) and of the desired copy, so its answer can be remembered: a copy found (or
//! written) up to date at resourceVersion R for desired copy D is still up to date while it is at R
//! and D is unchanged. Any other writer's edit changes R, and the next pass compares again.
//!
//! Entries are 64-bit digests (key, resourceVersion, desired copy) to keep a few dozen bytes per
//! copy. A digest collision could only make a pass skip a write it needed (never write what is not
//! ours); at 100,000 copies its odds are below one in 10^9.

use serde_json::Value;
use shared::api::keys::SOURCE_HASH;
use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
};

/// What identifies a desired copy, as a digest: its coordinates, labels and annotations. The
/// content is covered by the `projection.sh/source-hash` annotation that every built copy carries
/// (the hash of everything the copy holds besides the stamps); a desired copy without it has no
/// fingerprint and is always compared.
pub fn fingerprint(desired: &Value) -> Option<u64> {
    let metadata = desired.get("metadata")?;
    metadata.get("annotations")?.get(SOURCE_HASH)?.as_str()?;
    let mut hasher = DefaultHasher::new();
    for part in [&desired["apiVersion"], &desired["kind"]] {
        hash_value(part, &mut hasher);
    }
    for field in ["namespace", "name", "labels", "annotations"] {
        field.hash(&mut hasher);
        hash_value(&metadata[field], &mut hasher);
    }
    Some(hasher.finish())
}

/// Hashes a JSON value without serialising it (strings and maps, which is what metadata holds;
/// anything else by its text).
fn hash_value(value: &Value, hasher: &mut DefaultHasher) {
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::String(s) => {
            1u8.hash(hasher);
            s.hash(hasher);
        }
        Value::Object(map) => {
            2u8.hash(hasher);
            map.len().hash(hasher);
            for (key, value) in map {
                key.hash(hasher);
                hash_value(value, hasher);
            }
        }
        other => {
            3u8.hash(hasher);
            other.to_string().hash(hasher);
        }
    }
}

/// A 64-bit digest of a key, a resourceVersion or a uid, kept instead of the value where only
/// equality is asked of it and one is held per copy or per CR (here, and in the controller's journal
/// of its own writes, its record of written statuses and of recent events): a collision would take
/// two different values hashing alike.
pub fn digest(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// One copy found up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Verified {
    resource_version: u64,
    desired: u64,
}

/// The copies found up to date, by the digest of their key.
#[derive(Debug, Default)]
pub struct VerifiedCopies {
    entries: HashMap<u64, Verified>,
}

impl VerifiedCopies {
    /// Remembers that the copy at `key`, stored at `resource_version`, is up to date for the
    /// desired copy of fingerprint `desired`.
    pub fn remember(&mut self, key: &impl Hash, resource_version: &str, desired: u64) {
        let verified = Verified {
            resource_version: digest(&resource_version),
            desired,
        };
        self.entries.insert(digest(key), verified);
    }

    /// Whether the copy at `key`, stored at `resource_version`, was found up to date for the
    /// desired copy of fingerprint `desired`.
    pub fn is_current(&self, key: &impl Hash, resource_version: &str, desired: u64) -> bool {
        self.entries
            .get(&digest(key))
            .is_some_and(|v| v.resource_version == digest(&resource_version) && v.desired == desired)
    }

    /// Forgets a copy (it was deleted, or is no longer ours).
    pub fn forget(&mut self, key: &impl Hash) {
        self.entries.remove(&digest(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn desired(hash: &str, label: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "labels": {"team": label},
                         "annotations": {SOURCE_HASH: hash, "projection.sh/owned-by-projection": "n/p"}},
            "data": {"k": "v"},
        })
    }

    #[test]
    fn the_fingerprint_follows_every_part_of_the_desired_copy_but_its_content() {
        let base = fingerprint(&desired("h1", "a")).expect("a built copy has a fingerprint");
        assert_eq!(fingerprint(&desired("h1", "a")), Some(base), "deterministic");
        assert_ne!(
            fingerprint(&desired("h2", "a")),
            Some(base),
            "the source hash (the content)"
        );
        assert_ne!(fingerprint(&desired("h1", "b")), Some(base), "a label");
        let mut elsewhere = desired("h1", "a");
        elsewhere["metadata"]["namespace"] = json!("m");
        assert_ne!(fingerprint(&elsewhere), Some(base), "the namespace");
        let mut requested = desired("h1", "a");
        requested["metadata"]["annotations"]["projection.sh/reconcile-requested-at"] = json!("t");
        assert_ne!(fingerprint(&requested), Some(base), "another annotation");
        // A label value equal to another key's name must not collide with a moved key.
        let mut moved = desired("h1", "a");
        moved["metadata"]["labels"] = json!({"teama": ""});
        assert_ne!(fingerprint(&moved), Some(base));
    }

    #[test]
    fn a_copy_without_a_source_hash_has_no_fingerprint() {
        let mut unhashed = desired("h1", "a");
        unhashed["metadata"]["annotations"] = json!({});
        assert_eq!(fingerprint(&unhashed), None);
        assert_eq!(fingerprint(&json!({"kind": "ConfigMap"})), None);
    }

    #[test]
    fn a_copy_is_current_only_at_the_same_resource_version_and_desired_copy() {
        let mut verified = VerifiedCopies::default();
        let key = ("ConfigMap", "n", "c");
        assert!(!verified.is_current(&key, "7", 1), "nothing remembered yet");
        verified.remember(&key, "7", 1);
        assert!(verified.is_current(&key, "7", 1));
        assert!(!verified.is_current(&key, "8", 1), "someone else wrote it since");
        assert!(
            !verified.is_current(&key, "7", 2),
            "the source or the rules changed"
        );
        assert!(
            !verified.is_current(&("ConfigMap", "n", "d"), "7", 1),
            "another copy"
        );
        verified.remember(&key, "9", 2);
        assert!(verified.is_current(&key, "9", 2), "replaced by the newer check");
        assert_eq!(verified.entries.len(), 1);
        verified.forget(&key);
        assert!(!verified.is_current(&key, "9", 2));
        assert!(verified.entries.is_empty());
    }
}
