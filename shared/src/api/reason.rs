//! Every reason the controller reports, as a type: on conditions, on events, in
//! `status.failedNamespaces`. Each reason carries its wire string (byte-identical to the Go
//! operator's, which users and alerts match on), the action verb of its event, how a failure with it
//! is retried, and the `result` label it counts under. Code compares reasons, never strings.

use std::fmt;

/// Declares a unit enum whose wire string is the variant's name, with `ALL` listing every variant.
macro_rules! named_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$doc])* $variant,)+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[Self] = &[$(Self::$variant,)+];

            /// The string on the wire (the variant's name).
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => stringify!($variant),)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// A reason of a condition, an event or a failed namespace.
    pub enum Reason {
        /// `SourceResolved=True`: the source is usable.
        Resolved,
        /// `DestinationWritten`/`Ready=True`; the event of a created copy.
        Projected,
        /// Event: a copy was patched to match its source.
        Updated,
        /// Event: an update was refused as immutable, so the copy was deleted and created again.
        DestinationRecreated,
        /// Event: a copy was deleted.
        DestinationDeleted,
        /// Event: a copy no longer carries our ownership annotation, so it was kept.
        DestinationLeftAlone,
        /// The kind is unknown or cluster-scoped, or discovery failed.
        SourceResolutionFailed,
        /// The controller may not list, watch or get the source (HTTP 403).
        SourceForbidden,
        /// Reading the source failed otherwise, or its watch did not sync.
        SourceFetchFailed,
        /// The source does not exist and nothing was ever projected.
        SourceNotFound,
        /// The source does not exist any more (its copies are deleted).
        SourceDeleted,
        /// The source vetoes projection (`projection.sh/projectable: "false"`).
        SourceOptedOut,
        /// Allowlist mode and the source does not opt in.
        SourceNotProjectable,
        /// `DestinationWritten=Unknown` while the source fails.
        SourceNotResolved,
        /// Something the CR does not own is at a copy's coordinates, or the copy would be the source.
        DestinationConflict,
        /// Reading a copy failed.
        DestinationFetchFailed,
        /// Creating a copy failed.
        DestinationCreateFailed,
        /// Patching (or recreating) a copy failed.
        DestinationUpdateFailed,
        /// A copy no longer wanted could not be removed yet.
        DestinationDeleteFailed,
        /// Namespaces of a ClusterProjection failed with different reasons.
        DestinationWriteFailed,
        /// A ClusterProjection's destination has no usable target rule.
        TargetResolutionFailed,
        /// The spec's `keys` or `fields` cannot make a valid copy of this source (a Secret type's
        /// keys left out, two keys under one name, none of the selected keys): nothing is written.
        DestinationInvalid,
        /// `Suspended=True`: `spec.suspend` holds every write and deletion of copies.
        Suspended,
        /// Event: a copy was left in place without our ownership keys (an `Orphan` policy).
        DestinationOrphaned,
        /// Event: an existing object whose owner consented (`projection.sh/adopt-by`) became a copy.
        DestinationAdopted,
        /// The CR's author may not create the kind in a destination namespace (a
        /// SubjectAccessReview for the author, `--author-access=enforce`): no copy there.
        DestinationForbidden,
        /// An update was refused as immutable for a kind that is not recreated (not a ConfigMap or
        /// Secret, not opted in with `--recreate-on-immutable`): the copy is left as it is.
        DestinationImmutable,
        /// The CR is being deleted but its copies cannot be removed (e.g. the controller may no
        /// longer read their kind): the finalizer holds it, and the message says how to release it.
        DeletionBlocked,
        /// The cluster of `spec.destination.kubeConfig` cannot be reached (a connection that fails
        /// or times out, watches that do not sync): retried with backoff, this CR only.
        DestinationClusterUnreachable,
        /// The CR's author may not read the kubeconfig Secret, or the cluster it names refused its
        /// credentials (HTTP 401 or 403): retried with backoff.
        DestinationClusterForbidden,
        /// The kubeconfig Secret is missing, lacks the key, holds a kubeconfig the controller
        /// refuses (one that runs a program, names a file, or has no inline credentials), or now
        /// reaches another apiserver than the one the CR's copies were written to.
        DestinationClusterInvalid,
        /// Event (`--shard-by-lease`): another controller replica reconciles the CR now, the ring
        /// of live members having moved it there (a replica joined, left or died).
        OwnerChanged,
    }
}

