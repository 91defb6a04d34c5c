//! `kubectl projection status`: one line per CR from its status: its outcome, copies written and
//! failed, whether it is suspended, and when its conditions last changed.

use crate::{
    api::crd::{ClusterProjectionStatus, Condition, NamespaceFailure, ProjectionStatus},
    pass::{
        lifecycle::SUSPENDED,
        status::{DESTINATION_WRITTEN, READY},
    },
};
use serde::Serialize;

/// The status of one CR, summed up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `Ready`'s status: `True`, `False`, or `Unknown` (also before any status).
    pub ready: String,
    /// `Ready`'s reason, e.g. `Projected` or `DestinationConflict` (empty before any status).
    pub reason: String,
    /// `Ready`'s message, or what the absence of a status means.
    pub message: String,
    /// Whether `Suspended` is `True`.
    pub suspended: bool,
    /// Copies written (a Projection: 0 or 1).
    pub written: i32,
    /// Copies that failed (a Projection: 0 or 1).
    pub failed: i32,
    /// The latest transition of a condition (RFC 3339), if any.
    pub last_change: Option<String>,
    /// The failed namespaces with their reasons (a ClusterProjection).
    pub failures: Vec<NamespaceFailure>,
}

/// What a CR without a status is waiting for.
pub const NO_STATUS: &str = "no status yet: the controller has not reconciled it (is it running?)";

impl Summary {
    /// Whether a person should look at the CR: not `Ready`.
    pub fn needs_attention(&self) -> bool {
        self.ready != "True"
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.r#type == type_)
}

fn summarize(conditions: &[Condition], counts: (i32, i32), failures: Vec<NamespaceFailure>) -> Summary {
    let ready = find(conditions, READY);
    Summary {
        ready: ready.map_or("Unknown", |c| c.status.as_str()).to_owned(),
        reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        message: ready.map_or_else(|| NO_STATUS.to_owned(), |c| c.message.clone()),
        suspended: find(conditions, SUSPENDED).is_some_and(|c| c.status == "True"),
        written: counts.0,
        failed: counts.1,
        last_change: conditions
            .iter()
            .map(|c| c.last_transition_time.0)
            .max()
            .map(|t| t.to_string()),
        failures,
    }
}

/// The summary of a Projection's status (`None` before its first pass).
pub fn of_projection(status: Option<&ProjectionStatus>) -> Summary {
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let written = find(conditions, DESTINATION_WRITTEN);
    let counts = (
        i32::from(written.is_some_and(|c| c.status == "True")),
        i32::from(written.is_some_and(|c| c.status == "False")),
    );
    summarize(conditions, counts, Vec::new())
}

/// The summary of a ClusterProjection's status (`None` before its first pass).
pub fn of_cluster(status: Option<&ClusterProjectionStatus>) -> Summary {
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let counts = status.map_or((0, 0), |s| (s.namespaces_written, s.namespaces_failed));
    let failures = status.map(|s| s.failed_namespaces.clone()).unwrap_or_default();
    summarize(conditions, counts, failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

    fn condition(type_: &str, status: &str, reason: &str, second: i64) -> Condition {
        Condition {
            r#type: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason} message"),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(second).unwrap()),
        }
    }

    #[test]
    fn a_projection_sums_up_from_its_conditions() {
        let ready = ProjectionStatus {
            conditions: vec![
                condition("SourceResolved", "True", "Resolved", 10),
                condition("DestinationWritten", "True", "Projected", 20),
                condition("Ready", "True", "Projected", 20),
            ],
            ..ProjectionStatus::default()
        };
        let summary = of_projection(Some(&ready));
        assert_eq!((summary.written, summary.failed), (1, 0));
        assert_eq!(summary.reason, "Projected");
        assert_eq!(summary.last_change.as_deref(), Some("1970-01-01T00:00:20Z"));
        assert!(!summary.needs_attention() && !summary.suspended);

        let conflict = ProjectionStatus {
            conditions: vec![
                condition("DestinationWritten", "False", "DestinationConflict", 30),
                condition("Ready", "False", "DestinationConflict", 30),
                condition("Suspended", "True", "Suspended", 40),
            ],
            ..ProjectionStatus::default()
        };
        let summary = of_projection(Some(&conflict));
        assert_eq!((summary.written, summary.failed), (0, 1));
        assert!(summary.needs_attention() && summary.suspended);
        assert_eq!(summary.message, "DestinationConflict message");

        let none = of_projection(None);
        assert_eq!(
            (none.ready.as_str(), none.message.as_str()),
            ("Unknown", NO_STATUS)
        );
        assert!(none.needs_attention());
    }

    #[test]
    fn a_cluster_projection_counts_its_namespaces() {
        let status = ClusterProjectionStatus {
            conditions: vec![condition("Ready", "False", "DestinationConflict", 5)],
            namespaces_written: 3,
            namespaces_failed: 1,
            failed_namespaces: vec![NamespaceFailure {
                namespace: "b".into(),
                reason: "DestinationConflict".into(),
                message: "not ours".into(),
            }],
            ..ClusterProjectionStatus::default()
        };
        let summary = of_cluster(Some(&status));
        assert_eq!((summary.written, summary.failed), (3, 1));
        assert_eq!(summary.failures.len(), 1);
    }
}
