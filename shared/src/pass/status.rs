//! The three conditions every projection reports, computed from the outcome of a reconcile with the
//! Go operator's reasons: `SourceResolved`, `DestinationWritten`, `Ready` (which mirrors the failing
//! condition's reason and message); and the status of each kind, built once per reconcile.

use crate::{
    api::crd::{AppliedOnce, ClusterProjectionStatus, Condition, ProjectionStatus, WrittenDestination},
    api::reason::{Reason, ResultCategory, Retry, retry_after},
    pass::tally::{CopyFailure, summarize_failures},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition type: the source was resolved, read and allowed.
pub const SOURCE_RESOLVED: &str = "SourceResolved";
/// Condition type: the copies were written.
pub const DESTINATION_WRITTEN: &str = "DestinationWritten";
/// Condition type: everything is in place.
pub const READY: &str = "Ready";
/// Every condition type, in the order they are written.
pub const CONDITION_TYPES: [&str; 3] = [SOURCE_RESOLVED, DESTINATION_WRITTEN, READY];

/// What a reconcile ended with, as far as the conditions are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The copies are in place.
    Projected {
        /// `SourceResolved` message (names the preferred version when unpinned).
        resolved: String,
        /// `DestinationWritten` message: empty, or what was skipped or is pending.
        note: String,
    },
    /// The source could not be resolved, read or used; nothing was written.
    SourceFailed {
        /// E.g. `SourceNotFound`, `SourceOptedOut`.
        reason: Reason,
        /// For a person.
        message: String,
    },
    /// The source is fine, the copies are not.
    DestinationFailed {
        /// `SourceResolved` message.
        resolved: String,
        /// E.g. `DestinationConflict`.
        reason: Reason,
        /// For a person.
        message: String,
    },
}

impl Outcome {
    /// Whether the projection is fully in place.
    pub fn is_ready(&self) -> bool {
        matches!(self, Self::Projected { .. })
    }

    /// The reason shown on `Ready`.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Projected { .. } => Reason::Projected,
            Self::SourceFailed { reason, .. } | Self::DestinationFailed { reason, .. } => *reason,
        }
    }

    /// The `result` label of the reconcile that ended with this outcome.
    pub fn category(&self) -> ResultCategory {
        self.reason().category()
    }

    /// The message shown on `Ready` (empty on success).
    pub fn message(&self) -> &str {
        match self {
            Self::Projected { .. } => "",
            Self::SourceFailed { message, .. } | Self::DestinationFailed { message, .. } => message,
        }
    }

    /// The three conditions, as (type, status, reason, message).
    fn conditions(&self) -> [(&'static str, &'static str, Reason, String); 3] {
        match self {
            Self::Projected { resolved, note } => [
                (SOURCE_RESOLVED, "True", Reason::Resolved, resolved.clone()),
                (DESTINATION_WRITTEN, "True", Reason::Projected, note.clone()),
                (READY, "True", Reason::Projected, String::new()),
            ],
            Self::SourceFailed { reason, message } => [
                (SOURCE_RESOLVED, "False", *reason, message.clone()),
                (
                    DESTINATION_WRITTEN,
                    "Unknown",
                    Reason::SourceNotResolved,
                    "destination write not attempted because source resolution failed".to_owned(),
                ),
                (READY, "False", *reason, message.clone()),
            ],
            Self::DestinationFailed {
                resolved,
                reason,
                message,
            } => [
                (SOURCE_RESOLVED, "True", Reason::Resolved, resolved.clone()),
                (DESTINATION_WRITTEN, "False", *reason, message.clone()),
                (READY, "False", *reason, message.clone()),
            ],
        }
    }
}

/// The conditions after `outcome`, computed from the current ones: `lastTransitionTime` moves only
/// when a condition's status changes, so an unchanged outcome yields identical conditions (and no
/// status write).
pub fn next_conditions(
    current: &[Condition],
    outcome: &Outcome,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    outcome
        .conditions()
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let previous = current.iter().find(|c| c.r#type == type_);
            let last_transition_time = match previous {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                r#type: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.as_str().to_owned(),
                message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// A reconcile that could not put every copy in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The conditions to report.
    pub outcome: Outcome,
    /// When to try again.
    pub retry: Retry,
    /// The copies the status should record afterwards (`None` once they were removed).
    pub written: Option<WrittenDestination>,
}

/// What a source problem does to the copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copies {
    /// They stay as they are.
    Kept,
    /// They were to be removed; `all_gone` says whether every one is.
    Withdrawn {
        /// Every copy is gone.
        all_gone: bool,
    },
}

/// Why a pass stopped before it applied a plan. Every failed read, refused plan or content that
/// cannot be built becomes one where it happens, with its reason; the event, the status and the
/// retry all come from it ([`Stopped::failure`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The condition and event reason.
    pub reason: Reason,
    /// The condition and event message.
    pub message: String,
    /// Where the pass stopped.
    pub at: StoppedAt,
}