named_enum! {
    /// The `action` of an `events.k8s.io/v1` event: what the controller was doing.
    pub enum Verb {
        /// Creating a copy.
        Create,
        /// Updating a copy.
        Update,
        /// Deleting a copy.
        Delete,
        /// Reading an object.
        Get,
        /// Checking a spec or a source against a rule.
        Validate,
        /// Resolving the source's kind.
        Resolve,
        /// Taking up a CR's reconciles (a replica that took it over from another).
        Reconcile,
    }
}

/// The `result` label of `projection_reconcile_total`: the category of a reconcile's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultCategory {
    /// Everything is in place.
    Success,
    /// `DestinationConflict`.
    Conflict,
    /// Any other destination or target failure.
    DestinationError,
    /// Any source failure.
    SourceError,
}

impl ResultCategory {
    /// Every value.
    pub const ALL: &[Self] = &[
        Self::Success,
        Self::Conflict,
        Self::DestinationError,
        Self::SourceError,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Conflict => "conflict",
            Self::DestinationError => "destination_error",
            Self::SourceError => "source_error",
        }
    }
}

/// How a failed reconcile is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Only a watch event can change the outcome (source created, stranger gone, CRD installed, spec
    /// edited): no timer.
    OnChange,
    /// A transient failure: retry with capped exponential backoff.
    Backoff,
}

/// What a CR ending with a reason tells GitOps tools (kstatus, as Flux's health checks and Helm 4's
/// `--wait` read it): done, still being worked on, or stuck until a person changes something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing left to do: no `Reconciling` or `Stalled` condition.
    Settled,
    /// `Reconciling=True`: retried, or waiting for something that may still come (a source not
    /// created yet, a kind not served yet, an apiserver or another cluster that failed to answer).
    Reconciling,
    /// `Stalled=True`: no retry can help until a person changes the spec, the source, a stranger's
    /// object or the RBAC (a refusal, a conflict, a spec that cannot make a valid copy).
    Stalled,
}

/// Whose move it is when a CR is not ready for a reason: the `cause` label of
/// `projection_resource_info`, so alerts reach the namespace's owner or the platform team.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Ready, or not a failure.
    None,
    /// The CR's or the source's owner: a missing or vetoed source, a conflict in their
    /// namespace, a spec that cannot work, an author's or a kubeconfig's missing rights.
    Tenant,
    /// The platform: the apiserver, discovery, another cluster not answering, a copy that cannot
    /// be written or removed for a reason of the cluster's.
    Platform,
}

impl Cause {
    /// The label value (`""`, `tenant`, `platform`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Tenant => "tenant",
            Self::Platform => "platform",
        }
    }
}

impl Reason {
    /// The action verb of this reason's event, `None` for a reason that appears on conditions only.
    pub fn verb(self) -> Option<Verb> {
        use Reason::*;
        Some(match self {
            Projected => Verb::Create,
            Updated | DestinationRecreated | DestinationOrphaned | DestinationAdopted => Verb::Update,
            DestinationDeleted | DestinationLeftAlone => Verb::Delete,
            SourceResolutionFailed => Verb::Resolve,
            SourceForbidden | SourceFetchFailed | SourceNotFound | SourceDeleted => Verb::Get,
            SourceOptedOut
            | SourceNotProjectable
            | DestinationConflict
            | TargetResolutionFailed
            | DestinationInvalid => Verb::Validate,
            DestinationFetchFailed | DestinationClusterUnreachable | DestinationClusterForbidden => Verb::Get,
            DestinationClusterInvalid => Verb::Validate,
            DestinationCreateFailed | DestinationForbidden => Verb::Create,
            DestinationUpdateFailed | DestinationImmutable => Verb::Update,
            DeletionBlocked => Verb::Delete,
            OwnerChanged => Verb::Reconcile,
            Resolved | SourceNotResolved | DestinationDeleteFailed | DestinationWriteFailed | Suspended => {
                return None;
            }
        })
    }

