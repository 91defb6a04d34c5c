//! `projection.sh/source-hash`: a stable hash of a copy's built content, so "is this copy current?"
//! has an exact answer (compare the copy's annotation with the CR's `status.sourceHash`).
//!
//! The hash covers everything built from the source and the spec (data, spec, the labels and
//! annotations that travel, the overlay) and nothing placed afterwards: not the copy's name or
//! namespace, not the ownership keys, not the hash itself. It is computed over a canonical form
//! (object keys sorted, whatever order the JSON library keeps), so equal content always gives an
//! equal hash, and an unchanged source gives an unchanged copy: no write.

use crate::api::keys::SOURCE_HASH;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The hex SHA-256 of `content` (as built by [`crate::copy::destination::build_content`]), ignoring any
/// `projection.sh/source-hash` annotation it already carries.
pub fn source_hash(content: &Value) -> String {
    let mut hasher = Sha256::new();
    feed(&mut hasher, content, Some(Position::Root));
    let digest = hasher.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a value sits, for the one key that must not hash itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Position {
    Root,
    Metadata,
    Annotations,
}

/// Writes `value` in a canonical, unambiguous form: a type tag, then lengths before contents.
fn feed(hasher: &mut Sha256, value: &Value, at: Option<Position>) {
    match value {
        Value::Null => hasher.update(b"n"),
        Value::Bool(b) => hasher.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => feed_str(hasher, b'#', &n.to_string()),
        Value::String(s) => feed_str(hasher, b's', s),
        Value::Array(items) => {
            hasher.update(b"[");
            hasher.update((items.len() as u64).to_be_bytes());
            for item in items {
                feed(hasher, item, None);
            }
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .keys()
                .filter(|k| !(at == Some(Position::Annotations) && k.as_str() == SOURCE_HASH))
                .collect();
            keys.sort();
            hasher.update(b"{");
            hasher.update((keys.len() as u64).to_be_bytes());
            for key in keys {
                let child = match (at, key.as_str()) {
                    (Some(Position::Root), "metadata") => Some(Position::Metadata),
                    (Some(Position::Metadata), "annotations") => Some(Position::Annotations),
                    _ => None,
                };
                feed_str(hasher, b'k', key);
                feed(hasher, &map[key], child);
            }
        }
    }
}

fn feed_str(hasher: &mut Sha256, tag: u8, s: &str) {
    hasher.update([tag]);
    hasher.update((s.len() as u64).to_be_bytes());
    hasher.update(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equal_content_hashes_equal_and_any_change_shows() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "1", "b": "2"}},
                       "data": {"x": "1", "y": "2"}});
        let reordered = json!({"data": {"y": "2", "x": "1"}, "kind": "ConfigMap",
                               "metadata": {"labels": {"b": "2", "a": "1"}}, "apiVersion": "v1"});
        assert_eq!(source_hash(&a), source_hash(&reordered));
        assert_eq!(source_hash(&a).len(), 64);
        for changed in [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"x": "1", "y": "3"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "1"}}, "data": {"x": "1", "y": "2"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "1", "b": "2"}, "annotations": {"n": ""}}, "data": {"x": "1", "y": "2"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"x": "1", "y": "2"}}),
        ] {
            assert_ne!(source_hash(&a), source_hash(&changed), "{changed}");
        }
    }

    #[test]
    fn the_hash_annotation_itself_is_not_hashed_but_is_elsewhere() {
        let bare = json!({"metadata": {"annotations": {"n": "1"}}, "data": {"x": "1"}});
        let stamped =
            json!({"metadata": {"annotations": {"n": "1", SOURCE_HASH: "old"}}, "data": {"x": "1"}});
        assert_eq!(source_hash(&bare), source_hash(&stamped));
        let in_data = json!({"metadata": {"annotations": {"n": "1"}}, "data": {"x": "1", SOURCE_HASH: "v"}});
        assert_ne!(source_hash(&bare), source_hash(&in_data));
    }

    #[test]
    fn types_and_boundaries_are_unambiguous() {
        assert_ne!(source_hash(&json!({"a": "1"})), source_hash(&json!({"a": 1})));
        assert_ne!(source_hash(&json!(["ab", "c"])), source_hash(&json!(["a", "bc"])));
        assert_ne!(source_hash(&json!({"a": null})), source_hash(&json!({})));
    }
}