/// Where a pass stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoppedAt {
    /// At its source: `transient` when an API call failed; `copies` says what became of them.
    Source {
        /// An API call failed (retried with backoff).
        transient: bool,
        /// Kept, or withdrawn.
        copies: Copies,
    },
    /// After its source was read (`resolved`: the `SourceResolved` message).
    Destination {
        /// The `SourceResolved` message.
        resolved: String,
    },
}

impl Stopped {
    /// The failure the status reports, with the copies it records (`recorded` before the pass).
    pub fn failure(self, recorded: Option<WrittenDestination>) -> Failure {
        match self.at {
            StoppedAt::Source { transient, copies } => {
                source_failure(self.reason, self.message, transient, copies, recorded)
            }
            StoppedAt::Destination { resolved } => {
                destination_failure(&resolved, self.reason, self.message, recorded)
            }
        }
    }
}

/// The failure of a pass that stopped at its source: `transient` when an API call failed. Copies
/// withdrawn for good are no longer recorded; copies left to remove stay recorded and are retried.
fn source_failure(
    reason: Reason,
    message: String,
    transient: bool,
    copies: Copies,
    recorded: Option<WrittenDestination>,
) -> Failure {
    let (cleaned, written) = match copies {
        Copies::Kept => (true, recorded),
        Copies::Withdrawn { all_gone: true } => (true, None),
        Copies::Withdrawn { all_gone: false } => (false, recorded),
    };
    Failure {
        outcome: Outcome::SourceFailed { reason, message },
        retry: retry_after(reason, transient, cleaned),
        written,
    }
}

/// The failure of a pass whose source is fine but whose copies are not (`resolved`: the
/// `SourceResolved` message); retried as its reason says, the copies recorded as they were.
fn destination_failure(
    resolved: &str,
    reason: Reason,
    message: String,
    recorded: Option<WrittenDestination>,
) -> Failure {
    Failure {
        outcome: Outcome::DestinationFailed {
            resolved: resolved.to_owned(),
            reason,
            message,
        },
        retry: reason.retry(),
        written: recorded,
    }
}

/// How far a pass got, as its status records it.
#[derive(Clone, Copy, Debug)]
pub enum Reached<'a> {
    /// The plan was applied.
    Applied {
        /// The copies the status records for cleanup.
        record: &'a WrittenDestination,
        /// How many targets are to hold a copy.
        holding: usize,
        /// The targets that failed.
        failures: &'a [CopyFailure],
        /// The source hash every copy of the pass carries.
        hash: &'a str,
        /// With `syncPolicy: ApplyOnce`, the record of where the copies were created.
        applied_once: Option<&'a AppliedOnce>,
    },
    /// The pass stopped before writing; `written` is what the status keeps recording (`None` once
    /// the copies were withdrawn).
    Stopped {
        /// The copies still recorded.
        written: Option<&'a WrittenDestination>,
    },
}

/// A Projection's next status: the conditions of `outcome`, the copy's name once projected (kept
/// from `current` otherwise), and the copy as recorded for cleanup.
pub fn projection_status(
    current: &ProjectionStatus,
    outcome: &Outcome,
    reached: Reached<'_>,
    generation: Option<i64>,
    now: &Time,
) -> ProjectionStatus {
    let conditions = next_conditions(&current.conditions, outcome, generation, now);
    match reached {
        Reached::Applied {
            record,
            hash,
            applied_once,
            ..
        } => ProjectionStatus {
            conditions,
            destination_name: match outcome {
                Outcome::Projected { .. } => Some(record.name.clone()),
                _ => current.destination_name.clone(),
            },
            written_destination: Some(record.clone()),
            source_hash: Some(hash.to_owned()),
            applied_once: applied_once.cloned(),
            last_handled_reconcile_at: current.last_handled_reconcile_at.clone(),
        },
        // Copies withdrawn (nothing recorded any more) take their hash and ApplyOnce record along.
        Reached::Stopped { written } => ProjectionStatus {
            conditions,
            destination_name: current.destination_name.clone(),
            written_destination: written.cloned(),
            source_hash: written.and(current.source_hash.clone()),
            applied_once: written.and(current.applied_once.clone()),
            last_handled_reconcile_at: current.last_handled_reconcile_at.clone(),
        },
    }
}