    /// Whether this reason's event is a Warning (a failure) rather than Normal.
    pub fn is_warning(self) -> bool {
        self.category() != ResultCategory::Success
    }

    /// How a reconcile that failed with this reason is retried when its own cause is all there is:
    /// a failed API call or copies left to remove always back off (see [`retry_after`]).
    pub fn retry(self) -> Retry {
        use Reason::*;
        match self {
            // Only a change of the source, the spec, a CRD or a stranger's object can help.
            SourceResolutionFailed
            | SourceNotFound
            | SourceDeleted
            | SourceOptedOut
            | SourceNotProjectable
            | DestinationConflict
            | TargetResolutionFailed
            | DestinationInvalid
            // A person must delete the copy or opt the kind in (a flag: a restart, which reconciles
            // everything), or the source or spec must change back.
            | DestinationImmutable => Retry::OnChange,
            // The apiserver may answer otherwise next time (or an admin widens the RBAC).
            SourceForbidden
            | SourceFetchFailed
            | DestinationFetchFailed
            | DestinationCreateFailed
            | DestinationUpdateFailed
            | DestinationDeleteFailed
            | DestinationWriteFailed
            | DestinationForbidden
            // Access given back to the controller is noticed by no watch: retry until it is.
            | DeletionBlocked
            // Another cluster coming back, or its Secret written or rotated, is noticed by no
            // watch either (the controller watches no Secret it was not pointed to).
            | DestinationClusterUnreachable
            | DestinationClusterForbidden
            | DestinationClusterInvalid => Retry::Backoff,
            // Not failures: nothing to retry until something changes.
            Resolved | Projected | Updated | DestinationRecreated | DestinationDeleted
            | DestinationLeftAlone | SourceNotResolved | Suspended | DestinationOrphaned
            | DestinationAdopted | OwnerChanged => Retry::OnChange,
        }
    }

    /// What a CR whose `Ready` condition carries this reason tells GitOps tools. A refusal is
    /// `Stalled` even where the controller keeps retrying it (an author's access, another
    /// cluster's credentials): the retry only notices a fix that no watch reports, and a tool
    /// waiting for the CR should fail now with the reason rather than at its timeout.
    pub fn progress(self) -> Progress {
        use Reason::*;
        match self {
            Resolved | Projected | Updated | DestinationRecreated | DestinationDeleted
            | DestinationLeftAlone | Suspended | DestinationOrphaned | DestinationAdopted | OwnerChanged => {
                Progress::Settled
            }
            // May still come: the source, its kind, an answer.
            SourceNotFound
            | SourceDeleted
            | SourceResolutionFailed
            | SourceNotResolved
            | SourceFetchFailed
            | DestinationFetchFailed
            | DestinationCreateFailed
            | DestinationUpdateFailed
            | DestinationDeleteFailed
            | DestinationWriteFailed
            | DeletionBlocked
            | DestinationClusterUnreachable => Progress::Reconciling,
            // A person must act.
            SourceForbidden
            | SourceOptedOut
            | SourceNotProjectable
            | DestinationConflict
            | TargetResolutionFailed
            | DestinationInvalid
            | DestinationForbidden
            | DestinationImmutable
            | DestinationClusterForbidden
            | DestinationClusterInvalid => Progress::Stalled,
        }
    }

