//! The three conditions every projection reports, computed from the outcome of a reconcile with the
//! Go operator's reasons: `SourceResolved`, `DestinationWritten`, `Ready` (which mirrors the failing
//! condition's reason and message); the two ways a pass ends ([`Stop`] before it applied a plan,
//! [`Concluded`] after); and the status of either kind, built once per reconcile from that end.

use crate::{
    api::{
        crd::{AppliedOnce, Condition, CopyStatus, NamespaceCounts, WrittenDestination},
        kind::{CrView, Scope},
        reason::{Progress, Reason, ResultCategory, Retry, retry_after},
    },
    pass::tally::{EventNote, Removal, Tally, summarize_failures},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::ApiResource;
use serde::Serialize;

/// Condition type: the source was resolved, read and allowed.
pub const SOURCE_RESOLVED: &str = "SourceResolved";
/// Condition type: the copies were written.
pub const DESTINATION_WRITTEN: &str = "DestinationWritten";
/// Condition type: everything is in place.
pub const READY: &str = "Ready";
/// Condition type (kstatus): the CR is being worked on, or retried for something that may still
/// come. Present only while `True`.
pub const RECONCILING: &str = "Reconciling";
/// Condition type (kstatus): no retry can help until a person changes something. Present only
/// while `True`.
pub const STALLED: &str = "Stalled";
/// Every condition type a pass reports, in the order they are written (the last two only while
/// they are `True`).
pub const CONDITION_TYPES: [&str; 5] = [SOURCE_RESOLVED, DESTINATION_WRITTEN, READY, RECONCILING, STALLED];

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
/// status write). A failure adds `Reconciling` or `Stalled` by its reason's [`Progress`].
pub fn next_conditions(
    current: &[Condition],
    outcome: &Outcome,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = outcome
        .conditions()
        .into_iter()
        .map(|(type_, status, reason, message)| {
            condition(current, (type_, status), reason, message, generation, now)
        })
        .collect();
    conditions.extend(progress_condition(
        current,
        outcome.reason(),
        outcome.message(),
        generation,
        now,
    ));
    conditions
}

/// The `Reconciling` or `Stalled` condition of a CR whose `Ready` carries `reason` (none when it
/// is settled), its transition time kept from `current` while it stays.
pub fn progress_condition(
    current: &[Condition],
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let type_ = match reason.progress() {
        Progress::Settled => return None,
        Progress::Reconciling => RECONCILING,
        Progress::Stalled => STALLED,
    };
    Some(condition(
        current,
        (type_, "True"),
        reason,
        message.to_owned(),
        generation,
        now,
    ))
}

/// Whether `condition` says how far the CR has come (`Reconciling`, `Stalled`): replaced whenever
/// `Ready` is.
pub fn is_progress(condition: &Condition) -> bool {
    condition.r#type == RECONCILING || condition.r#type == STALLED
}

/// A condition of `type_` with `status`, its transition time kept from `current` while its status
/// stays.
fn condition(
    current: &[Condition],
    (type_, status): (&str, &str),
    reason: Reason,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = match current.iter().find(|c| c.r#type == type_) {
        Some(previous) if previous.status == status => previous.last_transition_time.clone(),
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
}

/// Why a pass stopped before it applied a plan. Every failed read, refused plan or content that
/// cannot be built becomes one where it happens, with its reason; the event, the status and the
/// retry all come from it.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// At its source; the copies stay as they are. `transient` when an API call failed (retried
    /// with backoff).
    Source {
        /// The condition and event reason.
        reason: Reason,
        /// The condition and event message.
        message: String,
        /// An API call failed.
        transient: bool,
    },
    /// At its source, which is gone, vetoes projection or may not be read by the CR's author:
    /// every copy goes. `removal` is what withdrawing them did, once tried.
    Withdraw {
        /// The condition and event reason.
        reason: Reason,
        /// The condition and event message.
        message: String,
        /// The source's kind as it resolves now (its copies are withdrawn too).
        resource: Box<ApiResource>,
        /// What withdrawing the copies did (`None` before it was tried).
        removal: Option<Removal>,
    },
    /// After its source was read (`resolved`: the `SourceResolved` message).
    Destination {
        /// The condition and event reason.
        reason: Reason,
        /// The condition and event message.
        message: String,
        /// The `SourceResolved` message.
        resolved: String,
    },
}

impl Stop {
    /// The condition and event reason.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Source { reason, .. }
            | Self::Withdraw { reason, .. }
            | Self::Destination { reason, .. } => *reason,
        }
    }

    /// The condition and event message.
    pub fn message(&self) -> &str {
        match self {
            Self::Source { message, .. }
            | Self::Withdraw { message, .. }
            | Self::Destination { message, .. } => message,
        }
    }

    /// The conditions to report.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Source { reason, message, .. } | Self::Withdraw { reason, message, .. } => {
                Outcome::SourceFailed {
                    reason: *reason,
                    message: message.clone(),
                }
            }
            Self::Destination {
                reason,
                message,
                resolved,
            } => Outcome::DestinationFailed {
                resolved: resolved.clone(),
                reason: *reason,
                message: message.clone(),
            },
        }
    }

    /// When to try again: copies left to withdraw are retried with backoff.
    pub fn retry(&self) -> Retry {
        match self {
            Self::Source {
                reason, transient, ..
            } => retry_after(*reason, *transient, true),
            Self::Withdraw { reason, removal, .. } => {
                retry_after(*reason, false, removal.as_ref().is_some_and(Removal::all_gone))
            }
            Self::Destination { reason, .. } => reason.retry(),
        }
    }

    /// The copies the status records after this stop (`recorded` before the pass): none once they
    /// were all withdrawn; copies left to remove stay recorded, so the next pass removes them.
    pub fn keeps<'a>(&self, recorded: Option<&'a WrittenDestination>) -> Option<&'a WrittenDestination> {
        match self {
            Self::Withdraw { removal, .. } if removal.as_ref().is_some_and(Removal::all_gone) => None,
            _ => recorded,
        }
    }

    /// Its events: the stop itself (a Warning), then what a withdrawal did.
    pub fn events(&self) -> Vec<EventNote> {
        let mut events = vec![EventNote {
            reason: self.reason(),
            note: self.message().to_owned(),
        }];
        if let Self::Withdraw {
            removal: Some(removal),
            ..
        } = self
        {
            events.extend(removal.events.iter().cloned());
        }
        events
    }
}

