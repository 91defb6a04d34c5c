//! The controller's errors. Each has a fixed category, used as a metric label and in logs.

use kube::{api::ApiResource, runtime::finalizer};
use shared::api::reason::Reason;
use thiserror::Error;

/// What can make a reconcile fail (and be retried with backoff).
#[derive(Debug, Error)]
pub enum Error {
    /// A call to the apiserver failed.
    #[error("{action}: {}", describe(source))]
    Api {
        /// What was being done, e.g. `patching status`.
        action: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer helper failed (adding, removing, or the cleanup it ran).
    #[error("{}", describe_finalizer(.0))]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    /// The CR as the store keeps it (`crate::cache::stored_cr`) did not decode back: a bug of ours, as
    /// the store encoded it; retried with backoff, in case a later watch event replaces it.
    #[error("decoding the cached CR: {0}")]
    Cache(#[source] serde_json::Error),
    /// The reconcile ended with a handled failure that is already in status; retry with backoff.
    #[error("{reason}: {message}")]
    Retry {
        /// The condition reason.
        reason: Reason,
        /// The condition message.
        message: String,
    },
}

impl Error {
    /// A bounded label for metrics: `handled`, `api` or `finalizer`. An error of the apply or
    /// cleanup that the finalizer helper ran is counted under its own category; `finalizer` is left
    /// for the helper's own failures (adding or removing the finalizer).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Api { .. } => "api",
            Self::Finalizer(wrapped) => match wrapped.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.category()
                }
                _ => "finalizer",
            },
            Self::Retry { .. } => "handled",
            Self::Cache(_) => "cache",
        }
    }
}

/// A finalizer helper error: the apply or cleanup error it wraps as that error displays itself,
/// a failed finalizer patch with the apiserver's message.
fn describe_finalizer(error: &finalizer::Error<Error>) -> String {
    match error {
        finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => inner.to_string(),
        finalizer::Error::AddFinalizer(e) => format!("adding the finalizer: {}", describe(e)),
        finalizer::Error::RemoveFinalizer(e) => format!("removing the finalizer: {}", describe(e)),
        other => format!("finalizer: {other}"),
    }
}

/// The whole message of the apiserver's answer to a JSON patch whose `test` operation failed (422,
/// reason `Invalid`, no causes): what it says for nothing else it refuses with 422, whose messages
/// name the object and the field.
const PATCH_TEST_FAILED: &str = "the server rejected our request due to an error in our request";

/// Whether the finalizer helper's adding patch failed its `test`: the CR as cached lacked a
/// finalizer the server's copy already has (typically the one this replica's previous pass added,
/// whose watch event had not arrived when the CR was queued again). The cache is behind, nothing
/// failed: the event on its way runs the pass anew. Any other refusal (an admission policy, a CR
/// being deleted) names the object and stays an error.
pub fn cache_was_behind(error: &finalizer::Error<Error>) -> bool {
    match error {
        finalizer::Error::AddFinalizer(kube::Error::Api(status)) => {
            status.code == 422
                && status.message == PATCH_TEST_FAILED
                && status.details.as_ref().is_none_or(|d| d.causes.is_empty())
        }
        _ => false,
    }
}

/// Shorthand for a failed API call.
pub fn api_error(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { action, source }
}

/// Client errors as a person should read them in a condition, an event or a log line.
pub use runtime::api_error::{describe, describe_status};

/// Why a copy could not be removed, as `DeletionBlocked` and the logs say it. A conflict (409: the
/// copy changed between our read and our delete, twice in a row) reads the same however often it
/// happens: the apiserver's words carry both resourceVersions, and a message that changes with
/// every pass would make a new event and a status write each time another writer touches the copy.
pub fn describe_removal(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(s) if s.code == 409 => {
            "it kept changing while being deleted (another writer; 409 Conflict twice in a row)".to_owned()
        }
        other => describe(other),
    }
}

/// How a person names a resource type: `<plural>.<group>`, or `<plural>` for the core group.
pub fn resource_name(resource: &ApiResource) -> String {
    if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}

