//! Lifecycle decisions (SPEC §10): suspension and its `Suspended` condition, reconciles requested
//! with `projection.sh/requested-at`, and what happens to copies when their CR or their source goes
//! (`deletionPolicy`, `sourceDeletionPolicy`), down to the patch that orphans a copy.

use crate::{
    api::crd::{Condition, CopyPolicy},
    api::keys::{REQUESTED_AT, SOURCE_CLUSTER, SOURCE_HASH},
    api::reason::Reason,
    copy::ownership::Owner,
    pass::status::{RECONCILING, is_progress, progress_condition},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Condition type: `spec.suspend` holds every write and deletion of copies.
pub const SUSPENDED: &str = "Suspended";

/// The `Suspended` condition's message.
pub const SUSPENDED_MESSAGE: &str = "spec.suspend is true: no copy is written or updated until it is set to false; \
     copies are still withdrawn when the source's owner vetoes or the author loses access";

/// Whether a source problem (`reason`) withdraws the copies of a suspended CR too. Suspension
/// stops updates, never a withdrawal that consent or access requires: the owner's veto (or a
/// consent taken back under the allowlist, or a kind the platform no longer allows) and an author
/// who may no longer read the source remove the copies whatever `suspend` says, or a suspension
/// would freeze a copy nobody could make any more. A source that is gone is not such a case:
/// holding copies through a source's deletion and re-creation is what suspension is for.
pub fn withdraws_while_suspended(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::SourceOptedOut | Reason::SourceNotProjectable | Reason::SourceForbidden
    )
}

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
    // Nothing is worked on while suspended: `Reconciling` goes; `Stalled` stays true (the last
    // pass's verdict still holds).
    let mut conditions: Vec<Condition> = current
        .iter()
        .filter(|c| c.r#type != SUSPENDED && c.r#type != RECONCILING)
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

/// The conditions of a CR whose deletion is blocked: `Ready=False` with `DeletionBlocked` and
/// `message` (its transition time kept while it stays False), the others as the last pass left them.
pub fn deletion_blocked_conditions(
    current: &[Condition],
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let since = current
        .iter()
        .find(|c| c.r#type == crate::pass::status::READY && c.status == "False")
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let ready = Condition {
        r#type: crate::pass::status::READY.to_owned(),
        status: "False".to_owned(),
        reason: Reason::DeletionBlocked.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    };
    let progress = progress_condition(current, Reason::DeletionBlocked, message, generation, now);
    let mut conditions: Vec<Condition> = current
        .iter()
        .filter(|c| !is_progress(c))
        .map(|c| {
            if c.r#type == ready.r#type {
                ready.clone()
            } else {
                c.clone()
            }
        })
        .collect();
    if !conditions.iter().any(|c| c.r#type == ready.r#type) {
        conditions.push(ready);
    }
    conditions.extend(progress);
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
        &[owner.annotation_key(), SOURCE_HASH, REQUESTED_AT, SOURCE_CLUSTER],
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

/// What to do after a delete of a copy was refused because the copy changed since it was read
/// (409 on the resourceVersion precondition), `reads` fresh reads into the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDeleteConflict {
    /// Read the copy again and decide anew (is it still ours?).
    ReadAgain,
    /// Someone keeps writing the copy: give up for this pass, so the failure backs off instead of
    /// holding a reconcile slot in a GET/DELETE loop.
    GiveUp,
}

/// A copy that changed meanwhile is read again once; a second conflict ends the attempt.
pub fn after_delete_conflict(reads: u32) -> AfterDeleteConflict {
    if reads == 0 {
        AfterDeleteConflict::ReadAgain
    } else {
        AfterDeleteConflict::GiveUp
    }
}

/// The finalizer of a CR blocks its deletion while copies cannot be removed: how a person learns
/// why, and how to release it. `cr` is how kubectl names it (`projection <name> -n <namespace>` or
/// `clusterprojection <name>`), `finalizers` the CR's current finalizers, `finalizer` ours, `cause`
/// what the removal of copies ran into (the apiserver's message).
pub fn deletion_blocked_message(cr: &str, finalizers: &[String], finalizer: &str, cause: &str) -> String {
    // Removing by index with a test of the value first: the patch fails instead of removing another
    // controller's finalizer if the list changed meanwhile.
    let index = finalizers.iter().position(|f| f == finalizer).unwrap_or(0);
    let patch = format!(
        r#"[{{"op":"test","path":"/metadata/finalizers/{index}","value":"{finalizer}"}},{{"op":"remove","path":"/metadata/finalizers/{index}"}}]"#
    );
    format!(
        "deletion is blocked: the copies could not be removed: {cause}. The finalizer {finalizer} \
         holds this object until they are; retried with backoff. To release it, remove the cause \
         (access refused: give the controller back access to that kind, Helm value supportedKinds) \
         and deletion completes on the next retry; or, accepting that the copies stay behind \
         unmanaged, remove the finalizer by hand: kubectl patch {cr} --type=json -p '{patch}'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn suspension_holds_a_lost_source_but_never_a_veto_or_a_lost_grant() {
        for reason in [
            Reason::SourceOptedOut,
            Reason::SourceNotProjectable,
            Reason::SourceForbidden,
        ] {
            assert!(withdraws_while_suspended(reason), "{reason}");
        }
        for reason in [
            Reason::SourceDeleted,
            Reason::SourceNotFound,
            Reason::SourceFetchFailed,
            Reason::SourceResolutionFailed,
        ] {
            assert!(!withdraws_while_suspended(reason), "{reason}");
        }
    }

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
            (
                vec![
                    condition("Ready", "False", "SourceNotFound", 5),
                    condition(RECONCILING, "True", "SourceNotFound", 5),
                ],
                40,
                40,
            ),
            (
                vec![
                    condition("Ready", "False", "DestinationConflict", 5),
                    condition("Stalled", "True", "DestinationConflict", 5),
                ],
                50,
                50,
            ),
        ];
        for (current, now, since) in table {
            let next = suspended_conditions(&current, Some(2), &at(now));
            let kept: Vec<&Condition> = next.iter().filter(|c| c.r#type != SUSPENDED).collect();
            assert_eq!(
                kept,
                current
                    .iter()
                    .filter(|c| c.r#type != SUSPENDED && c.r#type != RECONCILING)
                    .collect::<Vec<_>>(),
                "the other conditions keep their values, but nothing is worked on"
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

    #[test]
    fn a_delete_conflict_reads_again_once() {
        assert_eq!(after_delete_conflict(0), AfterDeleteConflict::ReadAgain);
        for reads in [1, 2, 10] {
            assert_eq!(
                after_delete_conflict(reads),
                AfterDeleteConflict::GiveUp,
                "{reads}"
            );
        }
    }

    #[test]
    fn a_blocked_deletion_names_its_cause_and_the_exact_command() {
        let cause =
            r#"secrets "tls" is forbidden: User "system:serviceaccount:p:c" cannot get resource "secrets""#;
        let finalizers = vec![
            "example.com/other".to_owned(),
            "projection.sh/finalizer".to_owned(),
        ];
        let m = deletion_blocked_message(
            "projection tls -n team-a",
            &finalizers,
            "projection.sh/finalizer",
            cause,
        );
        for part in [
            "deletion is blocked: the copies could not be removed: secrets \"tls\" is forbidden",
            "retried with backoff. To release it, remove the cause (access refused: give the \
             controller back access to that kind, Helm value supportedKinds) and deletion completes",
            "remove the finalizer by hand: kubectl patch projection tls -n team-a --type=json -p ",
            r#"'[{"op":"test","path":"/metadata/finalizers/1","value":"projection.sh/finalizer"},{"op":"remove","path":"/metadata/finalizers/1"}]'"#,
        ] {
            assert!(m.contains(part), "{part:?} not in {m:?}");
        }
        let cluster = deletion_blocked_message(
            "clusterprojection shared",
            &["projection.sh/cluster-finalizer".to_owned()],
            "projection.sh/cluster-finalizer",
            "denied",
        );
        assert!(
            cluster.contains(r#"kubectl patch clusterprojection shared --type=json -p '[{"op":"test","path":"/metadata/finalizers/0","value":"projection.sh/cluster-finalizer"}"#),
            "{cluster}"
        );
    }

    #[test]
    fn a_blocked_deletion_turns_ready_false_and_keeps_the_rest() {
        let resolved = condition("SourceResolved", "True", "Resolved", 3);
        let ready = condition("Ready", "True", "Projected", 5);
        // (current conditions, now, Ready's expected transition time)
        let table = [
            (vec![resolved.clone(), ready.clone()], 10, 10),
            (
                vec![
                    resolved.clone(),
                    condition("Ready", "False", "DeletionBlocked", 8),
                ],
                20,
                8,
            ),
            (vec![], 30, 30),
            (
                vec![
                    resolved.clone(),
                    condition("Ready", "False", "DestinationConflict", 6),
                    condition("Stalled", "True", "DestinationConflict", 6),
                ],
                40,
                6,
            ),
        ];
        for (current, now, since) in table {
            let next = deletion_blocked_conditions(&current, "blocked: x", Some(4), &at(now));
            let ready = next.iter().find(|c| c.r#type == "Ready").expect("Ready");
            assert_eq!(
                (
                    ready.status.as_str(),
                    ready.reason.as_str(),
                    ready.message.as_str()
                ),
                ("False", "DeletionBlocked", "blocked: x")
            );
            assert_eq!(ready.last_transition_time, at(since));
            assert_eq!(ready.observed_generation, Some(4));
            let reconciling = next.last().expect("Reconciling is last");
            assert_eq!(
                (reconciling.r#type.as_str(), reconciling.reason.as_str()),
                (RECONCILING, "DeletionBlocked")
            );
            assert!(
                !next.iter().any(|c| c.r#type == "Stalled"),
                "retried, not stalled"
            );
            let others: Vec<&Condition> = next
                .iter()
                .filter(|c| c.r#type != "Ready" && !is_progress(c))
                .collect();
            let before: Vec<&Condition> = current
                .iter()
                .filter(|c| c.r#type != "Ready" && !is_progress(c))
                .collect();
            assert_eq!(others, before, "the other conditions keep their values");
        }
    }
}
