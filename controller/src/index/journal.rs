//! The journal of our own writes to copies, so the watch events they cause wake nothing: a write
//! is recognised by the resourceVersion it returned, a delete by being ours; events that arrive while
//! a write is on its way are held until it answers.

use super::ObjectKey;
use std::collections::{HashMap, VecDeque};

/// How many of our own recent writes per copy are remembered: a watch lagging behind a burst of
/// writes still recognises each of them.
const REMEMBERED_WRITES: usize = 4;

/// What we did to a copy.
#[derive(Debug, Default)]
struct Mark {
    /// The resourceVersions our recent writes produced, newest last.
    ours: VecDeque<String>,
    /// A write is on its way: events seen meanwhile that are not known to be ours (their
    /// resourceVersion, `None` for a delete) are held until it answers.
    in_flight: Option<Vec<Option<String>>>,
    /// We deleted it.
    deleted: bool,
}

impl Mark {
    /// Whether a watch event is one of ours (or held until our write answers).
    fn absorbs(&mut self, resource_version: Option<&String>, deleted: bool) -> bool {
        if deleted && self.deleted {
            return true;
        }
        if !deleted && resource_version.is_some_and(|rv| self.ours.contains(rv)) {
            return true;
        }
        match &mut self.in_flight {
            Some(held) => {
                held.push(if deleted { None } else { resource_version.cloned() });
                true
            }
            None => false,
        }
    }
}

/// Our recent writes, per copy.
#[derive(Debug, Default)]
pub struct Journal {
    marks: HashMap<ObjectKey, Mark>,
}

impl Journal {
    /// Records that we are about to write a copy.
    pub fn begin_write(&mut self, key: ObjectKey) {
        let mark = self.marks.entry(key).or_default();
        mark.in_flight = Some(Vec::new());
        mark.deleted = false;
    }

    /// Records how our write of a copy ended (its resourceVersion, or `None` if it failed). Returns
    /// whether an event held meanwhile was someone else's (then the copy's owner must be woken).
    pub fn finish_write(&mut self, key: ObjectKey, resource_version: Option<String>) -> bool {
        let mark = self.marks.entry(key).or_default();
        let held = mark.in_flight.take().unwrap_or_default();
        if let Some(rv) = resource_version {
            mark.ours.push_back(rv);
            if mark.ours.len() > REMEMBERED_WRITES {
                mark.ours.pop_front();
            }
        }
        held.iter()
            .any(|rv| rv.as_ref().is_none_or(|rv| !mark.ours.contains(rv)))
    }

    /// Records that we are deleting a copy, so its delete event wakes nothing.
    pub fn record_delete(&mut self, key: ObjectKey) {
        self.marks.insert(
            key,
            Mark {
                deleted: true,
                ..Mark::default()
            },
        );
    }

    /// Whether a watch event of a copy is ours (or held until our write answers). A copy we
    /// deleted is forgotten once its delete event is seen.
    pub fn absorbs(&mut self, key: &ObjectKey, resource_version: Option<&String>, deleted: bool) -> bool {
        let ours = self
            .marks
            .get_mut(key)
            .is_some_and(|mark| mark.absorbs(resource_version, deleted));
        if deleted && self.marks.get(key).is_some_and(|mark| mark.deleted) {
            self.marks.remove(key);
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
    use shared::source::GroupKind;

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
