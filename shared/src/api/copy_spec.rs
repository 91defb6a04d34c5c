//! The optional spec fields that say what a copy carries (SPEC §10): which keys of `data` and
//! `binaryData`, which fields, which labels and annotations. Shared by `Projection` and
//! `ClusterProjection`; absent means the Go operator's behaviour (everything travels but the
//! metadata hygiene list, see [`crate::copy::metadata_hygiene`]).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A glob over `data` / `binaryData` keys: key characters plus `*` (any run) and `?` (one).
pub const KEY_GLOB_PATTERN: &str = r"^[-._a-zA-Z0-9*?]+$";
/// A `data` / `binaryData` key, as the apiserver accepts it for ConfigMaps and Secrets.
pub const DATA_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";
/// A glob over label or annotation keys: key characters plus `*` and `?`.
pub const METADATA_GLOB_PATTERN: &str = r"^[-._a-zA-Z0-9/*?]+$";

/// Which keys of `data` and `binaryData` travel, and under which name (ConfigMap, Secret).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeySelection {
    /// Globs of the keys that travel; absent means every key. `*` matches any run of characters,
    /// `?` one character.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        inner(pattern(KEY_GLOB_PATTERN), length(min = 1, max = 253))
    )]
    pub include: Option<Vec<String>>,
    /// Globs of the keys that never travel; exclude wins over include.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(pattern(KEY_GLOB_PATTERN), length(min = 1, max = 253))
    )]
    pub exclude: Option<Vec<String>>,
    /// `from: to` renames of travelling keys. A rename onto another travelling key, or two keys
    /// renamed to one, is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<BTreeMap<String, String>>,
    /// A Secret whose selected keys no longer satisfy its `type` (e.g. `kubernetes.io/tls` without
    /// `tls.key`) is copied as `Opaque` when true; when false or absent, such a spec is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_type_change: Option<bool>,
    /// When the source has none of the selected keys, write an empty copy (true) rather than report
    /// `DestinationInvalid` and write nothing (false or absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_empty: Option<bool>,
}

/// Fields removed from every copy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FieldExclusion {
    /// JSONPath expressions (RFC 9535), evaluated against the built copy; every match is removed,
    /// e.g. `$.spec.template.spec.nodeSelector`. Paths reaching `apiVersion`, `kind`,
    /// `metadata.name`, `metadata.namespace` or the operator's `projection.sh/` keys are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(pattern(r"^\$"), length(min = 1, max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(p, !(p in ['$', '$.*', '$..*', '$.apiVersion', '$.kind', '$.metadata', '$.metadata.name', '$.metadata.namespace', '$.metadata.labels', '$.metadata.annotations']))").message("fields.exclude must not remove apiVersion, kind, metadata.name, metadata.namespace or the projection.sh/ keys"))]
    pub exclude: Vec<String>,
}

/// Label or annotation keys kept or dropped on top of the default hygiene list.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataKeyFilter {
    /// Globs of keys the default hygiene list drops that travel anyway (e.g.
    /// `argocd.argoproj.io/tracking-id`). Keys under `projection.sh/` are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(pattern(METADATA_GLOB_PATTERN), length(min = 1, max = 317))
    )]
    #[x_kube(validation = Rule::new("self.all(g, !g.startsWith('projection.sh/'))").message("keys under projection.sh/ are reserved for the operator"))]
    pub include: Option<Vec<String>>,
    /// Globs of further keys that never travel; exclude wins over include. The overlay still
    /// applies after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(pattern(METADATA_GLOB_PATTERN), length(min = 1, max = 317))
    )]
    pub exclude: Option<Vec<String>>,
}

/// Which of the source's labels and annotations travel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataFilter {
    /// Labels kept or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<MetadataKeyFilter>,
    /// Annotations kept or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<MetadataKeyFilter>,
}
