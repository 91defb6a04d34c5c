//! Where a ClusterProjection writes: resolving its target namespaces from the namespaces that exist,
//! and summarising per-namespace failures into its status. Pure functions.

use crate::crd::{ClusterProjectionDestination, NamespaceFailure};
use kube::core::{Selector, SelectorExt};
use std::collections::BTreeMap;

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
    pub skipped_source: Option<String>,
}

/// Why targets cannot be resolved (`TargetResolutionFailed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetError(pub String);

/// The compiled form of a destination: which namespaces it names or selects.
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

    /// The targets among `namespaces`. `source_namespace` is skipped when the copy there would be
    /// the source itself (same name).
    pub fn resolve(&self, namespaces: &[NamespaceInfo], source_namespace: Option<&str>) -> Targets {
        let mut targets = Targets::default();
        let existing: BTreeMap<&str, &NamespaceInfo> =
            namespaces.iter().map(|n| (n.name.as_str(), n)).collect();
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
                .iter()
                .filter(|n| selector.matches(&n.labels))
                .collect(),
        };
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        for ns in candidates {
            if Some(ns.name.as_str()) == source_namespace {
                targets.skipped_source = Some(ns.name.clone());
            } else if ns.terminating {
                targets.terminating.push(ns.name.clone());
            } else {
                targets.write.push(ns.name.clone());
            }
        }
        targets
    }
}

/// How many failed namespaces the status lists (the count is always complete).
pub const MAX_LISTED_FAILURES: usize = 20;
/// How many failed namespaces a condition message names.
const MAX_NAMED_FAILURES: usize = 5;

/// The rollup of per-namespace failures: the condition reason (the shared one when every failure has
/// the same reason, `DestinationWriteFailed` otherwise), a message naming namespaces and reasons, and
/// the first failures sorted by namespace for `status.failedNamespaces`.
pub fn summarize_failures(failures: &[NamespaceFailure]) -> Option<(String, String, Vec<NamespaceFailure>)> {
    let first = failures.first()?;
    let mut sorted = failures.to_vec();
    sorted.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    let reason = if failures.iter().all(|f| f.reason == first.reason) {
        first.reason.clone()
    } else {
        "DestinationWriteFailed".into()
    };
    let named: Vec<String> = sorted
        .iter()
        .take(MAX_NAMED_FAILURES)
        .map(|f| format!("{} ({})", f.namespace, f.reason))
        .collect();
    let more = sorted.len().saturating_sub(MAX_NAMED_FAILURES);
    let message = if more > 0 {
        format!(
            "write failed in {} namespaces: {}, and {more} more",
            sorted.len(),
            named.join(", ")
        )
    } else {
        format!(
            "write failed in {} namespace{}: {}",
            sorted.len(),
            if sorted.len() == 1 { "" } else { "s" },
            named.join(", ")
        )
    };
    sorted.truncate(MAX_LISTED_FAILURES);
    Some((reason, message, sorted))
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
        let t = rule.resolve(&cluster(), None);
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
        let t = rule.resolve(&cluster(), Some("src"));
        assert_eq!(t.write, ["a"]);
        assert_eq!(t.terminating, ["b"]);
        assert_eq!(t.skipped_source.as_deref(), Some("src"));
        assert!(rule.selects("x", &BTreeMap::from([("tier".into(), "prod".into())])));
        assert!(!rule.selects("x", &BTreeMap::new()));
    }

    #[test]
    fn expressions_work() {
        let rule = TargetRule::of(&destination(json!({"namespaceSelector": {"matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["dev"]}]}})))
        .unwrap();
        assert_eq!(rule.resolve(&cluster(), None).write, ["a", "src"]);
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

    fn failure(ns: &str, reason: &str) -> NamespaceFailure {
        NamespaceFailure {
            namespace: ns.into(),
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn failures_roll_up_with_the_shared_reason_or_a_generic_one() {
        assert_eq!(summarize_failures(&[]), None);
        let (reason, message, listed) = summarize_failures(&[
            failure("b", "DestinationConflict"),
            failure("a", "DestinationConflict"),
        ])
        .unwrap();
        assert_eq!(reason, "DestinationConflict");
        assert_eq!(
            message,
            "write failed in 2 namespaces: a (DestinationConflict), b (DestinationConflict)"
        );
        assert_eq!(
            listed.iter().map(|f| f.namespace.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );

        let mixed: Vec<_> = (0..30)
            .map(|i| {
                failure(
                    &format!("ns-{i:02}"),
                    if i == 7 {
                        "DestinationCreateFailed"
                    } else {
                        "DestinationConflict"
                    },
                )
            })
            .collect();
        let (reason, message, listed) = summarize_failures(&mixed).unwrap();
        assert_eq!(reason, "DestinationWriteFailed");
        assert!(
            message.starts_with("write failed in 30 namespaces: ns-00 (DestinationConflict)"),
            "{message}"
        );
        assert!(message.ends_with("and 25 more"), "{message}");
        assert_eq!(listed.len(), MAX_LISTED_FAILURES);
    }
}
