//! What the per-namespace writes of a pass add up to (a tally), how per-namespace failures roll up
//! into one condition and the status's bounded list, and how events name many copies. Pure; the
//! plan (`pass::plan`) reads them to conclude a pass.

use crate::{api::crd::NamespaceFailure, api::reason::Reason, pass::targets::Targets};

/// How many copies an event note names before summarising the rest.
pub const NAMED_IN_EVENTS: usize = 10;
/// How many failed namespaces the status lists (the count is always complete).
pub const MAX_LISTED_FAILURES: usize = 20;
/// How many failed namespaces a condition message names.
const MAX_NAMED_FAILURES: usize = 5;

/// What writing one namespace's copy did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyWrite {
    /// Created.
    Created,
    /// Patched.
    Updated,
    /// Deleted and created again because an update was refused (the apiserver's message).
    Recreated(String),
    /// Already up to date.
    Unchanged,
    /// An existing object whose owner consented (`projection.sh/adopt-by`) became the copy.
    Adopted,
    /// Not written.
    Failed {
        /// Why, e.g. `DestinationConflict`.
        reason: Reason,
        /// For a person.
        message: String,
    },
}

/// A namespace whose copy could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyFailure {
    /// The target namespace.
    pub namespace: String,
    /// Why.
    pub reason: Reason,
    /// For a person.
    pub message: String,
}

impl CopyFailure {
    /// As `status.failedNamespaces` lists it.
    pub fn to_status(&self) -> NamespaceFailure {
        NamespaceFailure {
            namespace: self.namespace.clone(),
            reason: self.reason.as_str().to_owned(),
            message: self.message.clone(),
        }
    }
}

/// The per-namespace results of a pass, sorted by what they mean. Every list is sorted by namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Namespaces where the copy was created.
    pub created: Vec<String>,
    /// Namespaces where the copy was patched or recreated.
    pub updated: Vec<String>,
    /// Namespaces where the copy was recreated, with the apiserver's refusal of the update.
    pub recreated: Vec<(String, String)>,
    /// Namespaces not written.
    pub failures: Vec<CopyFailure>,
    /// Namespaces where an existing object was adopted as the copy.
    pub adopted: Vec<String>,
}

impl Tally {
    /// Sorts the results of one pass.
    pub fn of(results: impl IntoIterator<Item = (String, CopyWrite)>) -> Self {
        let mut tally = Self::default();
        for (namespace, result) in results {
            match result {
                CopyWrite::Created => tally.created.push(namespace),
                CopyWrite::Updated => tally.updated.push(namespace),
                CopyWrite::Recreated(why) => {
                    tally.updated.push(namespace.clone());
                    tally.recreated.push((namespace, why));
                }
                CopyWrite::Unchanged => {}
                CopyWrite::Adopted => tally.adopted.push(namespace),
                CopyWrite::Failed { reason, message } => tally.failures.push(CopyFailure {
                    namespace,
                    reason,
                    message,
                }),
            }
        }
        tally.created.sort();
        tally.updated.sort();
        tally.recreated.sort();
        tally.adopted.sort();
        tally.failures.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        tally
    }

    /// Namespaces where something the CR does not own holds the copy's coordinates: the pass is
    /// woken when it goes.
    pub fn conflicts(&self) -> impl Iterator<Item = &str> {
        self.failures
            .iter()
            .filter(|f| f.reason == Reason::DestinationConflict)
            .map(|f| f.namespace.as_str())
    }

    /// Whether this pass wrote the CR's first copy ever (`ever_projected`: a status recorded one).
    pub fn first_copy(&self, ever_projected: bool) -> bool {
        !ever_projected && !self.created.is_empty()
    }
}

/// `DestinationWritten`'s message on success: how many namespaces, what was not written, and why.
pub fn note_for(targets: &Targets) -> String {
    let mut parts = vec![format!("{} namespaces", targets.write.len())];
    if !targets.pending.is_empty() {
        parts.push(format!("pending until created: {}", targets.pending.join(", ")));
    }
    if !targets.terminating.is_empty() {
        parts.push(format!(
            "skipped while terminating: {}",
            targets.terminating.join(", ")
        ));
    }
    if let Some(found) = &targets.skipped_source {
        parts.push(format!("skipped {}: {found}", found.namespace));
    }
    parts.join("; ")
}

