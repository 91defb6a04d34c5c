//! Who owns an object and whether a copy is current: `kubectl projection why` and `sources`. Only the
//! ownership annotation names an owner; the UID label is a hint that is never trusted alone.

use crate::{
    api::{
        crd::SourceRef,
        keys::{FIELD_MANAGER, OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION, SOURCE_HASH},
        reason::Reason,
        source::GroupKind,
    },
    copy::ownership::Owner,
};
use serde::Serialize;
use serde_json::Value;

pub use crate::api::kind::CrName;

/// How kubectl names `cr`: `projection NAME -n NAMESPACE`, `clusterprojection NAME`.
pub fn kubectl_name(cr: &CrName) -> String {
    match cr {
        CrName::Projection { namespace, name } => format!("projection {name} -n {namespace}"),
        CrName::ClusterProjection { name } => format!("clusterprojection {name}"),
    }
}

/// The CRs an object's ownership annotations name (a Projection's value is `<namespace>/<name>`);
/// an unreadable value names none.
pub fn named_owners(object: &Value) -> Vec<CrName> {
    let annotations = &object["metadata"]["annotations"];
    let mut owners = Vec::new();
    if let Some((namespace, name)) = annotations[OWNED_BY_PROJECTION]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
    {
        owners.push(CrName::Projection {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    }
    if let Some(name) = annotations[OWNED_BY_CLUSTER_PROJECTION]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        owners.push(CrName::ClusterProjection {
            name: name.to_owned(),
        });
    }
    owners
}

/// Whether a copy is current: its `projection.sh/source-hash` against the hash of what its CR
/// builds from the source now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum Currency {
    /// The copy carries the hash of the content built now.
    Current,
    /// The copy was built from other content (the source or the CR changed since).
    Stale {
        /// The copy's hash.
        copy: String,
        /// The hash of the content built now.
        now: String,
    },
    /// The copy carries no hash (written by an older controller, or edited).
    Unstamped,
}

/// Compares the hash `copy` carries with `now`, the hash of the content built from the source.
pub fn currency(copy: &Value, now: &str) -> Currency {
    match copy["metadata"]["annotations"][SOURCE_HASH].as_str() {
        Some(hash) if hash == now => Currency::Current,
        Some(hash) => Currency::Stale {
            copy: hash.to_owned(),
            now: now.to_owned(),
        },
        None => Currency::Unstamped,
    }
}

/// One copy of a CR as `sources` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum CopyState {
    /// Ours, and carries the hash built now.
    Current,
    /// Ours, built from other content.
    Stale {
        /// The copy's hash.
        copy: String,
        /// The hash built now.
        now: String,
    },
    /// Ours, without a hash.
    Unstamped,
    /// Nothing at the copy's coordinates (not written yet, or deleted since).
    Missing,
    /// Something the CR does not own is there (a `DestinationConflict`).
    NotOurs,
    /// Ours, but what the source builds now is unknown (the source is missing or refused): why.
    Unknown {
        /// Why.
        why: String,
    },
}

/// The state of the object at a copy's coordinates (`None`: nothing there) for `owner`, given the
/// hash of the content built now (or why it cannot be built).
pub fn copy_state(object: Option<&Value>, owner: &Owner, now: Result<&str, &str>) -> CopyState {
    let Some(object) = object else {
        return CopyState::Missing;
    };
    let ours = object["metadata"]["annotations"][owner.annotation_key()]
        .as_str()
        .is_some_and(|v| owner.is_annotation_value(v));
    if !ours {
        return CopyState::NotOurs;
    }
    match now {
        Err(why) => CopyState::Unknown { why: why.to_owned() },
        Ok(now) => match currency(object, now) {
            Currency::Current => CopyState::Current,
            Currency::Stale { copy, now } => CopyState::Stale { copy, now },
            Currency::Unstamped => CopyState::Unstamped,
        },
    }
}

impl CopyState {
    /// Whether a person should look at it.
    pub fn needs_attention(&self) -> bool {
        !matches!(self, Self::Current)
    }

    /// A few words for a table.
    pub fn words(&self) -> String {
        match self {
            Self::Current => "current".to_owned(),
            Self::Stale { .. } => "stale".to_owned(),
            Self::Unstamped => "unstamped".to_owned(),
            Self::Missing => "missing".to_owned(),
            Self::NotOurs => "conflict (not ours)".to_owned(),
            Self::Unknown { why } => format!("unknown: {why}"),
        }
    }
}

/// Whether a CR of `source` whose copies are named `copy_name` would write a copy at `name` of
/// `kind` (namespaces aside: the CR's targets say which).
pub fn would_write(source: &SourceRef, copy_name: &str, kind: &GroupKind, name: &str) -> bool {
    copy_name == name && source.group_kind() == *kind
}

/// Whether a CR's `source` reads the object `name` of `kind` in `namespace` (version aside: copies
/// are of the kind, whatever version serves it).
pub fn reads(source: &SourceRef, kind: &GroupKind, namespace: &str, name: &str) -> bool {
    source.group_kind() == *kind && source.namespace == namespace && source.name == name
}

/// Whether our field manager ever wrote `object` (its `managedFields` keep an entry of ours): an
/// object we wrote that no CR owns now was left, orphaned or released.
pub fn written_by_us(object: &Value) -> bool {
    object["metadata"]["managedFields"]
        .as_array()
        .is_some_and(|entries| entries.iter().any(|e| e["manager"] == FIELD_MANAGER))
}