    /// Whose move it is when `Ready` carries this reason. `SourceForbidden` is the tenant's even
    /// when the controller's own RBAC refuses the kind: the platform chose not to serve it, and the
    /// CR's owner is who must ask or change it.
    pub fn cause(self) -> Cause {
        match self.progress() {
            Progress::Settled => Cause::None,
            // A person must act: a refusal, a conflict, a spec that cannot work.
            Progress::Stalled => Cause::Tenant,
            // A source not there, yet or any more, is its owner's to create.
            Progress::Reconciling if matches!(self, Reason::SourceNotFound | Reason::SourceDeleted) => {
                Cause::Tenant
            }
            Progress::Reconciling => Cause::Platform,
        }
    }

    /// The `result` label a reconcile ending with this reason counts under.
    pub fn category(self) -> ResultCategory {
        use Reason::*;
        match self {
            Resolved | Projected | Updated | DestinationRecreated | DestinationDeleted
            | DestinationLeftAlone | Suspended | DestinationOrphaned | DestinationAdopted | OwnerChanged => {
                ResultCategory::Success
            }
            DestinationConflict => ResultCategory::Conflict,
            DestinationFetchFailed
            | DestinationCreateFailed
            | DestinationUpdateFailed
            | DestinationDeleteFailed
            | DestinationWriteFailed
            | TargetResolutionFailed
            | DestinationInvalid
            | DestinationForbidden
            | DestinationImmutable
            | DeletionBlocked
            | DestinationClusterUnreachable
            | DestinationClusterForbidden
            | DestinationClusterInvalid => ResultCategory::DestinationError,
            SourceResolutionFailed
            | SourceForbidden
            | SourceFetchFailed
            | SourceNotFound
            | SourceDeleted
            | SourceOptedOut
            | SourceNotProjectable
            | SourceNotResolved => ResultCategory::SourceError,
        }
    }

    /// What this failure of a call to another cluster (`spec.destination.kubeConfig`) is reported
    /// as, by the HTTP status it answered (`None`: no answer, a connection that failed or timed
    /// out): the cluster not answering, or refusing the kubeconfig's credentials, is the
    /// cluster's reason, not the copy's.
    pub fn in_other_cluster(self, answered: Option<u16>) -> Self {
        match answered {
            None => Self::DestinationClusterUnreachable,
            Some(401 | 403) => Self::DestinationClusterForbidden,
            Some(_) => self,
        }
    }

    /// The reason named by a wire string, if it is one of ours.
    pub fn parse(wire: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == wire)
    }
}

