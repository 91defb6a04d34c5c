//! What a 404 on reading an object means. The apiserver answers 404 both for an object that does not
//! exist and for a resource type it does not serve (a CRD deleted, or not yet established, while
//! discovery still listed it). Only the first says anything about the object: withdrawing copies on
//! the second would delete them because a kind blinked.

use kube::core::Status;

/// What a 404 is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotFound {
    /// The object does not exist: the answer names it (`details.name`, reason `NotFound`).
    Object,
    /// The resource type is not served ("the server could not find the requested resource", no
    /// `details.name`; or, for a group that is gone with its CRD, a plain-text `404 page not found`
    /// that is no Status at all): nothing is known about the object.
    Kind,
}

/// Classifies a 404 from a GET of the object named `name`; `None` when `status` is not a 404.
pub fn classify_not_found(status: &Status, name: &str) -> Option<NotFound> {
    if status.code != 404 {
        return None;
    }
    let named = status
        .details
        .as_ref()
        .is_some_and(|d| !d.name.is_empty() && d.name == name);
    Some(if named && status.reason == "NotFound" {
        NotFound::Object
    } else {
        NotFound::Kind
    })
}

/// The `SourceResolutionFailed` message for a source whose kind the apiserver stopped serving
/// between discovery and the read (`resource`: `<plural>.<group>` or `<plural>`).
pub fn kind_not_served_message(resource: &str, object: &str, answer: &str) -> String {
    format!(
        "the apiserver does not serve {resource} (any more) and could not read {object}: {answer}; \
         copies are kept, and the kind is resolved again on the next attempt"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(json: &str) -> Status {
        serde_json::from_str(json).expect("a Status")
    }

    /// The apiserver's answers (v1.36.3, read with curl): a GET of `example.com/v1 widgets
    /// fx-a/blue` with the CRD installed and no such object; a GET of a resource type the group
    /// version does not serve (`/apis/apps/v1/namespaces/fx-a/widgets/blue`); a core object missing.
    /// With the CRD deleted (another CRD of the group still installed or not) the same GET is
    /// answered `404 page not found` as plain text, which the client turns into a Status of its own
    /// (below).
    const OBJECT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"widgets.example.com \"blue\" not found","reason":"NotFound","details":{"name":"blue","group":"example.com","kind":"widgets"},"code":404}"#;
    const KIND: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;
    const CORE_OBJECT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"cfg\" not found","reason":"NotFound","details":{"name":"cfg","kind":"configmaps"},"code":404}"#;

    #[test]
    fn a_404_names_the_object_only_when_the_object_is_missing() {
        // (answer, name read, classification)
        let table = [
            (OBJECT, "blue", Some(NotFound::Object)),
            (CORE_OBJECT, "cfg", Some(NotFound::Object)),
            (KIND, "blue", Some(NotFound::Kind)),
            // Another object's name is no proof about this one.
            (OBJECT, "green", Some(NotFound::Kind)),
        ];
        for (json, name, expected) in table {
            assert_eq!(classify_not_found(&status(json), name), expected, "{json}");
        }
        // The CRD deleted: a plain-text `404 page not found`, as kube's client reconstructs it.
        let bare = Status::failure("404 page not found", "Failed to parse error data").with_code(404);
        assert_eq!(classify_not_found(&bare, "blue"), Some(NotFound::Kind));
        // What the controller read before (kube's `is_not_found`, through `get_opt`) took a type
        // that is not served for a missing object, and would have withdrawn the copies.
        assert!(status(KIND).is_not_found());
        let forbidden = Status::failure("forbidden", "Forbidden").with_code(403);
        assert_eq!(classify_not_found(&forbidden, "blue"), None);
    }

    #[test]
    fn the_message_says_the_copies_stay() {
        let m = kind_not_served_message(
            "widgets.example.com",
            "team-a/blue",
            "the server could not find the requested resource",
        );
        assert!(
            m.starts_with("the apiserver does not serve widgets.example.com (any more)"),
            "{m}"
        );
        assert!(m.contains("copies are kept"), "{m}");
        assert!(m.contains("could not find the requested resource"), "{m}");
    }
}
