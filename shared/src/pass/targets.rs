//! Where a ClusterProjection writes: resolving its target namespaces from the namespaces that exist.
//! Pure functions.

use crate::{
    api::{
        crd::{ClusterProjectionDestination, SourceRef},
        kind::CrView,
    },
    copy::self_copy::{SelfCopy, self_copy},
};
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// What the controller knows of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Whether it is being deleted.
    pub terminating: bool,
}

/// The resolved targets of a ClusterProjection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// Namespaces to hold a copy, sorted.
    pub write: Vec<String>,
    /// Listed namespaces that do not exist yet: written as soon as they are created.
    pub pending: Vec<String>,
    /// Namespaces skipped because they are being deleted.
    pub terminating: Vec<String>,
    /// The source's own namespace, skipped because the copy would be the source itself.
    pub skipped_source: Option<SelfCopy>,
}

impl Targets {
    /// The one target of a Projection: its own `namespace`, unless the copy named `copy_name`
    /// there would be the source itself (`source`; `None` when the copy goes to another cluster,
    /// where it cannot be).
    pub fn own_namespace(namespace: &str, source: Option<&SourceRef>, copy_name: &str) -> Self {
        match source.and_then(|source| self_copy(source, namespace, copy_name)) {
            Some(found) => Self {
                skipped_source: Some(found),
                ..Self::default()
            },
            None => Self {
                write: vec![namespace.to_owned()],
                ..Self::default()
            },
        }
    }

    /// The namespaces whose copies stay: those written, and those kept while terminating.
    pub fn keep(&self) -> BTreeSet<String> {
        self.write.iter().chain(&self.terminating).cloned().collect()
    }
}

/// Why targets cannot be resolved (`TargetResolutionFailed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetError(pub String);

/// The compiled form of a destination: which namespaces it names or selects.
#[derive(Debug)]
pub enum TargetRule {
    /// An explicit set.
    List(Vec<String>),
    /// A label selector (never empty).
    Selector(Selector),
}

impl TargetRule {
    /// Compiles a destination, refusing an empty or invalid selector and a destination with neither
    /// or both forms (the CRD refuses those too; this is defence in depth).
    pub fn of(destination: &ClusterProjectionDestination) -> Result<Self, TargetError> {
        match (&destination.namespaces, &destination.namespace_selector) {
            (Some(_), Some(_)) => Err(TargetError(
                "namespaces and namespaceSelector are mutually exclusive".into(),
            )),
            (Some(list), None) => {
                let mut list = list.clone();
                list.sort();
                list.dedup();
                Ok(Self::List(list))
            }
            (None, Some(selector)) => {
                let selector = Selector::try_from(selector.clone())
                    .map_err(|e| TargetError(format!("invalid namespaceSelector: {e}")))?;
                if selector.selects_all() {
                    return Err(TargetError(
                        "namespaceSelector matches all namespaces; refusing fan-out across the entire cluster".into(),
                    ));
                }
                Ok(Self::Selector(selector))
            }
            (None, None) => Err(TargetError(
                "ClusterProjection has neither destination.namespaces nor destination.namespaceSelector"
                    .into(),
            )),
        }
    }

    /// Whether a namespace with this name and these labels is a target (ignoring its state).
    pub fn selects(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::List(list) => list.binary_search_by(|n| n.as_str().cmp(name)).is_ok(),
            Self::Selector(selector) => selector.matches(labels),
        }
    }

    /// The targets among `namespaces` for copies of `source` named `copy_name`; a namespace where
    /// the copy would be the source itself is skipped.
    pub fn resolve<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a NamespaceInfo>,
        source: Option<&SourceRef>,
        copy_name: &str,
    ) -> Targets {
        let mut targets = Targets::default();
        let namespaces: Vec<&NamespaceInfo> = namespaces.into_iter().collect();
        let existing: BTreeMap<&str, &NamespaceInfo> =
            namespaces.iter().map(|n| (n.name.as_str(), *n)).collect();
        let mut candidates: Vec<&NamespaceInfo> = match self {
            Self::List(list) => {
                for name in list {
                    if !existing.contains_key(name.as_str()) {
                        targets.pending.push(name.clone());
                    }
                }
                list.iter()
                    .filter_map(|n| existing.get(n.as_str()).copied())
                    .collect()
            }
            Self::Selector(selector) => namespaces
                .into_iter()
                .filter(|n| selector.matches(&n.labels))
                .collect(),
        };
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        for ns in candidates {
            if let Some(found) = source.and_then(|source| self_copy(source, &ns.name, copy_name)) {
                targets.skipped_source = Some(found);
            } else if ns.terminating {
                targets.terminating.push(ns.name.clone());
            } else {
                targets.write.push(ns.name.clone());
            }
        }
        targets
    }
}

