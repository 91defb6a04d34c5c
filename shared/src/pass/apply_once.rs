//! `syncPolicy: ApplyOnce` (SPEC §10): each copy is created once per target namespace and then
//! left as it is: never updated, repaired or re-created (a copy deleted by hand stays deleted).
//! Where a copy was created is recorded in the status, front-coded so that the record stays small
//! at thousands of namespaces; a namespace that stops being a target leaves the record (coming back,
//! it is a new target and gets its copy once). Switching back to `Reconcile` drops the record and the
//! next pass takes every copy over again.

use crate::{
    api::crd::{AppliedOnce, SyncPolicy, WrittenDestination},
    pass::status::Outcome,
    pass::tally::name_first,
};
use std::collections::BTreeSet;

/// Whether copies are created once and then left alone.
pub fn is_apply_once(policy: Option<SyncPolicy>) -> bool {
    policy == Some(SyncPolicy::ApplyOnce)
}

/// The longest shared prefix an entry can name: one capital letter, `A` for 0 to `Z` for 25.
const MAX_SHARED: usize = 25;

/// Front-codes sorted namespace names: each entry is one capital letter giving the length of the
/// prefix it shares with the previous name (`A` = 0 ... `Z` = 25, longer prefixes counted as 25),
/// then the rest of the name. Namespace names are lowercase DNS labels, so the capital letter also
/// marks where an entry starts: no separator is needed.
pub fn encode(namespaces: &BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut previous = "";
    for name in namespaces {
        let shared = previous
            .bytes()
            .zip(name.bytes())
            .take_while(|(a, b)| a == b)
            .count()
            .min(MAX_SHARED);
        out.push(char::from(b'A' + shared as u8));
        out.push_str(&name[shared..]);
        previous = name;
    }
    out
}

/// Reads [`encode`]'s form back; a malformed entry ends the record there (the status is only
/// written by the controller, so this only guards against a hand-edited status).
pub fn decode(encoded: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut previous = String::new();
    let mut rest = encoded;
    while let Some(marker) = rest.chars().next() {
        if !marker.is_ascii_uppercase() {
            break;
        }
        let shared = usize::from(marker as u8 - b'A');
        let body = &rest[1..];
        let end = body.find(|c: char| c.is_ascii_uppercase()).unwrap_or(body.len());
        let Some(prefix) = previous.get(..shared) else {
            break;
        };
        let name = format!("{prefix}{}", &body[..end]);
        names.insert(name.clone());
        previous = name;
        rest = &body[end..];
    }
    names
}

/// The namespaces recorded for the copies `copies` (an empty set when the record is for other
/// copies: a renamed destination or another kind starts afresh).
pub fn recorded(record: Option<&AppliedOnce>, copies: &WrittenDestination) -> BTreeSet<String> {
    record
        .filter(|r| r.group == copies.group && r.kind == copies.kind && r.name == copies.name)
        .map(|r| decode(&r.namespaces))
        .unwrap_or_default()
}

/// The status record of `namespaces` for the copies `copies`.
pub fn record(copies: &WrittenDestination, namespaces: &BTreeSet<String>) -> AppliedOnce {
    AppliedOnce {
        group: copies.group.clone(),
        kind: copies.kind.clone(),
        name: copies.name.clone(),
        count: i32::try_from(namespaces.len()).unwrap_or(i32::MAX),
        namespaces: encode(namespaces),
    }
}

/// What an ApplyOnce pass does with each target namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OncePlan {
    /// Not created yet: create the copy (an existing copy of ours is only recorded, never updated).
    pub create: Vec<String>,
    /// Created once and still there: left as it is.
    pub kept: Vec<String>,
    /// Created once and deleted since: not created again.
    pub left_deleted: Vec<String>,
}

/// Sorts the `targets` of a pass by the `record` and the copies that `exist` now.
pub fn plan(targets: &[String], record: &BTreeSet<String>, exist: &BTreeSet<String>) -> OncePlan {
    let mut plan = OncePlan::default();
    for namespace in targets {
        let list = match (record.contains(namespace), exist.contains(namespace)) {
            (false, _) => &mut plan.create,
            (true, true) => &mut plan.kept,
            (true, false) => &mut plan.left_deleted,
        };
        list.push(namespace.clone());
    }
    plan
}

/// The record after a pass: what it held for namespaces that are still targets, and the
/// namespaces where a copy was just `placed` (created, adopted, or found in place).
pub fn next_record<'a>(
    record: &'a BTreeSet<String>,
    targets: &[String],
    placed: impl IntoIterator<Item = &'a String>,
) -> BTreeSet<String> {
    let targets: BTreeSet<&String> = targets.iter().collect();
    record
        .iter()
        .filter(|n| targets.contains(n))
        .chain(placed)
        .cloned()
        .collect()
}

/// What `DestinationWritten` adds under ApplyOnce: that copies are not updated, and which ones
/// were deleted and stay deleted.
pub fn note(plan: &OncePlan) -> String {
    let mut note = "syncPolicy ApplyOnce: copies are created once and not updated".to_owned();
    if !plan.left_deleted.is_empty() {
        note.push_str(&format!(
            "; deleted since, not created again: {}",
            name_first(plan.left_deleted.clone())
        ));
    }
    note
}