/// A ClusterProjection's next status. Counts stay honest: a pass that stopped keeps the last counts
/// while copies remain, and reports none once they were withdrawn.
pub fn cluster_status(
    current: &ClusterProjectionStatus,
    outcome: &Outcome,
    reached: Reached<'_>,
    generation: Option<i64>,
    now: &Time,
) -> ClusterProjectionStatus {
    let conditions = next_conditions(&current.conditions, outcome, generation, now);
    match reached {
        Reached::Applied {
            record,
            holding,
            failures,
            hash,
            applied_once,
        } => ClusterProjectionStatus {
            conditions,
            destination_name: Some(record.name.clone()),
            namespaces_written: count(holding.saturating_sub(failures.len())),
            namespaces_failed: count(failures.len()),
            failed_namespaces: summarize_failures(failures).map(|s| s.listed).unwrap_or_default(),
            written_destination: Some(record.clone()),
            source_hash: Some(hash.to_owned()),
            last_handled_reconcile_at: current.last_handled_reconcile_at.clone(),
            applied_once: applied_once.cloned(),
        },
        Reached::Stopped { written: None } => ClusterProjectionStatus {
            conditions,
            destination_name: current.destination_name.clone(),
            namespaces_written: 0,
            namespaces_failed: 0,
            failed_namespaces: Vec::new(),
            written_destination: None,
            source_hash: None,
            last_handled_reconcile_at: current.last_handled_reconcile_at.clone(),
            applied_once: None,
        },
        Reached::Stopped {
            written: Some(written),
        } => ClusterProjectionStatus {
            conditions,
            destination_name: current.destination_name.clone(),
            namespaces_written: current.namespaces_written,
            namespaces_failed: current.namespaces_failed,
            failed_namespaces: current.failed_namespaces.clone(),
            written_destination: Some(written.clone()),
            source_hash: current.source_hash.clone(),
            last_handled_reconcile_at: current.last_handled_reconcile_at.clone(),
            applied_once: current.applied_once.clone(),
        },
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn ready_mirrors_the_failing_condition() {
        let outcome = Outcome::SourceFailed {
            reason: Reason::SourceNotFound,
            message: "source a/b not found".into(),
        };
        let c = next_conditions(&[], &outcome, Some(2), &at(10));
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("False", "SourceNotFound")
        );
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("Unknown", "SourceNotResolved")
        );
        assert_eq!(
            (c[2].status.as_str(), c[2].reason.as_str(), c[2].message.as_str()),
            ("False", "SourceNotFound", "source a/b not found")
        );
        assert!(c.iter().all(|c| c.observed_generation == Some(2)));

        let outcome = Outcome::DestinationFailed {
            resolved: String::new(),
            reason: Reason::DestinationConflict,
            message: "m".into(),
        };
        let c = next_conditions(&[], &outcome, Some(2), &at(10));
        assert_eq!(c[0].status, "True");
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("False", "DestinationConflict")
        );
        assert_eq!(
            (c[2].reason.as_str(), c[2].message.as_str()),
            ("DestinationConflict", "m")
        );
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let ok = Outcome::Projected {
            resolved: "resolved /ConfigMap to preferred version v1".into(),
            note: String::new(),
        };
        let first = next_conditions(&[], &ok, Some(1), &at(10));
        assert_eq!(first[0].message, "resolved /ConfigMap to preferred version v1");
        let again = next_conditions(&first, &ok, Some(1), &at(20));
        assert_eq!(first, again, "an unchanged outcome changes nothing");

        let failed = Outcome::DestinationFailed {
            resolved: String::new(),
            reason: Reason::DestinationConflict,
            message: "m".into(),
        };
        let after = next_conditions(&again, &failed, Some(2), &at(30));
        assert_eq!(
            after[0].last_transition_time,
            at(10),
            "SourceResolved stayed True"
        );
        assert_eq!(after[2].last_transition_time, at(30), "Ready flipped");
    }

    fn recorded(name: &str) -> WrittenDestination {
        WrittenDestination {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_source_failure_keeps_or_drops_the_record_and_picks_its_retry() {
        use Reason::*;
        // (reason, transient, copies, retry, record kept)
        for (reason, transient, copies, retry, kept) in [
            (SourceResolutionFailed, false, Copies::Kept, Retry::OnChange, true),
            (SourceResolutionFailed, true, Copies::Kept, Retry::Backoff, true),
            (SourceForbidden, false, Copies::Kept, Retry::Backoff, true),
            (SourceFetchFailed, true, Copies::Kept, Retry::Backoff, true),
            (
                SourceDeleted,
                false,
                Copies::Withdrawn { all_gone: true },
                Retry::OnChange,
                false,
            ),
            (
                SourceDeleted,
                false,
                Copies::Withdrawn { all_gone: false },
                Retry::Backoff,
                true,
            ),
            (
                SourceOptedOut,
                false,
                Copies::Withdrawn { all_gone: true },
                Retry::OnChange,
                false,
            ),
            (
                SourceNotProjectable,
                false,
                Copies::Withdrawn { all_gone: false },
                Retry::Backoff,
                true,
            ),
        ] {
            let stopped = Stopped {
                reason,
                message: "m".into(),
                at: StoppedAt::Source { transient, copies },
            };
            let f = stopped.failure(Some(recorded("cfg")));
            assert_eq!(f.retry, retry, "{reason} {copies:?}");
            assert_eq!(f.written.is_some(), kept, "{reason} {copies:?}");
            assert_eq!(f.outcome.reason(), reason);
            assert_eq!(f.outcome.category(), ResultCategory::SourceError);
        }
    }

    #[test]
    fn a_destination_failure_keeps_the_record_and_retries_by_its_reason() {
        for (reason, retry) in [
            (Reason::DestinationConflict, Retry::OnChange),
            (Reason::TargetResolutionFailed, Retry::OnChange),
            (Reason::DestinationCreateFailed, Retry::Backoff),
        ] {
            let at = StoppedAt::Destination {
                resolved: "resolved".into(),
            };
            let f = Stopped {
                reason,
                message: "m".into(),
                at,
            }
            .failure(Some(recorded("cfg")));
            assert_eq!(f.retry, retry, "{reason}");
            assert_eq!(f.written, Some(recorded("cfg")));
            assert_eq!(f.outcome.reason(), reason);
            assert_eq!(f.outcome.conditions()[0].3, "resolved");
        }
    }

    #[test]
    fn a_projection_names_its_copy_once_projected() {
        let current = ProjectionStatus {
            destination_name: Some("old".into()),
            ..ProjectionStatus::default()
        };
        let ok = Outcome::Projected {
            resolved: String::new(),
            note: String::new(),
        };
        let new = recorded("new");
        let applied = Reached::Applied {
            record: &new,
            holding: 1,
            failures: &[],
            hash: "h",
            applied_once: None,
        };
        let next = projection_status(&current, &ok, applied, Some(3), &at(1));
        assert_eq!(next.destination_name.as_deref(), Some("new"));
        assert_eq!(next.written_destination, Some(recorded("new")));
        assert_eq!(next.source_hash.as_deref(), Some("h"));
        assert_eq!(next.conditions[2].observed_generation, Some(3));
        let failed = Outcome::SourceFailed {
            reason: Reason::SourceDeleted,
            message: "m".into(),
        };
        let next = projection_status(
            &current,
            &failed,
            Reached::Stopped { written: None },
            Some(3),
            &at(1),
        );
        assert_eq!(next.destination_name.as_deref(), Some("old"));
        assert_eq!(next.written_destination, None);
        assert_eq!(next.conditions[2].reason, "SourceDeleted");
    }

    #[test]
    fn a_cluster_status_counts_what_the_pass_reached() {
        let current = ClusterProjectionStatus {
            destination_name: Some("cfg".into()),
            namespaces_written: 4,
            namespaces_failed: 1,
            failed_namespaces: vec![crate::api::crd::NamespaceFailure {
                namespace: "x".into(),
                reason: "DestinationConflict".into(),
                message: "m".into(),
            }],
            ..ClusterProjectionStatus::default()
        };
        let failed = Outcome::SourceFailed {
            reason: Reason::SourceFetchFailed,
            message: "m".into(),
        };
        let written = recorded("cfg");
        let failures = [CopyFailure {
            namespace: "b".into(),
            reason: Reason::DestinationCreateFailed,
            message: "quota".into(),
        }];
        // (pass, destination name, written, failed, listed failures, recorded)
        type Row<'a> = (Reached<'a>, Option<&'a str>, i32, i32, Vec<&'a str>, bool);
        let table: [Row<'_>; 3] = [
            (
                Reached::Applied {
                    record: &written,
                    holding: 3,
                    failures: &failures,
                    hash: "h",
                    applied_once: None,
                },
                Some("cfg"),
                2,
                1,
                vec!["b"],
                true,
            ),
            (
                Reached::Stopped {
                    written: Some(&written),
                },
                Some("cfg"),
                4,
                1,
                vec!["x"],
                true,
            ),
            (
                Reached::Stopped { written: None },
                Some("cfg"),
                0,
                0,
                vec![],
                false,
            ),
        ];
        for (pass, name, ok, bad, listed, kept) in table {
            let next = cluster_status(&current, &failed, pass, Some(1), &at(1));
            assert_eq!(next.destination_name.as_deref(), name, "{pass:?}");
            assert_eq!(
                (next.namespaces_written, next.namespaces_failed),
                (ok, bad),
                "{pass:?}"
            );
            let namespaces: Vec<&str> = next
                .failed_namespaces
                .iter()
                .map(|f| f.namespace.as_str())
                .collect();
            assert_eq!(namespaces, listed, "{pass:?}");
            assert_eq!(next.written_destination.is_some(), kept, "{pass:?}");
            assert_eq!(next.conditions[2].reason, "SourceFetchFailed");
        }
    }
}
