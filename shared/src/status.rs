//! The three conditions every projection reports, computed from the outcome of a reconcile with the
//! Go operator's reasons: `SourceResolved`, `DestinationWritten`, `Ready` (which mirrors the failing
//! condition's reason and message).

use crate::crd::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition type: the source was resolved, read and allowed.
pub const SOURCE_RESOLVED: &str = "SourceResolved";
/// Condition type: the copies were written.
pub const DESTINATION_WRITTEN: &str = "DestinationWritten";
/// Condition type: everything is in place.
pub const READY: &str = "Ready";

/// Reason of success on all three conditions (`Resolved` on `SourceResolved`).
pub const PROJECTED: &str = "Projected";
const RESOLVED: &str = "Resolved";
const SOURCE_NOT_RESOLVED: &str = "SourceNotResolved";

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
        reason: String,
        /// For a person.
        message: String,
    },
    /// The source is fine, the copies are not.
    DestinationFailed {
        /// `SourceResolved` message.
        resolved: String,
        /// E.g. `DestinationConflict`.
        reason: String,
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
    pub fn reason(&self) -> &str {
        match self {
            Self::Projected { .. } => PROJECTED,
            Self::SourceFailed { reason, .. } | Self::DestinationFailed { reason, .. } => reason.as_str(),
        }
    }

    /// The message shown on `Ready` (empty on success).
    pub fn message(&self) -> &str {
        match self {
            Self::Projected { .. } => "",
            Self::SourceFailed { message, .. } | Self::DestinationFailed { message, .. } => message,
        }
    }

    /// The three conditions, as (type, status, reason, message).
    fn conditions(&self) -> [(&'static str, &'static str, String, String); 3] {
        match self {
            Self::Projected { resolved, note } => [
                (SOURCE_RESOLVED, "True", RESOLVED.to_owned(), resolved.clone()),
                (DESTINATION_WRITTEN, "True", PROJECTED.to_owned(), note.clone()),
                (READY, "True", PROJECTED.to_owned(), String::new()),
            ],
            Self::SourceFailed { reason, message } => [
                (SOURCE_RESOLVED, "False", reason.clone(), message.clone()),
                (
                    DESTINATION_WRITTEN,
                    "Unknown",
                    SOURCE_NOT_RESOLVED.to_owned(),
                    "destination write not attempted because source resolution failed".to_owned(),
                ),
                (READY, "False", reason.clone(), message.clone()),
            ],
            Self::DestinationFailed {
                resolved,
                reason,
                message,
            } => [
                (SOURCE_RESOLVED, "True", RESOLVED.to_owned(), resolved.clone()),
                (DESTINATION_WRITTEN, "False", reason.clone(), message.clone()),
                (READY, "False", reason.clone(), message.clone()),
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
                reason,
                message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
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
            reason: "SourceNotFound".into(),
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
            reason: "DestinationConflict".into(),
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
            reason: "DestinationConflict".into(),
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
}