/// The rollup of per-namespace failures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureSummary {
    /// The reason shared by every failure, `DestinationWriteFailed` when they differ.
    pub reason: Reason,
    /// Names the first namespaces with their reasons.
    pub message: String,
    /// The first failures, sorted by namespace, for `status.failedNamespaces`.
    pub listed: Vec<NamespaceFailure>,
}

/// Rolls up per-namespace failures; `None` when there are none.
pub fn summarize_failures(failures: &[CopyFailure]) -> Option<FailureSummary> {
    let first = failures.first()?;
    let mut sorted = failures.to_vec();
    sorted.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    let reason = if failures.iter().all(|f| f.reason == first.reason) {
        first.reason
    } else {
        Reason::DestinationWriteFailed
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
    let listed = sorted
        .iter()
        .take(MAX_LISTED_FAILURES)
        .map(CopyFailure::to_status)
        .collect();
    Some(FailureSummary {
        reason,
        message,
        listed,
    })
}

/// One event to publish about the CR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventNote {
    /// Its reason (which gives its type and action).
    pub reason: Reason,
    /// Its note.
    pub note: String,
}

/// `a, b, ... and N more`: the first [`NAMED_IN_EVENTS`] of `items`, sorted.
pub fn name_first(mut items: Vec<String>) -> String {
    items.sort();
    let more = items.len().saturating_sub(NAMED_IN_EVENTS);
    items.truncate(NAMED_IN_EVENTS);
    if more > 0 {
        format!("{} and {more} more", items.join(", "))
    } else {
        items.join(", ")
    }
}

/// What removing one copy found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Removed {
    /// It was ours and is gone.
    Deleted,
    /// Nothing was there.
    Absent,
    /// Something is there that is not (or no longer) ours: left alone.
    LeftAlone,
    /// It was ours and stays, without our ownership keys (an `Orphan` policy).
    Orphaned,
}

/// What releasing copies did: the events to publish, and what kept any copy in our hands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// One naming the copies deleted, one naming those orphaned, one per copy left alone because its
    /// ownership annotation was removed or changed.
    pub events: Vec<EventNote>,
    /// Per copy that could not be released, what kept it (`<Kind> <namespace>/<name>: <error>`).
    pub left: Vec<String>,
}

impl Removal {
    /// Whether every copy is out of our hands.
    pub fn all_gone(&self) -> bool {
        self.left.is_empty()
    }

    /// This removal and `other`, as one.
    pub fn and(mut self, other: Removal) -> Self {
        self.events.extend(other.events);
        self.left.extend(other.left);
        self
    }

