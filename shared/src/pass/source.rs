//! What reading the source tells a pass, decided once for the controller and the plugin's
//! `preview`: a source that does not exist, and one that exists but may not be projected (its
//! owner's opt-in, the kind's rules for one object), and what the CR's author is asked first.
//! Each withdraws the copies.

use crate::{
    api::{crd::SourceRef, kind::CrView, reason::Reason},
    pass::status::Stop,
    policy::{
        author::{AccessQuestion, Author, denial_message},
        kind_policy::{AllowedPowerKinds, check_object},
        kubeconfig::KubeconfigSecret,
        projectable::{SourceMode, check_projectable},
    },
};
use kube::core::{ApiResource, DynamicObject};

/// The source `source` (of kind `resource`) does not exist: `SourceDeleted` once a pass wrote a copy
/// of it (`ever_projected`), else `SourceNotFound`.
pub fn missing(source: &SourceRef, resource: ApiResource, ever_projected: bool) -> Stop {
    let (reason, message) = if ever_projected {
        (
            Reason::SourceDeleted,
            format!("source {}/{} has been deleted", source.namespace, source.name),
        )
    } else {
        (
            Reason::SourceNotFound,
            format!("source {}/{} not found", source.namespace, source.name),
        )
    };
    Stop::Withdraw {
        reason,
        message,
        resource: Box::new(resource),
        removal: None,
    }
}

/// Whether `object`, the source `source` as read (of kind `resource`), may be projected under the
/// controller's `--source-mode` and `--allow-power-kinds`.
pub fn check_read(
    source: &SourceRef,
    (object, resource): (&DynamicObject, &ApiResource),
    (mode, allowed): (SourceMode, &AllowedPowerKinds),
) -> Result<(), Stop> {
    let withdraw = |reason, message| Stop::Withdraw {
        reason,
        message,
        resource: Box::new(resource.clone()),
        removal: None,
    };
    let annotations = object.metadata.annotations.as_ref();
    check_projectable(mode, annotations, &source.namespace, &source.name)
        .map_err(|blocked| withdraw(blocked.reason, blocked.message))?;
    let secret_type = object.data.get("type").and_then(|t| t.as_str());
    check_object(&source.group_kind(), secret_type, allowed)
        .map_err(|message| withdraw(Reason::SourceNotProjectable, message))
}

/// The two questions a pass asks of the CR's author before it touches the source (of kind
/// `resource`): may they get it, and may they create its kind where the copies go (the CR's own
/// namespace; every namespace at once for a ClusterProjection, whose namespaces are asked one by one
/// when that is not granted).
pub fn author_questions(cr: &CrView<'_>, resource: &ApiResource) -> (AccessQuestion, AccessQuestion) {
    let source = cr.source;
    let read =
        AccessQuestion::read_source(&resource.group, &resource.plural, &source.namespace, &source.name);
    let create =
        AccessQuestion::create_copies(&resource.group, &resource.plural, cr.home().unwrap_or_default());
    (read, create)
}

/// The author may not read the source (`question`; `why`: the authorizer's reason): the copies go,
/// since their author could not have made them.
pub fn read_denied(
    author: &Author,
    question: &AccessQuestion,
    why: Option<&str>,
    resource: &ApiResource,
) -> Stop {
    Stop::Withdraw {
        reason: Reason::SourceForbidden,
        message: denial_message(author, question, why),
        resource: Box::new(resource.clone()),
        removal: None,
    }
}

/// The author may not get the kubeconfig Secret of `spec.destination.kubeConfig` (`question`,
/// [`KubeconfigSecret::question`]; `why`: the authorizer's reason): nothing is written there.
pub fn secret_denied(
    author: &Author,
    (question, secret): (&AccessQuestion, &KubeconfigSecret),
    why: Option<&str>,
    resolved: &str,
) -> Stop {
    Stop::Destination {
        reason: Reason::DestinationClusterForbidden,
        message: format!(
            "{} (the kubeconfig of spec.destination.kubeConfig, key {:?})",
            denial_message(author, question, why),
            secret.key
        ),
        resolved: resolved.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source() -> SourceRef {
        serde_json::from_value(json!({"kind": "Secret", "namespace": "src", "name": "s"})).expect("source")
    }

    fn secrets() -> ApiResource {
        ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&())
    }

    fn object(annotations: serde_json::Value, kind: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "src", "annotations": annotations},
            "type": kind,
        }))
        .expect("object")
    }

    #[test]
    fn a_missing_source_was_deleted_only_once_projected() {
        assert_eq!(
            missing(&source(), secrets(), false).reason(),
            Reason::SourceNotFound
        );
        let gone = missing(&source(), secrets(), true);
        assert_eq!(gone.reason(), Reason::SourceDeleted);
        assert_eq!(gone.message(), "source src/s has been deleted");
    }

    #[test]
    fn the_owner_and_the_kind_decide_whether_a_source_read_may_be_projected() {
        let allowed = AllowedPowerKinds::default();
        let rules = (SourceMode::Allowlist, &allowed);
        let opted_in = object(json!({"projection.sh/projectable": "true"}), "Opaque");
        assert!(check_read(&source(), (&opted_in, &secrets()), rules).is_ok());
        let silent = object(json!({}), "Opaque");
        let refused = check_read(&source(), (&silent, &secrets()), rules).unwrap_err();
        assert_eq!(refused.reason(), Reason::SourceNotProjectable);
        assert!(
            check_read(
                &source(),
                (&silent, &secrets()),
                (SourceMode::Permissive, &allowed)
            )
            .is_ok()
        );
        let vetoed = object(json!({"projection.sh/projectable": "false"}), "Opaque");
        let refused = check_read(
            &source(),
            (&vetoed, &secrets()),
            (SourceMode::Permissive, &allowed),
        );
        assert_eq!(refused.unwrap_err().reason(), Reason::SourceOptedOut);
        let token = object(
            json!({"projection.sh/projectable": "true"}),
            "kubernetes.io/service-account-token",
        );
        let refused = check_read(&source(), (&token, &secrets()), rules).unwrap_err();
        assert!(matches!(refused, Stop::Withdraw { .. }), "{refused:?}");
        assert_eq!(refused.reason(), Reason::SourceNotProjectable);
    }
}
