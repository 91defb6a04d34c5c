//! Identifying sources: the version-free key that maps watch events to the CRs reading a source, and
//! the wording of resolution outcomes (kept identical to the Go operator's, which users grep for).

use crate::api::crd::SourceRef;
use std::fmt;

/// A kind in an API group, without a version: two CRs pinned to different versions of one kind read
/// the same objects.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
}

impl fmt::Display for GroupKind {
    /// `<group>/<Kind>`, so the core group renders as `/ConfigMap` (the Go operator's format).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.group, self.kind)
    }
}

/// `<group>/<Kind>/<namespace>/<name>`: one source object, whatever version it is read at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    /// The source's group and kind.
    pub group_kind: GroupKind,
    /// The source's namespace.
    pub namespace: String,
    /// The source's name.
    pub name: String,
}

impl SourceKey {
    /// The key of the object a `spec.source` points at.
    pub fn of(source: &SourceRef) -> Self {
        Self {
            group_kind: GroupKind {
                group: source.group.clone(),
                kind: source.kind.clone(),
            },
            namespace: source.namespace.clone(),
            name: source.name.clone(),
        }
    }
}

impl fmt::Display for SourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.group_kind, self.namespace, self.name)
    }
}

impl SourceRef {
    /// The source's group and kind.
    pub fn group_kind(&self) -> GroupKind {
        GroupKind {
            group: self.group.clone(),
            kind: self.kind.clone(),
        }
    }

    /// `<group>/<version>/<Kind>` as written in messages: `*` for an unpinned version, and the
    /// version alone for the core group (`v1/ConfigMap`, `*/ConfigMap`, `apps/v1/Deployment`).
    pub fn display_gvk(&self) -> String {
        let version = if self.version.is_empty() {
            "*"
        } else {
            &self.version
        };
        if self.group.is_empty() {
            format!("{version}/{}", self.kind)
        } else {
            format!("{}/{version}/{}", self.group, self.kind)
        }
    }
}

/// `SourceResolved` message of a successful resolution: empty when pinned, else names the version
/// discovery chose.
pub fn resolved_message(source: &SourceRef, resolved_version: &str) -> String {
    if source.version.is_empty() {
        format!(
            "resolved {} to preferred version {resolved_version}",
            source.group_kind()
        )
    } else {
        String::new()
    }
}

/// Message for a source kind that is cluster-scoped: only namespaced objects can be mirrored.
pub fn cluster_scoped_message(source: &SourceRef) -> String {
    format!(
        "{} is cluster-scoped; projection only mirrors namespaced resources",
        source.display_gvk()
    )
}

/// Message for a source kind discovery does not know (yet).
pub fn unknown_kind_message(source: &SourceRef, detail: &str) -> String {
    format!("resolving {}: {detail}", source.display_gvk())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(group: &str, version: &str, kind: &str) -> SourceRef {
        SourceRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: "n".into(),
        }
    }

    #[test]
    fn keys_ignore_the_version() {
        assert_eq!(
            SourceKey::of(&source("", "v1", "ConfigMap")),
            SourceKey::of(&source("", "", "ConfigMap"))
        );
        assert_eq!(
            SourceKey::of(&source("", "v1", "ConfigMap")).to_string(),
            "/ConfigMap/ns/n"
        );
        assert_eq!(
            SourceKey::of(&source("apps", "", "Deployment")).to_string(),
            "apps/Deployment/ns/n"
        );
    }

    #[test]
    fn messages_match_the_go_operator() {
        assert_eq!(
            resolved_message(&source("", "", "ConfigMap"), "v1"),
            "resolved /ConfigMap to preferred version v1"
        );
        assert_eq!(resolved_message(&source("", "v1", "ConfigMap"), "v1"), "");
        assert_eq!(
            cluster_scoped_message(&source("", "v1", "Namespace")),
            "v1/Namespace is cluster-scoped; projection only mirrors namespaced resources"
        );
        assert_eq!(
            unknown_kind_message(&source("example.com", "", "Widget"), "not found"),
            "resolving example.com/*/Widget: not found"
        );
    }
}