    /// What kept the first copy, and how many more were kept, for a person (empty when every one
    /// is gone).
    pub fn cause(&self) -> String {
        match self.left.as_slice() {
            [] => String::new(),
            [only] => only.clone(),
            [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
        }
    }
}

/// The events of removals: one naming the copies deleted, one naming those orphaned, one per copy
/// left alone because its ownership annotation was removed or changed. `results` are by
/// `<namespace>/<name>`.
pub fn removal_events(results: &[(String, Removed)]) -> Vec<EventNote> {
    let with = |wanted: Removed| -> Vec<String> {
        results
            .iter()
            .filter(|(_, r)| *r == wanted)
            .map(|(copy, _)| copy.clone())
            .collect()
    };
    let mut events: Vec<EventNote> = with(Removed::LeftAlone)
        .into_iter()
        .map(|copy| EventNote {
            reason: Reason::DestinationLeftAlone,
            note: format!("{copy} (not owned)"),
        })
        .collect();
    let deleted = with(Removed::Deleted);
    if !deleted.is_empty() {
        events.push(EventNote {
            reason: Reason::DestinationDeleted,
            note: name_first(deleted),
        });
    }
    let orphaned = with(Removed::Orphaned);
    if !orphaned.is_empty() {
        events.push(EventNote {
            reason: Reason::DestinationOrphaned,
            note: format!("{} left in place, no longer managed", name_first(orphaned)),
        });
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::self_copy::SelfCopy;

    fn failed(reason: Reason) -> CopyWrite {
        CopyWrite::Failed {
            reason,
            message: "m".into(),
        }
    }

    fn failure(ns: &str, reason: Reason) -> CopyFailure {
        CopyFailure {
            namespace: ns.into(),
            reason,
            message: "m".into(),
        }
    }

    fn targets(write: &[&str]) -> Targets {
        Targets {
            write: write.iter().map(|s| (*s).to_owned()).collect(),
            ..Targets::default()
        }
    }

    #[test]
    fn results_sort_into_created_updated_and_failed() {
        let tally = Tally::of([
            ("c".to_owned(), CopyWrite::Created),
            ("a".to_owned(), CopyWrite::Created),
            ("b".to_owned(), CopyWrite::Updated),
            ("d".to_owned(), CopyWrite::Recreated("immutable".into())),
            ("e".to_owned(), CopyWrite::Unchanged),
            ("g".to_owned(), failed(Reason::DestinationCreateFailed)),
            ("f".to_owned(), failed(Reason::DestinationConflict)),
        ]);
        assert_eq!(tally.created, ["a", "c"]);
        assert_eq!(tally.updated, ["b", "d"]);
        assert_eq!(tally.recreated, [("d".to_owned(), "immutable".to_owned())]);
        assert_eq!(
            tally.failures,
            [
                failure("f", Reason::DestinationConflict),
                failure("g", Reason::DestinationCreateFailed)
            ]
        );
        assert_eq!(tally.conflicts().collect::<Vec<_>>(), ["f"]);
        assert!(tally.first_copy(false));
        assert!(!tally.first_copy(true));
        assert!(!Tally::default().first_copy(false));
    }

    #[test]
    fn the_success_note_says_what_was_not_written() {
        let full = Targets {
            write: vec!["a".into(), "b".into()],
            pending: vec!["later".into()],
            terminating: vec!["held".into()],
            skipped_source: Some(SelfCopy {
                kind: "ConfigMap".into(),
                namespace: "src".into(),
                name: "cfg".into(),
            }),
        };
        assert_eq!(
            note_for(&full),
            "2 namespaces; pending until created: later; skipped while terminating: held; skipped src: \
             the copy would be the source itself (ConfigMap src/cfg)"
        );
        assert_eq!(note_for(&targets(&["a"])), "1 namespaces");
    }

    #[test]
    fn failures_roll_up_with_the_shared_reason_or_a_generic_one() {
        assert_eq!(summarize_failures(&[]), None);
        let summary = summarize_failures(&[
            failure("b", Reason::DestinationConflict),
            failure("a", Reason::DestinationConflict),
        ])
        .unwrap();
        assert_eq!(summary.reason, Reason::DestinationConflict);
        assert_eq!(
            summary.message,
            "write failed in 2 namespaces: a (DestinationConflict), b (DestinationConflict)"
        );
        assert_eq!(
            summary
                .listed
                .iter()
                .map(|f| f.namespace.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(summary.listed[0].reason, "DestinationConflict");

        let mixed: Vec<_> = (0..30)
            .map(|i| {
                failure(
                    &format!("ns-{i:02}"),
                    if i == 7 {
                        Reason::DestinationCreateFailed
                    } else {
                        Reason::DestinationConflict
                    },
                )
            })
            .collect();
        let summary = summarize_failures(&mixed).unwrap();
        assert_eq!(summary.reason, Reason::DestinationWriteFailed);
        assert!(
            summary
                .message
                .starts_with("write failed in 30 namespaces: ns-00 (DestinationConflict)"),
            "{}",
            summary.message
        );
        assert!(summary.message.ends_with("and 25 more"), "{}", summary.message);
        assert_eq!(summary.listed.len(), MAX_LISTED_FAILURES);
    }

    #[test]
    fn a_removal_names_what_kept_the_first_copy_and_counts_the_rest() {
        let kept = |left: &[&str]| Removal {
            events: Vec::new(),
            left: left.iter().map(|s| (*s).to_owned()).collect(),
        };
        assert!(kept(&[]).all_gone());
        assert_eq!(kept(&[]).cause(), "");
        assert_eq!(
            kept(&["ConfigMap a/cfg: refused"]).cause(),
            "ConfigMap a/cfg: refused"
        );
        let both = kept(&["ConfigMap a/cfg: refused"]).and(kept(&["ConfigMap b/cfg: refused", "x"]));
        assert!(!both.all_gone());
        assert_eq!(both.cause(), "ConfigMap a/cfg: refused (and 2 more)");
    }

    #[test]
    fn long_lists_are_cut_after_ten() {
        assert_eq!(name_first(vec!["b".into(), "a".into()]), "a, b");
        let many: Vec<String> = (0..12).map(|i| format!("ns-{i:02}")).collect();
        let named = name_first(many);
        assert!(named.starts_with("ns-00, ns-01"), "{named}");
        assert!(named.ends_with("ns-09 and 2 more"), "{named}");
        assert_eq!(name_first(Vec::new()), "");
    }
}
