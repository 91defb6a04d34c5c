//! Which changes of a CR call for a reconcile: its spec (generation), its deletion, our finalizer
//! and a new `projection.sh/requested-at`. Status writes, including our own, do not.
//!
//! The controller remembers, per CR, a fingerprint of those fields as last seen, and lets a change
//! through only when it differs. It keeps two 64-bit digests and a time per CR (kube's predicate
//! filter keeps the name, namespace and uid as strings besides): the filter holds an entry for
//! every CR.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use shared::pass::lifecycle::requested_at;
use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    time::{Duration, Instant},
};

/// How long an entry not seen is kept: a CR deleted since is forgotten after this long, and a CR
/// unchanged for this long passes its next change whatever it is (one reconcile that finds nothing
/// to do).
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The fingerprint of what a reconcile depends on in a CR's metadata.
pub fn fingerprint(meta: &ObjectMeta, finalizer: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    requested_at(meta.annotations.as_ref()).hash(&mut hasher);
    meta.finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer)
        .hash(&mut hasher);
    hasher.finish()
}

/// The fingerprints last seen, by the digest of each CR's namespace, name and uid (a CR deleted and
/// created again under the same name is a new CR).
#[derive(Debug, Default)]
pub struct RelevantChanges {
    seen: HashMap<u64, (u64, Instant)>,
    last_sweep: Option<Instant>,
}

impl RelevantChanges {
    /// Whether this state of a CR (its metadata, seen at `now`) calls for a reconcile.
    pub fn is_relevant(&mut self, meta: &ObjectMeta, finalizer: &str, now: Instant) -> bool {
        if self
            .last_sweep
            .is_none_or(|last| now.duration_since(last) >= FORGET_AFTER)
        {
            self.seen
                .retain(|_, (_, seen)| now.duration_since(*seen) < FORGET_AFTER);
            self.last_sweep = Some(now);
        }
        let key = crate::cache::verified::digest(&(&meta.namespace, &meta.name, &meta.uid));
        let fingerprint = fingerprint(meta, finalizer);
        let before = self.seen.insert(key, (fingerprint, now));
        before.is_none_or(|(was, seen)| was != fingerprint || now.duration_since(seen) >= FORGET_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FINALIZER: &str = "projection.sh/finalizer";

    fn meta(uid: &str, generation: i64, finalizers: &[&str], requested: Option<&str>) -> ObjectMeta {
        let annotations = requested.map(|at| json!({"projection.sh/requested-at": at}));
        serde_json::from_value(json!({
            "name": "p", "namespace": "n", "uid": uid, "generation": generation,
            "finalizers": finalizers, "annotations": annotations,
        }))
        .expect("metadata")
    }

    #[test]
    fn only_what_a_reconcile_depends_on_passes() {
        let now = Instant::now();
        let mut changes = RelevantChanges::default();
        assert!(
            changes.is_relevant(&meta("u1", 1, &[], None), FINALIZER, now),
            "first sight"
        );
        assert!(
            !changes.is_relevant(&meta("u1", 1, &[], None), FINALIZER, now),
            "a status write"
        );
        assert!(
            changes.is_relevant(&meta("u1", 1, &[FINALIZER], None), FINALIZER, now),
            "our finalizer"
        );
        assert!(
            !changes.is_relevant(&meta("u1", 1, &[FINALIZER, "other"], None), FINALIZER, now),
            "another finalizer"
        );
        assert!(
            changes.is_relevant(&meta("u1", 2, &[FINALIZER], None), FINALIZER, now),
            "a spec change"
        );
        assert!(
            changes.is_relevant(&meta("u1", 2, &[FINALIZER], Some("t1")), FINALIZER, now),
            "a reconcile request"
        );
        assert!(
            changes.is_relevant(&meta("u2", 2, &[FINALIZER], Some("t1")), FINALIZER, now),
            "the same name with another uid is another CR"
        );
        let mut deleting = meta("u2", 2, &[FINALIZER], Some("t1"));
        deleting.deletion_timestamp = serde_json::from_value(json!("2026-11-24T00:00:00Z")).ok();
        assert!(changes.is_relevant(&deleting, FINALIZER, now), "a deletion");
    }

    #[test]
    fn entries_not_seen_for_an_hour_are_forgotten() {
        let start = Instant::now();
        let mut changes = RelevantChanges::default();
        let cr = meta("u1", 1, &[], None);
        assert!(changes.is_relevant(&cr, FINALIZER, start));
        assert!(!changes.is_relevant(&cr, FINALIZER, start + Duration::from_secs(60)));
        let gone = meta("u9", 1, &[], None);
        changes.is_relevant(&gone, FINALIZER, start);
        let later = start + Duration::from_secs(60) + FORGET_AFTER;
        assert!(
            changes.is_relevant(&cr, FINALIZER, later),
            "unseen for an hour: passes once"
        );
        assert!(!changes.is_relevant(&cr, FINALIZER, later));
        assert_eq!(changes.seen.len(), 1, "the CR not seen since is forgotten");
    }
}
