//! Building what a copy carries from a source and a spec (SPEC §10): the content (hygiene, metadata
//! filter, overlay), the source hash, then per target the placement and the ownership stamp. The
//! content does not depend on the target, so a ClusterProjection builds it once for all its
//! namespaces and every copy carries the same hash.

use crate::{
    api::copy_spec::{FieldExclusion, KeySelection, MetadataFilter},
    api::crd::{CopyControls, Overlay},
    api::keys::SOURCE_HASH,
    copy::destination::{Target, build_content, metadata_map, stamp_owner},
    copy::field_exclusion::exclude_fields,
    copy::key_selection::{KeysRefused, select_keys},
    copy::ownership::Owner,
    copy::source_hash::source_hash,
};
use serde_json::Value;
use std::fmt;

/// What a spec says about the content of its copies.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyRules<'a> {
    /// `spec.overlay`.
    pub overlay: Option<&'a Overlay>,
    /// `spec.metadata`.
    pub metadata: Option<&'a MetadataFilter>,
    /// `spec.keys`.
    pub keys: Option<&'a KeySelection>,
    /// `spec.fields`.
    pub fields: Option<&'a FieldExclusion>,
}

impl<'a> CopyRules<'a> {
    /// The rules of a spec, either kind's.
    pub fn of(controls: &'a CopyControls) -> Self {
        Self {
            overlay: controls.overlay.as_deref(),
            metadata: controls.metadata.as_deref(),
            keys: controls.keys.as_deref(),
            fields: controls.fields.as_deref(),
        }
    }
}

/// Content built once per source version, to be placed at each target.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltContent {
    content: Value,
    hash: String,
}

/// Why no copy can be built from this source under this spec (`DestinationInvalid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyRefused {
    /// What is wrong, naming the spec field.
    pub message: String,
    /// Whether the copy would be an invalid object (refused at admission when the source is
    /// known), rather than an empty one (only reported).
    pub invalid_object: bool,
}

impl CopyRefused {
    fn invalid(message: String) -> Self {
        Self {
            message,
            invalid_object: true,
        }
    }
}

impl From<KeysRefused> for CopyRefused {
    fn from(refused: KeysRefused) -> Self {
        match refused {
            KeysRefused::InvalidObject(message) => Self::invalid(message),
            KeysRefused::NothingSelected(message) => Self {
                message,
                invalid_object: false,
            },
        }
    }
}

impl fmt::Display for CopyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl BuiltContent {
    /// Builds the content of the copies of `source` under `rules`, stamped with its hash.
    pub fn build(source: &Value, rules: &CopyRules<'_>) -> Result<Self, CopyRefused> {
        let mut content = build_content(source, rules.overlay, rules.metadata);
        if let Some(keys) = rules.keys {
            select_keys(&mut content, keys)?;
        }
        if let Some(fields) = rules.fields {
            exclude_fields(&mut content, &fields.exclude).map_err(CopyRefused::invalid)?;
        }
        let hash = source_hash(&content);
        if let Some(annotations) = metadata_map(&mut content, "annotations") {
            annotations.insert(SOURCE_HASH.to_owned(), Value::String(hash.clone()));
        }
        Ok(Self { content, hash })
    }

    /// The value of `projection.sh/source-hash` on every copy of this content.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The copy for `owner` at `target`.
    pub fn place(&self, owner: &Owner, target: &Target) -> Value {
        let mut copy = self.content.clone();
        stamp_owner(&mut copy, owner, target);
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(include: &[&str]) -> KeySelection {
        KeySelection {
            include: Some(include.iter().map(|s| (*s).to_owned()).collect()),
            ..KeySelection::default()
        }
    }

    #[test]
    fn an_invalid_object_is_told_apart_from_an_empty_one() {
        let tls = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                         "type": "kubernetes.io/tls", "data": {"ca.crt": "Qw==", "tls.crt": "Qw==", "tls.key": "Sw=="}});
        let only_ca = keys(&["ca.crt"]);
        let rules = CopyRules {
            keys: Some(&only_ca),
            ..CopyRules::default()
        };
        let refused = BuiltContent::build(&tls, &rules).expect_err("a tls Secret without its keys");
        assert!(refused.invalid_object, "{refused}");
        let nothing = keys(&["absent"]);
        let rules = CopyRules {
            keys: Some(&nothing),
            ..CopyRules::default()
        };
        let refused = BuiltContent::build(&tls, &rules).expect_err("no selected key");
        assert!(!refused.invalid_object, "{refused}");
    }
}
