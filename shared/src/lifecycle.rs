//! Lifecycle decisions (SPEC §10): suspension and its `Suspended` condition, reconciles requested
//! with `projection.sh/requested-at`, and what happens to copies when their CR or their source goes
//! (`deletionPolicy`, `sourceDeletionPolicy`), down to the patch that orphans a copy.

use crate::{
    crd::{Condition, CopyPolicy},
    keys::{REQUESTED_AT, SOURCE_HASH},
    ownership::Owner,
    reason::Reason,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Condition type: `spec.suspend` holds every write and deletion of copies.
pub const SUSPENDED: &str = "Suspended";

/// The `Suspended` condition's message.
pub const SUSPENDED_MESSAGE: &str =
    "spec.suspend is true: no copy is written or deleted until it is set to false";

/// Whether `spec.suspend` holds the CR's copies (absent means no).
pub fn is_suspended(suspend: Option<bool>) -> bool {
    suspend == Some(true)
}

/// The conditions of a suspended CR: the others keep their values (they describe the last pass),
/// and `Suspended=True` says since when (its transition time stays while the suspension lasts).
pub fn suspended_conditions(current: &[Condition], generation: Option<i64>, now: &Time) -> Vec<Condition> {
    let since = current
        .iter()
        .find(|c| c.r#type == SUSPENDED && c.status == "True")
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let mut conditions: Vec<Condition> = current
        .iter()
        .filter(|c| c.r#type != SUSPENDED)
        .cloned()
        .collect();
    conditions.push(Condition {
        r#type: SUSPENDED.to_owned(),
        status: "True".to_owned(),
        reason: Reason::Suspended.as_str().to_owned(),
        message: SUSPENDED_MESSAGE.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    });
    conditions
}

/// The value of the CR's `projection.sh/requested-at` annotation, if any.
pub fn requested_at(annotations: Option<&BTreeMap<String, String>>) -> Option<&str> {
    annotations.and_then(|a| a.get(REQUESTED_AT)).map(String::as_str)
}

/// `status.lastHandledReconcileAt` after a pass that ran: the request it handled, or the last one
/// handled when the annotation was removed (Flux keeps it too).
pub fn handled_request(requested: Option<&str>, last_handled: Option<&str>) -> Option<String> {
    requested.or(last_handled).map(str::to_owned)
}

/// Stamps the request a copy is written for onto the built copy, so that a new value differs from
/// every existing copy and each one is rewritten once, even one the cache shows as current (the
/// write's resourceVersion precondition then proves the cache right, or a fresh read replaces it).
pub fn stamp_request(desired: &mut Value, requested: Option<&str>) {
    let Some(value) = requested else { return };
    let Some(metadata) = desired.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(map) = annotations.as_object_mut() {
        map.insert(REQUESTED_AT.to_owned(), Value::String(value.to_owned()));
    }
}

/// What happens to a copy that goes out of our hands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// It is deleted.
    Delete,
    /// It stays, without our ownership annotation, label and source hash.
    Orphan,
}

impl From<Option<CopyPolicy>> for Release {
    fn from(policy: Option<CopyPolicy>) -> Self {
        match policy.unwrap_or_default() {
            CopyPolicy::Delete => Self::Delete,
            CopyPolicy::Orphan => Self::Orphan,
        }
    }
}

/// What deleting the CR does to its copies (`spec.deletionPolicy`).
pub fn on_cr_deletion(policy: Option<CopyPolicy>) -> Release {
    policy.into()
}

/// What a withdrawn source (`reason`) does to the copies. `spec.sourceDeletionPolicy` only speaks
/// for a source that no longer exists: a source that vetoes projection (`projectable: "false"`, or
/// not opted in under the allowlist) has withdrawn its consent, and copies of it must not stay
/// around, managed or not.
pub fn on_source_loss(policy: Option<CopyPolicy>, reason: Reason) -> Release {
    match reason {
        Reason::SourceDeleted | Reason::SourceNotFound => policy.into(),
        _ => Release::Delete,
    }
}

/// The JSON merge patch that orphans a copy (its metadata): our ownership annotation and UID label,
/// the source hash and the request stamp go, with a resourceVersion precondition. `None` when
/// `owner` does not own it (then it is not ours to touch).
pub fn orphan_patch(meta: &ObjectMeta, owner: &Owner) -> Option<Value> {
    if !owner.owns(meta.annotations.as_ref()) {
        return None;
    }
    let present = |map: Option<&BTreeMap<String, String>>, keys: &[&str]| -> Map<String, Value> {
        keys.iter()
            .filter(|k| map.is_some_and(|m| m.contains_key(**k)))
            .map(|k| ((*k).to_owned(), Value::Null))
            .collect()
    };
    let annotations = present(
        meta.annotations.as_ref(),
        &[owner.annotation_key(), SOURCE_HASH, REQUESTED_AT],
    );
    let labels = present(meta.labels.as_ref(), &[owner.uid_label_key()]);
    let mut metadata = json!({"annotations": annotations});
    if !labels.is_empty() {
        metadata["labels"] = Value::Object(labels);
    }
    if let Some(rv) = &meta.resource_version {
        metadata["resourceVersion"] = Value::String(rv.clone());
    }
    Some(json!({ "metadata": metadata }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn condition(type_: &str, status: &str, reason: &str, since: i64) -> Condition {
        Condition {
            r#type: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: at(since),
        }
    }

    #[test]
    fn suspension_keeps_the_conditions_and_says_since_when() {
        let ready = condition("Ready", "True", "Projected", 5);
        // (current conditions, now, expected Suspended since)
        let table = [
            (vec![ready.clone()], 10, 10),
            (
                vec![ready.clone(), condition(SUSPENDED, "True", "Suspended", 7)],
                20,
                7,
            ),
            (vec![], 30, 30),
        ];
        for (current, now, since) in table {
            let next = suspended_conditions(&current, Some(2), &at(now));
            let kept: Vec<&Condition> = next.iter().filter(|c| c.r#type != SUSPENDED).collect();
            assert_eq!(
                kept,
                current
                    .iter()
                    .filter(|c| c.r#type != SUSPENDED)
                    .collect::<Vec<_>>(),
                "the other conditions keep their values"
            );
            let suspended = next.last().expect("Suspended is last");
            assert_eq!(
                (
                    suspended.r#type.as_str(),
                    suspended.status.as_str(),
                    suspended.reason.as_str()
                ),
                (SUSPENDED, "True", "Suspended")
            );
            assert_eq!(suspended.last_transition_time, at(since));
            assert_eq!(suspended.observed_generation, Some(2));
        }
        assert!(is_suspended(Some(true)));
        assert!(!is_suspended(Some(false)));
        assert!(!is_suspended(None));
    }

    #[test]
    fn a_request_is_stamped_and_echoed() {
        let annotations = BTreeMap::from([(REQUESTED_AT.to_owned(), "2026-11-23T10:00:00Z".to_owned())]);
        assert_eq!(requested_at(Some(&annotations)), Some("2026-11-23T10:00:00Z"));
        assert_eq!(requested_at(None), None);
        // (requested, last handled, echoed)
        for (requested, last, echoed) in [
            (Some("b"), Some("a"), Some("b")),
            (Some("a"), None, Some("a")),
            (None, Some("a"), Some("a")),
            (None, None, None),
        ] {
            assert_eq!(handled_request(requested, last).as_deref(), echoed);
        }
        let mut copy = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
        stamp_request(&mut copy, None);
        assert_eq!(copy, json!({"metadata": {"name": "c"}, "data": {"a": "1"}}));
        stamp_request(&mut copy, Some("now"));
        assert_eq!(copy["metadata"]["annotations"][REQUESTED_AT], "now");
        let mut annotated = json!({"metadata": {"annotations": {"x": "1"}}});
        stamp_request(&mut annotated, Some("again"));
        assert_eq!(
            annotated["metadata"]["annotations"],
            json!({"x": "1", REQUESTED_AT: "again"})
        );
    }

    #[test]
    fn policies_decide_what_goes_and_a_veto_always_retracts() {
        use CopyPolicy::{Delete, Orphan};
        assert_eq!(on_cr_deletion(None), Release::Delete);
        assert_eq!(on_cr_deletion(Some(Delete)), Release::Delete);
        assert_eq!(on_cr_deletion(Some(Orphan)), Release::Orphan);
        // (policy, reason, release)
        let table = [
            (None, Reason::SourceDeleted, Release::Delete),
            (Some(Orphan), Reason::SourceDeleted, Release::Orphan),
            (Some(Orphan), Reason::SourceNotFound, Release::Orphan),
            (Some(Delete), Reason::SourceDeleted, Release::Delete),
            (Some(Orphan), Reason::SourceOptedOut, Release::Delete),
            (Some(Orphan), Reason::SourceNotProjectable, Release::Delete),
        ];
        for (policy, reason, release) in table {
            assert_eq!(on_source_loss(policy, reason), release, "{policy:?} {reason}");
        }
    }
}
