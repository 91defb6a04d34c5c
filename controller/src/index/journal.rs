//! The journal of our own writes to copies, so the watch events they cause wake nothing: a write
//! is recognised by the resourceVersion it returned, a delete by being ours; events that arrive while
//! a write is on its way are held until it answers.

use super::ObjectKey;
use crate::cache::verified::digest;
use std::{collections::HashMap, num::NonZeroU64};

/// How many of our own recent writes per copy are remembered: a watch lagging behind a burst of
/// writes still recognises each of them.
const REMEMBERED_WRITES: usize = 4;

/// What we did to a copy. Copies and resourceVersions are held as 64-bit digests: the journal keeps
/// an entry per copy we ever wrote, and only equality is asked of them.
#[derive(Debug, Default)]
struct Mark {
    /// The digests of the resourceVersions our recent writes produced, newest last.
    ours: [Option<NonZeroU64>; REMEMBERED_WRITES],
    /// A write is on its way: events seen meanwhile that are not known to be ours (the digest of
    /// their resourceVersion, `None` for a delete) are held until it answers.
    in_flight: Option<Vec<Option<u64>>>,
    /// We deleted it.
    deleted: bool,
}

impl Mark {
    fn is_ours(&self, resource_version: u64) -> bool {
        self.ours.contains(&Some(slot(resource_version)))
    }

    fn remember(&mut self, resource_version: u64) {
        self.ours.rotate_left(1);
        self.ours[REMEMBERED_WRITES - 1] = Some(slot(resource_version));
    }

    /// Whether a watch event is one of ours (or held until our write answers).
    fn absorbs(&mut self, resource_version: Option<u64>, deleted: bool) -> bool {
        if deleted && self.deleted {
            return true;
        }
        if !deleted && resource_version.is_some_and(|rv| self.is_ours(rv)) {
            return true;
        }
        match &mut self.in_flight {
            Some(held) => {
                held.push(if deleted { None } else { resource_version });
                true
            }
            None => false,
        }
    }
}

/// A digest as held in [`Mark::ours`], where `None` is an empty slot (half the size of an
/// `Option<u64>`); the digest 0 shares its slot value with 1.
fn slot(digest: u64) -> NonZeroU64 {
    NonZeroU64::new(digest).unwrap_or(NonZeroU64::MIN)
}

/// Our recent writes, per copy (by the digest of its key).
#[derive(Debug, Default)]
pub struct Journal {
    marks: HashMap<u64, Mark>,
}

impl Journal {
    /// Records that we are about to write a copy.
    pub fn begin_write(&mut self, key: ObjectKey) {
        let mark = self.marks.entry(digest(&key)).or_default();
        mark.in_flight = Some(Vec::new());
        mark.deleted = false;
    }

    /// Records how our write of a copy ended (its resourceVersion, or `None` if it failed). Returns
    /// whether an event held meanwhile was someone else's (then the copy's owner must be woken).
    pub fn finish_write(&mut self, key: ObjectKey, resource_version: Option<String>) -> bool {
        let mark = self.marks.entry(digest(&key)).or_default();
        let held = mark.in_flight.take().unwrap_or_default();
        if let Some(rv) = resource_version {
            mark.remember(digest(&rv));
        }
        held.iter().any(|rv| rv.is_none_or(|rv| !mark.is_ours(rv)))
    }

    /// Records that we are deleting a copy, so its delete event wakes nothing.
    pub fn record_delete(&mut self, key: ObjectKey) {
        self.marks.insert(
            digest(&key),
            Mark {
                deleted: true,
                ..Mark::default()
            },
        );
    }

    /// Whether a watch event of a copy is ours (or held until our write answers). A copy we
    /// deleted is forgotten once its delete event is seen.
    pub fn absorbs(&mut self, key: &ObjectKey, resource_version: Option<&String>, deleted: bool) -> bool {
        let key = digest(key);
        let resource_version = resource_version.map(digest);
        let Some(mark) = self.marks.get_mut(&key) else {
            return false;
        };
        let ours = mark.absorbs(resource_version, deleted);
        if deleted && mark.deleted {
            self.marks.remove(&key);
        }
        ours
    }

    /// How many copies have an entry (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::api::source::GroupKind;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            group_kind: GroupKind {
                group: String::new(),
                kind: "ConfigMap".into(),
            },
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn rv(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn our_writes_are_recognised_and_strangers_are_not() {
        // (steps, then an event (resourceVersion, deleted), absorbed)
        let mut j = Journal::default();
        j.begin_write(key("a"));
        assert!(!j.finish_write(key("a"), rv("10")), "nothing held");
        assert!(j.absorbs(&key("a"), rv("10").as_ref(), false), "our write");
        assert!(
            !j.absorbs(&key("a"), rv("11").as_ref(), false),
            "someone else's edit"
        );
        assert!(!j.absorbs(&key("a"), None, true), "someone else's delete");
        assert!(
            !j.absorbs(&key("b"), rv("10").as_ref(), false),
            "a copy we never wrote"
        );
    }

    #[test]
    fn events_during_a_write_are_held_and_judged_when_it_answers() {
        // (events seen while the write is on its way, its resourceVersion, someone else's among them)
        for (held, answer, foreign) in [
            (vec![rv("10")], rv("10"), false),
            (vec![rv("9"), rv("10")], rv("10"), true),
            (vec![None], rv("10"), true),
            (vec![], None, false),
            (vec![rv("10")], None, true),
        ] {
            let mut j = Journal::default();
            j.begin_write(key("a"));
            for event in &held {
                assert!(j.absorbs(&key("a"), event.as_ref(), event.is_none()), "held");
            }
            assert_eq!(
                j.finish_write(key("a"), answer.clone()),
                foreign,
                "{held:?} {answer:?}"
            );
        }
    }

    #[test]
    fn only_the_last_writes_are_remembered() {
        let mut j = Journal::default();
        for v in 1..=6 {
            j.begin_write(key("a"));
            j.finish_write(key("a"), rv(&v.to_string()));
        }
        assert!(!j.absorbs(&key("a"), rv("2").as_ref(), false));
        assert!(j.absorbs(&key("a"), rv("3").as_ref(), false));
        assert!(j.absorbs(&key("a"), rv("6").as_ref(), false));
    }

    #[test]
    fn our_delete_wakes_nothing_and_is_then_forgotten() {
        let mut j = Journal::default();
        j.record_delete(key("a"));
        assert!(
            !j.absorbs(&key("a"), rv("5").as_ref(), false),
            "an update is not our delete"
        );
        assert!(j.absorbs(&key("a"), None, true));
        assert_eq!(j.len(), 0);
        assert!(
            !j.absorbs(&key("a"), None, true),
            "a later delete is someone else's"
        );
    }
}