/// How a pass that applied its plan ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concluded {
    /// The conditions to report.
    pub outcome: Outcome,
    /// When to try again.
    pub retry: Retry,
    /// What the writes add up to, with the refused targets among the failures.
    pub tally: Tally,
    /// The events of the writes and the removals.
    pub events: Vec<EventNote>,
    /// Namespaces where a stranger holds the copy's coordinates: the pass is woken when it goes.
    pub waiting: Vec<String>,
    /// The copies the status records for cleanup: the earlier ones while they could not all be
    /// removed, so the next pass removes them again.
    pub record: WrittenDestination,
    /// How many targets hold a copy (those deleted by hand under `ApplyOnce` do not).
    pub holding: usize,
    /// With `syncPolicy: ApplyOnce`, the record of where the copies were created.
    pub applied_once: Option<AppliedOnce>,
    /// The source hash every copy of the pass carries.
    pub hash: String,
}

impl Concluded {
    /// The pass as it ends in a cluster where no watch sees a stranger leave the coordinates a copy
    /// waits for (another cluster: only our copies are watched there): waiting for one, it is
    /// retried with backoff instead of waiting for an event that will not come.
    #[must_use]
    pub fn where_strangers_are_unwatched(mut self) -> Self {
        if !self.waiting.is_empty() {
            self.retry = Retry::Backoff;
        }
        self
    }
}

/// How a pass ended: its plan applied, or stopped before.
pub type PassEnd = Result<Concluded, Stop>;

/// The conditions a pass ended with, and when to try again.
pub fn verdict(end: &PassEnd) -> (Outcome, Retry) {
    match end {
        Ok(concluded) => (concluded.outcome.clone(), concluded.retry),
        Err(stop) => (stop.outcome(), stop.retry()),
    }
}