/// How a failure is retried: by its reason, unless the failure came from an API call that failed
/// (`transient`) or left copies to remove (`cleaned` false), which always back off.
pub fn retry_after(reason: Reason, transient: bool, cleaned: bool) -> Retry {
    if transient || !cleaned {
        Retry::Backoff
    } else {
        reason.retry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_strings_are_the_go_operators() {
        let wire: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            wire,
            [
                "Resolved",
                "Projected",
                "Updated",
                "DestinationRecreated",
                "DestinationDeleted",
                "DestinationLeftAlone",
                "SourceResolutionFailed",
                "SourceForbidden",
                "SourceFetchFailed",
                "SourceNotFound",
                "SourceDeleted",
                "SourceOptedOut",
                "SourceNotProjectable",
                "SourceNotResolved",
                "DestinationConflict",
                "DestinationFetchFailed",
                "DestinationCreateFailed",
                "DestinationUpdateFailed",
                "DestinationDeleteFailed",
                "DestinationWriteFailed",
                "TargetResolutionFailed",
                "DestinationInvalid",
                "Suspended",
                "DestinationOrphaned",
                "DestinationAdopted",
                "DestinationForbidden",
                "DestinationImmutable",
                "DeletionBlocked",
                "DestinationClusterUnreachable",
                "DestinationClusterForbidden",
                "DestinationClusterInvalid",
                "OwnerChanged",
            ]
        );
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
            assert_eq!(reason.to_string(), reason.as_str());
        }
        assert_eq!(Reason::parse("Nope"), None);
        let verbs: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(
            verbs,
            [
                "Create",
                "Update",
                "Delete",
                "Get",
                "Validate",
                "Resolve",
                "Reconcile"
            ]
        );
        let results: Vec<&str> = ResultCategory::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            results,
            ["success", "conflict", "destination_error", "source_error"]
        );
    }

    #[test]
    fn a_failed_call_to_another_cluster_is_the_clusters_unless_it_answered_otherwise() {
        use Reason::*;
        let table = [
            (DestinationUpdateFailed, None, DestinationClusterUnreachable),
            (DestinationCreateFailed, Some(401), DestinationClusterForbidden),
            (DestinationFetchFailed, Some(403), DestinationClusterForbidden),
            (DestinationUpdateFailed, Some(422), DestinationUpdateFailed),
            (DestinationCreateFailed, Some(500), DestinationCreateFailed),
        ];
        for (reason, answered, expected) in table {
            assert_eq!(
                reason.in_other_cluster(answered),
                expected,
                "{reason} {answered:?}"
            );
        }
    }

    #[test]
    fn each_reason_has_its_verb_type_retry_and_category() {
        use Reason::*;
        // (reason, event verb, warning, retry, result label)
        let table = [
            (Resolved, None, false, Retry::OnChange, "success"),
            (Projected, Some(Verb::Create), false, Retry::OnChange, "success"),
            (Updated, Some(Verb::Update), false, Retry::OnChange, "success"),
            (
                DestinationRecreated,
                Some(Verb::Update),
                false,
                Retry::OnChange,
                "success",
            ),
            (
                DestinationDeleted,
                Some(Verb::Delete),
                false,
                Retry::OnChange,
                "success",
            ),
            (
                DestinationLeftAlone,
                Some(Verb::Delete),
                false,
                Retry::OnChange,
                "success",
            ),
            (
                SourceResolutionFailed,
                Some(Verb::Resolve),
                true,
                Retry::OnChange,
                "source_error",
            ),
            (
                SourceForbidden,
                Some(Verb::Get),
                true,
                Retry::Backoff,
                "source_error",
            ),
            (
                SourceFetchFailed,
                Some(Verb::Get),
                true,
                Retry::Backoff,
                "source_error",
            ),
            (
                SourceNotFound,
                Some(Verb::Get),
                true,
                Retry::OnChange,
                "source_error",
            ),
            (
                SourceDeleted,
                Some(Verb::Get),
                true,
                Retry::OnChange,
                "source_error",
            ),
            (
                SourceOptedOut,
                Some(Verb::Validate),
                true,
                Retry::OnChange,
                "source_error",
            ),
            (
                SourceNotProjectable,
                Some(Verb::Validate),
                true,
                Retry::OnChange,
                "source_error",
            ),
            (SourceNotResolved, None, true, Retry::OnChange, "source_error"),
            (
                DestinationConflict,
                Some(Verb::Validate),
                true,
                Retry::OnChange,
                "conflict",
            ),
            (
                DestinationFetchFailed,
                Some(Verb::Get),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationCreateFailed,
                Some(Verb::Create),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationUpdateFailed,
                Some(Verb::Update),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationDeleteFailed,
                None,
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationWriteFailed,
                None,
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                TargetResolutionFailed,
                Some(Verb::Validate),
                true,
                Retry::OnChange,
                "destination_error",
            ),
            (
                DestinationInvalid,
                Some(Verb::Validate),
                true,
                Retry::OnChange,
                "destination_error",
            ),
            (Suspended, None, false, Retry::OnChange, "success"),
            (
                DestinationOrphaned,
                Some(Verb::Update),
                false,
                Retry::OnChange,
                "success",
            ),
            (
                DestinationAdopted,
                Some(Verb::Update),
                false,
                Retry::OnChange,
                "success",
            ),
            (
                DestinationForbidden,
                Some(Verb::Create),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationImmutable,
                Some(Verb::Update),
                true,
                Retry::OnChange,
                "destination_error",
            ),
            (
                DeletionBlocked,
                Some(Verb::Delete),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationClusterUnreachable,
                Some(Verb::Get),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationClusterForbidden,
                Some(Verb::Get),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                DestinationClusterInvalid,
                Some(Verb::Validate),
                true,
                Retry::Backoff,
                "destination_error",
            ),
            (
                OwnerChanged,
                Some(Verb::Reconcile),
                false,
                Retry::OnChange,
                "success",
            ),
        ];
        assert_eq!(table.len(), Reason::ALL.len(), "every reason is in the table");
        for (reason, verb, warning, retry, result) in table {
            assert_eq!(reason.verb(), verb, "{reason}");
            assert_eq!(reason.is_warning(), warning, "{reason}");
            assert_eq!(reason.retry(), retry, "{reason}");
            assert_eq!(reason.category().as_str(), result, "{reason}");
        }
    }

    #[test]
    fn gitops_tools_are_told_settled_reconciling_or_stalled() {
        use Reason::*;
        let reconciling = [
            SourceNotFound,
            SourceDeleted,
            SourceResolutionFailed,
            SourceNotResolved,
            SourceFetchFailed,
            DestinationFetchFailed,
            DestinationCreateFailed,
            DestinationUpdateFailed,
            DestinationDeleteFailed,
            DestinationWriteFailed,
            DeletionBlocked,
            DestinationClusterUnreachable,
        ];
        let stalled = [
            SourceForbidden,
            SourceOptedOut,
            SourceNotProjectable,
            DestinationConflict,
            TargetResolutionFailed,
            DestinationInvalid,
            DestinationForbidden,
            DestinationImmutable,
            DestinationClusterForbidden,
            DestinationClusterInvalid,
        ];
        for reason in Reason::ALL {
            let expected = if reconciling.contains(reason) {
                Progress::Reconciling
            } else if stalled.contains(reason) {
                Progress::Stalled
            } else {
                Progress::Settled
            };
            assert_eq!(reason.progress(), expected, "{reason}");
            // Only failures are unsettled, and every failure is.
            assert_eq!(
                expected == Progress::Settled,
                reason.category() == ResultCategory::Success,
                "{reason}"
            );
        }
    }

    #[test]
    fn every_failure_is_the_tenants_or_the_platforms() {
        use Reason::*;
        for reason in Reason::ALL {
            assert_eq!(
                reason.cause() == Cause::None,
                reason.category() == ResultCategory::Success,
                "{reason}"
            );
        }
        for (reason, cause) in [
            (SourceNotFound, "tenant"),
            (DestinationConflict, "tenant"),
            (DestinationForbidden, "tenant"),
            (DestinationClusterInvalid, "tenant"),
            (SourceFetchFailed, "platform"),
            (DestinationClusterUnreachable, "platform"),
            (DeletionBlocked, "platform"),
            (Projected, ""),
        ] {
            assert_eq!(reason.cause().as_str(), cause, "{reason}");
        }
    }

    #[test]
    fn api_failures_and_leftover_copies_back_off() {
        use Reason::*;
        // (reason, transient, cleaned, retry)
        for (reason, transient, cleaned, retry) in [
            (SourceResolutionFailed, false, true, Retry::OnChange),
            (SourceResolutionFailed, true, true, Retry::Backoff),
            (SourceDeleted, false, true, Retry::OnChange),
            (SourceDeleted, false, false, Retry::Backoff),
            (DestinationConflict, false, true, Retry::OnChange),
            (DestinationConflict, false, false, Retry::Backoff),
            (SourceFetchFailed, false, true, Retry::Backoff),
        ] {
            assert_eq!(
                retry_after(reason, transient, cleaned),
                retry,
                "{reason} {transient} {cleaned}"
            );
        }
    }
}