/// A successful pass's outcome with [`note`] added to its `DestinationWritten` message; any other
/// outcome as it is.
pub fn with_note(outcome: Outcome, plan: &OncePlan) -> Outcome {
    match outcome {
        Outcome::Projected {
            resolved,
            note: before,
        } => {
            let note = if before.is_empty() {
                note(plan)
            } else {
                format!("{before}; {}", note(plan))
            };
            Outcome::Projected { resolved, note }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn the_record_round_trips_and_shares_prefixes() {
        let namespaces = set(&["team-a", "team-ab", "team-b", "other", "a"]);
        let encoded = encode(&namespaces);
        assert_eq!(encoded, "AaAotherAteam-aGbFb");
        assert_eq!(decode(&encoded), namespaces);
        assert_eq!(encode(&BTreeSet::new()), "");
        assert!(decode("").is_empty());
        // Prefixes longer than 25 are counted as 25.
        let long = set(&["a-very-long-namespace-name-1", "a-very-long-namespace-name-2"]);
        assert_eq!(decode(&encode(&long)), long);
        // A damaged record keeps what it could read.
        assert_eq!(decode("AaJb"), set(&["a"]));
        assert_eq!(decode("Aa1b"), set(&["a1b"]));
        assert_eq!(decode("aAb"), BTreeSet::new());
    }

    #[test]
    fn ten_thousand_namespaces_stay_small() {
        // Realistic names: a tenant prefix and a number, and random-looking suffixes.
        let numbered: BTreeSet<String> = (0..10_000).map(|i| format!("tenant-{i:05}")).collect();
        let hashed: BTreeSet<String> = (0..10_000u64)
            .map(|i| format!("team-{:08x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32))
            .collect();
        for (namespaces, max_bytes) in [(numbered, 30_000), (hashed, 80_000)] {
            let plain: usize = namespaces.iter().map(|n| n.len() + 1).sum();
            let encoded = encode(&namespaces);
            println!(
                "{} namespaces: {plain} bytes listed, {} front-coded",
                namespaces.len(),
                encoded.len()
            );
            assert!(encoded.len() <= max_bytes, "{} bytes", encoded.len());
            assert!(encoded.len() < plain, "{} < {plain}", encoded.len());
            assert_eq!(decode(&encoded), namespaces);
        }
    }

    #[test]
    fn a_record_is_for_one_set_of_copies() {
        let copies = WrittenDestination {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "cfg".into(),
            cluster: None,
            cluster_identity: None,
        };
        let stored = record(&copies, &set(&["a", "b"]));
        assert_eq!(stored.count, 2);
        assert_eq!(recorded(Some(&stored), &copies), set(&["a", "b"]));
        let renamed = WrittenDestination {
            name: "other".into(),
            ..copies.clone()
        };
        assert!(recorded(Some(&stored), &renamed).is_empty());
        assert!(recorded(None, &copies).is_empty());
    }

    #[test]
    fn each_target_is_created_once_and_a_deleted_copy_stays_deleted() {
        // (targets, record, existing copies, create, kept, left deleted)
        type Row<'a> = (
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
        );
        let table: [Row<'_>; 4] = [
            (&["a", "b"], &[], &[], &["a", "b"], &[], &[]),
            (&["a", "b"], &["a", "b"], &["a", "b"], &[], &["a", "b"], &[]),
            (&["a", "b", "c"], &["a", "b"], &["a"], &["c"], &["a"], &["b"]),
            // Copies left by a Reconcile spec: recorded when found, never updated.
            (&["a"], &[], &["a"], &["a"], &[], &[]),
        ];
        for (targets, record, exist, create, kept, left) in table {
            let got = plan(&names(targets), &set(record), &set(exist));
            assert_eq!(got.create, names(create), "{targets:?} {record:?} {exist:?}");
            assert_eq!(got.kept, names(kept));
            assert_eq!(got.left_deleted, names(left));
        }
        assert!(is_apply_once(Some(SyncPolicy::ApplyOnce)));
        assert!(!is_apply_once(Some(SyncPolicy::Reconcile)));
        assert!(!is_apply_once(None));
    }

    #[test]
    fn the_record_follows_the_targets() {
        let record = set(&["a", "b", "gone"]);
        let next = next_record(&record, &names(&["a", "b", "c"]), &names(&["c"]));
        assert_eq!(
            next,
            set(&["a", "b", "c"]),
            "a namespace no longer targeted leaves the record"
        );
        let plan = OncePlan {
            left_deleted: names(&["b"]),
            ..OncePlan::default()
        };
        assert_eq!(
            note(&plan),
            "syncPolicy ApplyOnce: copies are created once and not updated; deleted since, not created again: b"
        );
        assert_eq!(
            note(&OncePlan::default()),
            "syncPolicy ApplyOnce: copies are created once and not updated"
        );
        let projected = Outcome::Projected {
            resolved: "r".into(),
            note: "2 namespaces".into(),
        };
        assert_eq!(
            with_note(projected, &plan),
            Outcome::Projected {
                resolved: "r".into(),
                note: "2 namespaces; syncPolicy ApplyOnce: copies are created once and not updated; \
                       deleted since, not created again: b"
                    .into()
            }
        );
        let failed = Outcome::SourceFailed {
            reason: crate::api::reason::Reason::SourceDeleted,
            message: "m".into(),
        };
        assert_eq!(with_note(failed.clone(), &plan), failed);
    }
}
