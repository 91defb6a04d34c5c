//! The self-copy rule: a copy at its source's own coordinates (same namespace, same name) would be
//! the source itself, so it is never written. The webhook denies such a spec, the controller reports
//! `DestinationConflict` for a Projection and skips that namespace for a ClusterProjection; all of
//! them decide with [`self_copy`] and say so with its one message.

use crate::api::crd::SourceRef;
use std::fmt;

/// A copy that would be its own source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfCopy {
    /// The source's kind.
    pub kind: String,
    /// The namespace both would live in.
    pub namespace: String,
    /// The name both would carry.
    pub name: String,
}

/// Whether the copy of `source` named `copy_name` in `namespace` would be the source itself.
pub fn self_copy(source: &SourceRef, namespace: &str, copy_name: &str) -> Option<SelfCopy> {
    (source.namespace == namespace && source.name == copy_name).then(|| SelfCopy {
        kind: source.kind.clone(),
        namespace: namespace.to_owned(),
        name: copy_name.to_owned(),
    })
}

impl fmt::Display for SelfCopy {
    /// `the copy would be the source itself (<Kind> <namespace>/<name>)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the copy would be the source itself ({} {}/{})",
            self.kind, self.namespace, self.name
        )
    }
}

impl SelfCopy {
    /// The message for a `Projection`, with what to change.
    pub fn projection_message(&self) -> String {
        format!("{self}: set spec.destination.name to another name, or project from another namespace")
    }

    /// The message for a namespace listed by a `ClusterProjection`, with what to change.
    pub fn listed_namespace_message(&self) -> String {
        format!("{self}: remove this namespace or set spec.destination.name")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(namespace: &str, name: &str) -> SourceRef {
        serde_json::from_value(serde_json::json!({
            "kind": "ConfigMap", "namespace": namespace, "name": name
        }))
        .expect("source")
    }

    #[test]
    fn only_the_same_namespace_and_name_is_the_source() {
        // (source namespace, source name, copy namespace, copy name, self copy)
        for (sns, sn, ns, n, expected) in [
            ("a", "cfg", "a", "cfg", true),
            ("a", "cfg", "b", "cfg", false),
            ("a", "cfg", "a", "other", false),
            ("a", "cfg", "b", "other", false),
        ] {
            assert_eq!(
                self_copy(&source(sns, sn), ns, n).is_some(),
                expected,
                "{sns}/{sn} -> {ns}/{n}"
            );
        }
    }

    #[test]
    fn one_message_names_the_kind_and_coordinates() {
        let found = self_copy(&source("a", "cfg"), "a", "cfg").expect("self copy");
        assert_eq!(
            found.to_string(),
            "the copy would be the source itself (ConfigMap a/cfg)"
        );
        assert_eq!(
            found.projection_message(),
            "the copy would be the source itself (ConfigMap a/cfg): set spec.destination.name to \
             another name, or project from another namespace"
        );
        assert_eq!(
            found.listed_namespace_message(),
            "the copy would be the source itself (ConfigMap a/cfg): remove this namespace or set \
             spec.destination.name"
        );
    }
}