/// The status of either kind as it is written: what both report, and a ClusterProjection's counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Status {
    /// What both kinds report.
    #[serde(flatten)]
    pub copy: CopyStatus,
    /// A ClusterProjection's counts (`None` for a Projection).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub counts: Option<NamespaceCounts>,
}

impl Status {
    /// The status `cr` carries now (empty before its first pass).
    pub fn of(cr: &CrView<'_>) -> Self {
        Self {
            copy: cr.status.cloned().unwrap_or_default(),
            counts: match cr.scope {
                Scope::OwnNamespace => None,
                Scope::Namespaces => Some(cr.counts.cloned().unwrap_or_default()),
            },
        }
    }

    /// The status after a pass of a CR of `scope` at `generation` that ended with `end`: the
    /// conditions of its outcome, the copies recorded for cleanup, and the counts. Counts stay
    /// honest: a pass that stopped keeps the last counts while copies remain, and reports none once
    /// they were withdrawn. A Projection names its copy once it is projected.
    pub fn after(&self, scope: Scope, end: &PassEnd, generation: Option<i64>, now: &Time) -> Self {
        let current = &self.copy;
        let (outcome, _) = verdict(end);
        let conditions = next_conditions(&current.conditions, &outcome, generation, now);
        let kept = current.last_handled_reconcile_at.clone();
        match end {
            Ok(concluded) => {
                let record = &concluded.record;
                let named = scope == Scope::Namespaces || outcome.is_ready();
                let failures = &concluded.tally.failures;
                Self {
                    copy: CopyStatus {
                        observed_generation: generation,
                        conditions,
                        destination_name: if named {
                            Some(record.name.clone())
                        } else {
                            current.destination_name.clone()
                        },
                        written_destination: Some(record.clone()),
                        source_hash: Some(concluded.hash.clone()),
                        last_handled_reconcile_at: kept,
                        applied_once: concluded.applied_once.clone(),
                    },
                    counts: self.counts.as_ref().map(|_| NamespaceCounts {
                        namespaces_written: count(concluded.holding.saturating_sub(failures.len())),
                        namespaces_failed: count(failures.len()),
                        failed_namespaces: summarize_failures(failures).map(|s| s.listed).unwrap_or_default(),
                    }),
                }
            }
            // Copies withdrawn (nothing recorded any more) take their hash, ApplyOnce record and
            // counts along.
            Err(stop) => {
                let written = stop.keeps(current.written_destination.as_ref());
                Self {
                    copy: CopyStatus {
                        observed_generation: generation,
                        conditions,
                        destination_name: current.destination_name.clone(),
                        written_destination: written.cloned(),
                        source_hash: written.and(current.source_hash.clone()),
                        last_handled_reconcile_at: kept,
                        applied_once: written.and(current.applied_once.clone()),
                    },
                    counts: self.counts.as_ref().map(|counts| match written {
                        Some(_) => counts.clone(),
                        None => NamespaceCounts::default(),
                    }),
                }
            }
        }
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::tally::CopyFailure;
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
            cluster: None,
            cluster_identity: None,
        }
    }

    fn resource() -> ApiResource {
        ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
    }

    fn withdrawn(reason: Reason, all_gone: bool) -> Stop {
        let left = if all_gone {
            Vec::new()
        } else {
            vec!["ConfigMap a/cfg: refused".into()]
        };
        Stop::Withdraw {
            reason,
            message: "m".into(),
            resource: Box::new(resource()),
            removal: Some(Removal {
                events: Vec::new(),
                left,
            }),
        }
    }

    fn at_source(reason: Reason, transient: bool) -> Stop {
        Stop::Source {
            reason,
            message: "m".into(),
            transient,
        }
    }

    #[test]
    fn a_stop_at_the_source_keeps_or_drops_the_record_and_picks_its_retry() {
        use Reason::*;
        // (stop, retry, record kept)
        for (stop, retry, kept) in [
            (at_source(SourceResolutionFailed, false), Retry::OnChange, true),
            (at_source(SourceResolutionFailed, true), Retry::Backoff, true),
            (at_source(SourceForbidden, false), Retry::Backoff, true),
            (at_source(SourceFetchFailed, true), Retry::Backoff, true),
            (withdrawn(SourceDeleted, true), Retry::OnChange, false),
            (withdrawn(SourceDeleted, false), Retry::Backoff, true),
            (withdrawn(SourceOptedOut, true), Retry::OnChange, false),
            (withdrawn(SourceNotProjectable, false), Retry::Backoff, true),
        ] {
            let record = recorded("cfg");
            assert_eq!(stop.retry(), retry, "{stop:?}");
            assert_eq!(stop.keeps(Some(&record)).is_some(), kept, "{stop:?}");
            let outcome = stop.outcome();
            assert_eq!(outcome.reason(), stop.reason());
            assert_eq!(outcome.category(), ResultCategory::SourceError);
            assert_eq!(
                stop.events()[0].reason,
                stop.reason(),
                "the stop is its first event"
            );
        }
    }

    #[test]
    fn a_stop_at_the_destination_keeps_the_record_and_retries_by_its_reason() {
        for (reason, retry) in [
            (Reason::DestinationConflict, Retry::OnChange),
            (Reason::TargetResolutionFailed, Retry::OnChange),
            (Reason::DestinationCreateFailed, Retry::Backoff),
        ] {
            let stop = Stop::Destination {
                reason,
                message: "m".into(),
                resolved: "resolved".into(),
            };
            let record = recorded("cfg");
            assert_eq!(stop.retry(), retry, "{reason}");
            assert_eq!(stop.keeps(Some(&record)), Some(&record));
            assert_eq!(stop.outcome().reason(), reason);
            assert_eq!(stop.outcome().conditions()[0].3, "resolved");
        }
    }

    fn concluded(
        outcome: Outcome,
        record: WrittenDestination,
        holding: usize,
        failures: Vec<CopyFailure>,
    ) -> PassEnd {
        Ok(Concluded {
            outcome,
            retry: Retry::OnChange,
            tally: Tally {
                failures,
                ..Tally::default()
            },
            events: Vec::new(),
            waiting: Vec::new(),
            record,
            holding,
            applied_once: None,
            hash: "h".into(),
        })
    }

    #[test]
    fn a_failure_says_whether_it_is_still_worked_on_or_stalled() {
        let types = |c: &[Condition]| c.iter().map(|c| c.r#type.clone()).collect::<Vec<_>>();
        let missing = Outcome::SourceFailed {
            reason: Reason::SourceNotFound,
            message: "source a/b not found".into(),
        };
        let waiting = next_conditions(&[], &missing, Some(1), &at(10));
        assert_eq!(
            types(&waiting),
            [SOURCE_RESOLVED, DESTINATION_WRITTEN, READY, RECONCILING]
        );
        assert_eq!(
            (
                waiting[3].status.as_str(),
                waiting[3].reason.as_str(),
                waiting[3].message.as_str()
            ),
            ("True", "SourceNotFound", "source a/b not found")
        );
        // The source stays missing: nothing moves. A conflict replaces Reconciling by Stalled.
        assert_eq!(next_conditions(&waiting, &missing, Some(1), &at(20)), waiting);
        let conflict = Outcome::DestinationFailed {
            resolved: String::new(),
            reason: Reason::DestinationConflict,
            message: "a stranger holds it".into(),
        };
        let stalled = next_conditions(&waiting, &conflict, Some(2), &at(30));
        assert_eq!(
            types(&stalled),
            [SOURCE_RESOLVED, DESTINATION_WRITTEN, READY, STALLED]
        );
        assert_eq!(stalled[3].last_transition_time, at(30));
        assert_eq!(stalled[3].observed_generation, Some(2));
        // Projected: neither.
        let ok = Outcome::Projected {
            resolved: String::new(),
            note: String::new(),
        };
        let done = next_conditions(&stalled, &ok, Some(2), &at(40));
        assert_eq!(types(&done), [SOURCE_RESOLVED, DESTINATION_WRITTEN, READY]);
        assert!(!done.iter().any(is_progress));
    }

    #[test]
    fn a_projection_names_its_copy_once_projected() {
        let current = Status {
            copy: CopyStatus {
                destination_name: Some("old".into()),
                ..CopyStatus::default()
            },
            counts: None,
        };
        let ok = Outcome::Projected {
            resolved: String::new(),
            note: String::new(),
        };
        let applied = concluded(ok, recorded("new"), 1, Vec::new());
        let next = current.after(Scope::OwnNamespace, &applied, Some(3), &at(1));
        assert_eq!(next.copy.destination_name.as_deref(), Some("new"));
        assert_eq!(next.copy.written_destination, Some(recorded("new")));
        assert_eq!(next.copy.source_hash.as_deref(), Some("h"));
        assert_eq!(next.copy.conditions[2].observed_generation, Some(3));
        assert_eq!(next.copy.observed_generation, Some(3));
        assert_eq!(next.counts, None);
        let conflict = Outcome::DestinationFailed {
            resolved: String::new(),
            reason: Reason::DestinationConflict,
            message: "m".into(),
        };
        let failed = concluded(conflict, recorded("new"), 1, Vec::new());
        let next = current.after(Scope::OwnNamespace, &failed, Some(3), &at(1));
        assert_eq!(
            next.copy.destination_name.as_deref(),
            Some("old"),
            "not projected yet"
        );
        let gone = Err(withdrawn(Reason::SourceDeleted, true));
        let next = current.after(Scope::OwnNamespace, &gone, Some(3), &at(1));
        assert_eq!(next.copy.destination_name.as_deref(), Some("old"));
        assert_eq!(next.copy.written_destination, None);
        assert_eq!(next.copy.conditions[2].reason, "SourceDeleted");
        let json = serde_json::to_value(&next).unwrap();
        assert!(json.get("namespacesWritten").is_none(), "{json}");
    }

    #[test]
    fn a_cluster_status_counts_what_the_pass_reached() {
        let current = Status {
            copy: CopyStatus {
                destination_name: Some("cfg".into()),
                written_destination: Some(recorded("cfg")),
                ..CopyStatus::default()
            },
            counts: Some(NamespaceCounts {
                namespaces_written: 4,
                namespaces_failed: 1,
                failed_namespaces: vec![crate::api::crd::NamespaceFailure {
                    namespace: "x".into(),
                    reason: "DestinationConflict".into(),
                    message: "m".into(),
                }],
            }),
        };
        let failed = Outcome::DestinationFailed {
            resolved: String::new(),
            reason: Reason::DestinationCreateFailed,
            message: "m".into(),
        };
        let failures = vec![CopyFailure {
            namespace: "b".into(),
            reason: Reason::DestinationCreateFailed,
            message: "quota".into(),
        }];
        let fetch = at_source(Reason::SourceFetchFailed, true);
        // (pass, written, failed, listed failures, recorded)
        let table: [(PassEnd, i32, i32, Vec<&str>, bool); 3] = [
            (
                concluded(failed, recorded("cfg"), 3, failures),
                2,
                1,
                vec!["b"],
                true,
            ),
            (Err(fetch), 4, 1, vec!["x"], true),
            (Err(withdrawn(Reason::SourceDeleted, true)), 0, 0, vec![], false),
        ];
        for (end, ok, bad, listed, kept) in table {
            let next = current.after(Scope::Namespaces, &end, Some(1), &at(1));
            let counts = next.counts.clone().expect("counts");
            assert_eq!(next.copy.destination_name.as_deref(), Some("cfg"), "{end:?}");
            assert_eq!(
                (counts.namespaces_written, counts.namespaces_failed),
                (ok, bad),
                "{end:?}"
            );
            let namespaces: Vec<&str> = counts
                .failed_namespaces
                .iter()
                .map(|f| f.namespace.as_str())
                .collect();
            assert_eq!(namespaces, listed, "{end:?}");
            assert_eq!(next.copy.written_destination.is_some(), kept, "{end:?}");
            let json = serde_json::to_value(&next).unwrap();
            assert_eq!(json["namespacesWritten"], ok, "always present: {json}");
        }
    }
}
