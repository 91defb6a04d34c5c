//! `kubectl projection status`: one line per CR from its status: its outcome, copies written and
//! failed, whether it is suspended, and when its conditions last changed.

use crate::{
    api::{
        crd::{Condition, CopyStatus, NamespaceCounts, NamespaceFailure},
        kind::{CrView, Scope},
    },
    pass::{
        lifecycle::is_suspended,
        status::{DESTINATION_WRITTEN, READY},
    },
};
use serde::Serialize;

/// The status of one CR, summed up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `Ready`'s status: `True`, `False`, or `Unknown` (also before any status); `Suspended` for a
    /// CR suspended before the controller ever reconciled it (no `Ready` yet, and none will come
    /// until it is resumed: `Unknown` would read as a controller that is not running).
    pub ready: String,
    /// `Ready`'s reason, e.g. `Projected` or `DestinationConflict` (empty before any status).
    pub reason: String,
    /// `Ready`'s message, or what the absence of a status means.
    pub message: String,
    /// Whether the CR is suspended: `spec.suspend`, what its user chose, seen at once (the
    /// `Suspended` condition follows once the controller has handled it).
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

/// `ready` of a CR suspended before its first reconcile.
pub const SUSPENDED_READY: &str = "Suspended";

/// What a CR suspended before its first reconcile is waiting for.
pub const SUSPENDED_NO_STATUS: &str =
    "suspended before the controller reconciled it: no copy is written until spec.suspend is false";

impl Summary {
    /// Whether a person should look at the CR: not `Ready`, unless it is suspended. Suspension is a
    /// state its user chose (its copies held as they are, on purpose), not a failure to report.
    pub fn needs_attention(&self) -> bool {
        !self.suspended && self.ready != "True"
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.r#type == type_)
}

fn summarize(
    suspend: Option<bool>,
    conditions: &[Condition],
    counts: (i32, i32),
    failures: Vec<NamespaceFailure>,
) -> Summary {
    let ready = find(conditions, READY);
    // A status written before `spec.suspend` was read still says Suspended until the next pass.
    let suspended = is_suspended(suspend);
    let (no_ready, no_message) = if suspended {
        (SUSPENDED_READY, SUSPENDED_NO_STATUS)
    } else {
        ("Unknown", NO_STATUS)
    };
    Summary {
        ready: ready.map_or(no_ready, |c| c.status.as_str()).to_owned(),
        reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        message: ready.map_or_else(|| no_message.to_owned(), |c| c.message.clone()),
        suspended,
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

/// The summary of a CR from its `spec.suspend` and its status.
pub fn of_cr(cr: &CrView<'_>) -> Summary {
    of_parts(cr.scope, cr.controls.suspend, cr.status, cr.counts)
}

/// The summary from `spec.suspend`, the status both kinds report (`None` before the first pass)
/// and a ClusterProjection's counts: a Projection's are its one copy, read from its conditions.
fn of_parts(
    scope: Scope,
    suspend: Option<bool>,
    status: Option<&CopyStatus>,
    counts: Option<&NamespaceCounts>,
) -> Summary {
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let (counted, failures) = match scope {
        Scope::OwnNamespace => {
            let written = find(conditions, DESTINATION_WRITTEN);
            let counted = (
                i32::from(written.is_some_and(|c| c.status == "True")),
                i32::from(written.is_some_and(|c| c.status == "False")),
            );
            (counted, Vec::new())
        }
        Scope::Namespaces => (
            counts.map_or((0, 0), |c| (c.namespaces_written, c.namespaces_failed)),
            counts.map(|c| c.failed_namespaces.clone()).unwrap_or_default(),
        ),
    };
    summarize(suspend, conditions, counted, failures)
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
        let ready = CopyStatus {
            conditions: vec![
                condition("SourceResolved", "True", "Resolved", 10),
                condition("DestinationWritten", "True", "Projected", 20),
                condition("Ready", "True", "Projected", 20),
            ],
            ..CopyStatus::default()
        };
        let summary = of_parts(Scope::OwnNamespace, None, Some(&ready), None);
        assert_eq!((summary.written, summary.failed), (1, 0));
        assert_eq!(summary.reason, "Projected");
        assert_eq!(summary.last_change.as_deref(), Some("1970-01-01T00:00:20Z"));
        assert!(!summary.needs_attention() && !summary.suspended);

        let conflict = CopyStatus {
            conditions: vec![
                condition("DestinationWritten", "False", "DestinationConflict", 30),
                condition("Ready", "False", "DestinationConflict", 30),
                condition("Suspended", "True", "Suspended", 40),
            ],
            ..CopyStatus::default()
        };
        let summary = of_parts(Scope::OwnNamespace, None, Some(&conflict), None);
        assert_eq!((summary.written, summary.failed), (0, 1));
        assert_eq!(summary.message, "DestinationConflict message");
        // Resumed: the last pass's conflict needs a person again, although the controller has not
        // yet cleared its Suspended condition.
        assert!(summary.needs_attention() && !summary.suspended);
        // Suspended: the user holds it on purpose.
        let summary = of_parts(Scope::OwnNamespace, Some(true), Some(&conflict), None);
        assert!(!summary.needs_attention() && summary.suspended);
        assert_eq!(summary.ready, "False");

        let none = of_parts(Scope::OwnNamespace, None, None, None);
        assert_eq!(
            (none.ready.as_str(), none.message.as_str()),
            ("Unknown", NO_STATUS)
        );
        assert!(none.needs_attention());
        // Suspended before any pass: says so, and is no failure.
        let held = of_parts(Scope::OwnNamespace, Some(true), None, None);
        assert_eq!(
            (held.ready.as_str(), held.reason.as_str(), held.message.as_str()),
            (SUSPENDED_READY, "", SUSPENDED_NO_STATUS)
        );
        assert!(held.suspended && !held.needs_attention());
        assert!(of_parts(Scope::OwnNamespace, Some(false), None, None).needs_attention());
    }

    #[test]
    fn a_cluster_projection_counts_its_namespaces() {
        let status = CopyStatus {
            conditions: vec![condition("Ready", "False", "DestinationConflict", 5)],
            ..CopyStatus::default()
        };
        let counts = NamespaceCounts {
            namespaces_written: 3,
            namespaces_failed: 1,
            failed_namespaces: vec![NamespaceFailure {
                namespace: "b".into(),
                reason: "DestinationConflict".into(),
                message: "not ours".into(),
            }],
        };
        let summary = of_parts(Scope::Namespaces, None, Some(&status), Some(&counts));
        assert_eq!((summary.written, summary.failed), (3, 1));
        assert_eq!(summary.failures.len(), 1);
        assert!(summary.needs_attention());
        let held = of_parts(Scope::Namespaces, Some(true), None, None);
        assert_eq!((held.ready.as_str(), held.suspended), (SUSPENDED_READY, true));
        assert!(!held.needs_attention());
    }
}
