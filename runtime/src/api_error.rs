//! Client errors as a person should read them in a log line, a condition or an event. kube's own
//! `Display` of an error answered by the apiserver appends the `Debug` dump of the whole `Status`;
//! these give the apiserver's message alone.

use kube::{core::Status, runtime::watcher};

/// For an error answered by the apiserver, its own message (`configmaps "x" is forbidden: User
/// "..." cannot get resource ...`); any other error as it displays itself.
pub fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => describe_status(status),
        other => other.to_string(),
    }
}

/// The message of an apiserver `Status`, or its reason and code when it carries no message.
pub fn describe_status(status: &Status) -> String {
    let message = status.message.trim();
    let reason = status.reason.trim();
    match (message.is_empty(), reason.is_empty()) {
        (false, _) => message.to_owned(),
        (true, false) => format!("{reason} (HTTP {})", status.code),
        (true, true) => format!("the apiserver answered HTTP {}", status.code),
    }
}

/// A watcher's error, with the apiserver's message in place of the `Status` dump.
pub fn describe_watch_error(error: &watcher::Error) -> String {
    match error {
        watcher::Error::InitialListFailed(e) => {
            format!("failed to perform initial object list: {}", describe(e))
        }
        watcher::Error::WatchStartFailed(e) => format!("failed to start watching object: {}", describe(e)),
        watcher::Error::WatchFailed(e) => format!("watch stream failed: {}", describe(e)),
        watcher::Error::WatchError(s) => {
            format!("error returned by apiserver during watch: {}", describe_status(s))
        }
        other => other.to_string(),
    }
}

/// Whether the apiserver refused a write because its namespace is being deleted (the namespace
/// lifecycle admission's `NamespaceTerminating` cause): expected while a namespace goes away.
pub fn is_namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The apiserver's answer to a create in a Terminating namespace, as it sends it.
    fn terminating() -> kube::Error {
        let status: Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "events.events.k8s.io \"p.1\" is forbidden: unable to create new content in namespace t because it is being terminated",
            "reason": "Forbidden",
            "details": {"name": "p.1", "group": "events.k8s.io", "kind": "events",
                "causes": [{"reason": "NamespaceTerminating", "message": "namespace t is being terminated", "field": "metadata.namespace"}]},
            "code": 403
        }))
        .expect("a Status");
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn an_apiserver_error_reads_as_its_message_without_the_status_dump() {
        let error = terminating();
        assert!(
            error.to_string().contains("Status {"),
            "kube's own Display: {error}"
        );
        assert_eq!(
            describe(&error),
            "events.events.k8s.io \"p.1\" is forbidden: unable to create new content in namespace t because it is being terminated"
        );
        let watch = watcher::Error::WatchFailed(terminating());
        assert!(!describe_watch_error(&watch).contains("Status {"));
        assert!(describe_watch_error(&watch).starts_with("watch stream failed: events.events.k8s.io"));
    }

    #[test]
    fn a_terminating_namespace_is_told_from_other_refusals() {
        assert!(is_namespace_terminating(&terminating()));
        let forbidden = Status::failure("configmaps \"x\" is forbidden", "Forbidden").with_code(403);
        assert!(!is_namespace_terminating(&kube::Error::Api(forbidden.boxed())));
        assert!(!is_namespace_terminating(
            &kube::Error::LinesCodecMaxLineLengthExceeded
        ));
    }
}