/// The message of `SourceForbidden`: the controller may not `verbs` the source's kind (or, with
/// `object`, that object), because its RBAC does not cover the kind; `refusal` is the apiserver's
/// message.
pub fn forbidden_message(verbs: &str, resource: &ApiResource, object: Option<&str>, refusal: &str) -> String {
    let kind = resource_name(resource);
    let what = match object {
        Some(object) => format!("{verbs} {kind} {object}"),
        None => format!("{verbs} {kind} in all namespaces"),
    };
    format!(
        "the controller may not {what}: its RBAC does not cover {kind} (Helm value supportedKinds; a \
         cluster admin can add it); the apiserver said: {refusal}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> kube::core::Status {
        kube::core::Status::failure(
            r#"configmaps "x" is forbidden: User "system:serviceaccount:ns:sa" cannot get resource "configmaps" in API group "" in the namespace "y""#,
            "Forbidden",
        )
        .with_code(403)
    }

    /// The apiserver's answer to a failed JSON patch `test`, as kube-apiserver v1.36.3 sent it.
    fn patch_test_failed() -> kube::Error {
        kube::Error::Api(
            serde_json::from_str::<kube::core::Status>(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#,
            )
            .expect("a Status")
            .boxed(),
        )
    }

    #[test]
    fn a_finalizer_patch_whose_test_failed_means_the_cache_was_behind() {
        assert!(cache_was_behind(&finalizer::Error::AddFinalizer(
            patch_test_failed()
        )));
    }

    #[test]
    fn other_refusals_of_a_finalizer_patch_stay_errors() {
        // Removing: a stale index could name another finalizer; the retry with backoff reads anew.
        assert!(!cache_was_behind(&finalizer::Error::RemoveFinalizer(
            patch_test_failed()
        )));
        let invalid = |message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Invalid")
                    .with_code(422)
                    .boxed(),
            )
        };
        for refused in [
            invalid(
                r#"projections.projection.sh "p" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"#,
            ),
            invalid(
                r#"projections.projection.sh "p" is forbidden: ValidatingAdmissionPolicy 'no-finalizers' denied request"#,
            ),
            kube::Error::Api(forbidden().boxed()),
        ] {
            assert!(!cache_was_behind(&finalizer::Error::AddFinalizer(refused)));
        }
    }

    #[test]
    fn an_apiserver_error_reads_as_its_own_message() {
        let error = kube::Error::Api(forbidden().boxed());
        assert_eq!(
            describe(&error),
            r#"configmaps "x" is forbidden: User "system:serviceaccount:ns:sa" cannot get resource "configmaps" in API group "" in the namespace "y""#
        );
        assert!(!describe(&error).contains("Status {"));
        let wrapped = Error::Api {
            action: "writing status",
            source: error,
        };
        assert!(
            wrapped
                .to_string()
                .starts_with(r#"writing status: configmaps "x" is forbidden"#),
            "{wrapped}"
        );
        assert!(!wrapped.to_string().contains("Status {"), "{wrapped}");
    }

    #[test]
    fn a_status_without_message_names_reason_and_code() {
        let mut status = forbidden();
        status.message = String::new();
        assert_eq!(describe_status(&status), "Forbidden (HTTP 403)");
        status.reason = String::new();
        status.code = 500;
        assert_eq!(describe_status(&status), "the apiserver answered HTTP 500");
    }

    #[test]
    fn a_forbidden_kind_names_the_resource_and_the_chart_value() {
        let secrets = ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
        };
        let refusal = r#"secrets is forbidden: User "system:serviceaccount:p:c" cannot list resource "secrets" in API group "" at the cluster scope"#;
        assert_eq!(
            forbidden_message("list and watch", &secrets, None, refusal),
            format!(
                "the controller may not list and watch secrets in all namespaces: its RBAC does not \
                 cover secrets (Helm value supportedKinds; a cluster admin can add it); the apiserver \
                 said: {refusal}"
            )
        );
        let widgets = ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        let message = forbidden_message("get", &widgets, Some("platform/blue"), "denied");
        assert!(
            message.starts_with(
                "the controller may not get widgets.example.com platform/blue: its RBAC does not cover widgets.example.com"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_removal_conflict_reads_the_same_whatever_the_resource_versions() {
        let conflict = |rv: u32| {
            let message = format!(
                "Operation cannot be fulfilled on ConfigMap \"hot\": the ResourceVersion in the \
                 precondition ({rv}) does not match the ResourceVersion in record ({}). The object \
                 might have been modified",
                rv + 1
            );
            kube::Error::Api(
                kube::core::Status::failure(&message, "Conflict")
                    .with_code(409)
                    .boxed(),
            )
        };
        assert_eq!(
            describe_removal(&conflict(11291)),
            describe_removal(&conflict(11305))
        );
        assert!(describe_removal(&conflict(1)).contains("409 Conflict twice in a row"));
        let refused = kube::Error::Api(forbidden().boxed());
        assert_eq!(describe_removal(&refused), describe(&refused));
    }

    #[test]
    fn other_errors_display_themselves() {
        let error = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(describe(&error), error.to_string());
    }

    #[test]
    fn the_category_is_the_wrapped_error_s() {
        let handled = || Error::Retry {
            reason: Reason::SourceFetchFailed,
            message: "m".into(),
        };
        let api = || Error::Api {
            action: "writing status",
            source: kube::Error::Api(forbidden().boxed()),
        };
        let wrap = |e: finalizer::Error<Error>| Error::Finalizer(Box::new(e));
        assert_eq!(
            wrap(finalizer::Error::ApplyFailed(handled())).category(),
            "handled"
        );
        assert_eq!(
            wrap(finalizer::Error::CleanupFailed(handled())).category(),
            "handled"
        );
        assert_eq!(wrap(finalizer::Error::ApplyFailed(api())).category(), "api");
        assert_eq!(
            wrap(finalizer::Error::RemoveFinalizer(kube::Error::Api(
                forbidden().boxed()
            )))
            .category(),
            "finalizer"
        );
        assert_eq!(
            wrap(finalizer::Error::AddFinalizer(kube::Error::Api(
                forbidden().boxed()
            )))
            .category(),
            "finalizer"
        );
        assert_eq!(handled().category(), "handled");
        assert_eq!(api().category(), "api");

        // Logged without the debug dump of the apiserver's answer.
        let removal = wrap(finalizer::Error::RemoveFinalizer(kube::Error::Api(
            forbidden().boxed(),
        )));
        assert_eq!(
            removal.to_string(),
            format!("removing the finalizer: {}", forbidden().message)
        );
        assert_eq!(
            wrap(finalizer::Error::ApplyFailed(handled())).to_string(),
            "SourceFetchFailed: m"
        );
    }
}