/// Whether an event about a CR (its `reason` and `note`) says the CR left the copy at `path`
/// (`<namespace>/<name>`) in place: orphaned by `deletionPolicy`/`sourceDeletionPolicy: Orphan`, or
/// left alone because its ownership annotation was removed or changed.
pub fn left_by_event(reason: &str, note: &str, path: &str) -> bool {
    let left = [Reason::DestinationOrphaned, Reason::DestinationLeftAlone]
        .iter()
        .any(|r| r.as_str() == reason);
    left && note.split([',', ' ']).any(|word| word.trim() == path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(annotations: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "team", "annotations": annotations}})
    }

    #[test]
    fn only_the_ownership_annotations_name_an_owner() {
        #[rustfmt::skip]
        let cases: Vec<(Value, Vec<CrName>)> = vec![
            (object(json!({OWNED_BY_PROJECTION: "team/p"})),
                vec![CrName::Projection { namespace: "team".into(), name: "p".into() }]),
            (object(json!({OWNED_BY_CLUSTER_PROJECTION: "fan"})), vec![CrName::ClusterProjection { name: "fan".into() }]),
            (object(json!({OWNED_BY_PROJECTION: "no-slash"})), vec![]),
            (object(json!({OWNED_BY_PROJECTION: "/p"})), vec![]),
            (object(json!({})), vec![]),
            (json!({"metadata": {"labels": {"projection.sh/owned-by-projection-uid": "u"}}}), vec![]),
        ];
        for (object, expected) in cases {
            assert_eq!(named_owners(&object), expected, "{object}");
        }
        let owner = CrName::Projection {
            namespace: "team".into(),
            name: "p".into(),
        };
        assert!(Owner::of(&owner, "u").owns(Some(
            &[(OWNED_BY_PROJECTION.to_owned(), "team/p".to_owned())].into()
        )));
        assert_eq!(kubectl_name(&owner), "projection p -n team");
        assert_eq!(owner.to_string(), "Projection team/p", "the webhook's words");
    }

    #[test]
    fn a_copy_is_current_when_it_carries_the_hash_built_now() {
        let copy = object(json!({SOURCE_HASH: "abc"}));
        assert_eq!(currency(&copy, "abc"), Currency::Current);
        assert_eq!(
            currency(&copy, "def"),
            Currency::Stale {
                copy: "abc".into(),
                now: "def".into()
            }
        );
        assert_eq!(currency(&object(json!({})), "abc"), Currency::Unstamped);
    }

    #[test]
    fn what_a_cr_reads_and_writes() {
        let source: SourceRef =
            serde_json::from_value(json!({"kind": "ConfigMap", "namespace": "src", "name": "cfg"})).unwrap();
        let cm = GroupKind {
            group: String::new(),
            kind: "ConfigMap".into(),
        };
        let secret = GroupKind {
            group: String::new(),
            kind: "Secret".into(),
        };
        assert!(reads(&source, &cm, "src", "cfg"));
        assert!(!reads(&source, &cm, "other", "cfg"));
        assert!(!reads(&source, &secret, "src", "cfg"));
        assert!(would_write(&source, "renamed", &cm, "renamed"));
        assert!(!would_write(&source, "renamed", &cm, "cfg"));
        assert!(!would_write(&source, "renamed", &secret, "renamed"));
    }

    #[test]
    fn a_left_copy_is_told_by_our_field_manager_and_the_events() {
        let ours =
            json!({"metadata": {"managedFields": [{"manager": "kubectl"}, {"manager": FIELD_MANAGER}]}});
        assert!(written_by_us(&ours));
        assert!(!written_by_us(
            &json!({"metadata": {"managedFields": [{"manager": "kubectl"}]}})
        ));
        assert!(left_by_event(
            "DestinationOrphaned",
            "a/cfg, b/cfg left in place, no longer managed",
            "b/cfg"
        ));
        assert!(left_by_event(
            "DestinationLeftAlone",
            "b/cfg (not owned)",
            "b/cfg"
        ));
        assert!(!left_by_event(
            "DestinationOrphaned",
            "a/cfg left in place, no longer managed",
            "b/cfg"
        ));
        assert!(!left_by_event("DestinationDeleted", "b/cfg", "b/cfg"));
    }

    #[test]
    fn a_copy_state_is_read_from_what_is_at_its_coordinates() {
        let owner = Owner::of(&CrName::ClusterProjection { name: "fan".into() }, "u");
        let ours = object(json!({OWNED_BY_CLUSTER_PROJECTION: "fan", SOURCE_HASH: "h1"}));
        let stranger = object(json!({OWNED_BY_CLUSTER_PROJECTION: "other", SOURCE_HASH: "h1"}));
        let unstamped = object(json!({OWNED_BY_CLUSTER_PROJECTION: "fan"}));
        #[rustfmt::skip]
        let cases: Vec<(Option<&Value>, Result<&str, &str>, CopyState)> = vec![
            (None, Ok("h1"), CopyState::Missing),
            (Some(&ours), Ok("h1"), CopyState::Current),
            (Some(&ours), Ok("h2"), CopyState::Stale { copy: "h1".into(), now: "h2".into() }),
            (Some(&stranger), Ok("h1"), CopyState::NotOurs),
            (Some(&ours), Err("source gone"), CopyState::Unknown { why: "source gone".into() }),
            (Some(&unstamped), Ok("h1"), CopyState::Unstamped),
        ];
        for (object, now, expected) in cases {
            assert_eq!(copy_state(object, &owner, now), expected);
        }
        assert!(!CopyState::Current.needs_attention() && CopyState::Missing.needs_attention());
    }
}