/// Where the copies of `cr` go among `namespaces` (as they are now): a Projection's own namespace,
/// or the namespaces a ClusterProjection's destination names or selects. `Err` is the
/// `TargetResolutionFailed` message.
pub fn targets_of<'a>(
    cr: &CrView<'_>,
    namespaces: impl IntoIterator<Item = &'a NamespaceInfo>,
) -> Result<Targets, String> {
    // In another cluster no copy can be the source itself.
    let source = cr.cluster.is_none().then_some(cr.source);
    match cr.namespaces {
        None => Ok(Targets::own_namespace(
            cr.home().unwrap_or_default(),
            source,
            cr.copy_name,
        )),
        Some(destination) => {
            let rule = TargetRule::of(destination).map_err(|e| e.0)?;
            Ok(rule.resolve(namespaces, source, cr.copy_name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, labels: &[(&str, &str)], terminating: bool) -> NamespaceInfo {
        NamespaceInfo {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            terminating,
        }
    }

    fn source(name: &str) -> SourceRef {
        serde_json::from_value(json!({"kind": "ConfigMap", "namespace": "src", "name": name}))
            .expect("source")
    }

    fn destination(value: serde_json::Value) -> ClusterProjectionDestination {
        serde_json::from_value(value).expect("destination")
    }

    fn cluster() -> Vec<NamespaceInfo> {
        vec![
            ns("a", &[("tier", "prod")], false),
            ns("b", &[("tier", "prod")], true),
            ns("c", &[("tier", "dev")], false),
            ns("src", &[("tier", "prod")], false),
        ]
    }

    #[test]
    fn a_list_is_sorted_skips_terminating_and_reports_missing_as_pending() {
        let rule = TargetRule::of(&destination(
            json!({"namespaces": ["c", "missing", "b", "a", "a"]}),
        ))
        .unwrap();
        let t = rule.resolve(&cluster(), Some(&source("cfg")), "copy");
        assert_eq!(t.write, ["a", "c"]);
        assert_eq!(t.pending, ["missing"]);
        assert_eq!(t.terminating, ["b"]);
    }

    #[test]
    fn a_selector_matches_labels_and_skips_the_source_itself() {
        let rule = TargetRule::of(&destination(
            json!({"namespaceSelector": {"matchLabels": {"tier": "prod"}}}),
        ))
        .unwrap();
        let t = rule.resolve(&cluster(), Some(&source("cfg")), "cfg");
        assert_eq!(t.write, ["a"]);
        assert_eq!(t.terminating, ["b"]);
        assert_eq!(
            t.skipped_source.as_ref().map(|s| s.namespace.as_str()),
            Some("src")
        );
        assert_eq!(t.keep(), BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        assert!(rule.selects("x", &BTreeMap::from([("tier".into(), "prod".into())])));
        assert!(!rule.selects("x", &BTreeMap::new()));
    }

    #[test]
    fn expressions_work() {
        let rule = TargetRule::of(&destination(json!({"namespaceSelector": {"matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["dev"]}]}})))
        .unwrap();
        assert_eq!(
            rule.resolve(&cluster(), Some(&source("cfg")), "copy").write,
            ["a", "src"]
        );
    }

    #[test]
    fn empty_invalid_and_ambiguous_destinations_are_refused() {
        for (dest, expect) in [
            (json!({"namespaceSelector": {}}), "matches all namespaces"),
            (
                json!({"namespaceSelector": {"matchLabels": {}}}),
                "matches all namespaces",
            ),
            (
                json!({"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}),
                "invalid namespaceSelector",
            ),
            (
                json!({"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}),
                "invalid namespaceSelector",
            ),
            (
                json!({"namespaces": ["a"], "namespaceSelector": {"matchLabels": {"k": "v"}}}),
                "mutually exclusive",
            ),
            (json!({}), "neither"),
        ] {
            let err = TargetRule::of(&destination(dest.clone()))
                .err()
                .unwrap_or_else(|| panic!("{dest} accepted"));
            assert!(err.0.contains(expect), "{dest}: {}", err.0);
        }
    }
}
