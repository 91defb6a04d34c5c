//! Adoption with the consent of the destination's owner (SPEC §10): an existing object at a copy's
//! coordinates that carries `projection.sh/adopt-by` naming exactly the reconciling CR becomes its
//! copy; anything else stays a `DestinationConflict`. Consent is one-shot: the annotation is removed
//! by the write that adopts.

use crate::{
    api::keys::{ADOPT_BY, OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION},
    copy::ownership::Owner,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value};

/// The prefix naming a ClusterProjection in `projection.sh/adopt-by`.
pub const CLUSTER_PREFIX: &str = "cluster/";

/// The `projection.sh/adopt-by` value that names `owner`: `<namespace>/<name>` or `cluster/<name>`,
/// and for a CR of another cluster (its copies in this one) `@` and that cluster's identity, so
/// that a same-named CR of a third cluster never takes what was meant for it.
pub fn adoption_value(owner: &Owner) -> String {
    let named = match owner {
        Owner::Projection { namespace, name, .. } => format!("{namespace}/{name}"),
        Owner::ClusterProjection { name, .. } => format!("{CLUSTER_PREFIX}{name}"),
    };
    match owner.cluster() {
        Some(cluster) => format!("{named}@{cluster}"),
        None => named,
    }
}

/// Whether `owner` may take over an existing object it does not own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Consent {
    /// The object's owner named this CR: adopt it.
    Adopt,
    /// Not this CR's to take: the conflict message.
    Refused(String),
}

/// Decides whether `owner` may adopt the existing object `meta` (which it does not own).
pub fn consent(meta: &ObjectMeta, owner: &Owner) -> Consent {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let conflict = format!(
        "destination {namespace}/{name} exists and is not owned by this {}",
        owner.kind()
    );
    let annotations = meta.annotations.as_ref();
    let Some(named) = annotations.and_then(|a| a.get(ADOPT_BY)) else {
        return Consent::Refused(conflict);
    };
    let wanted = adoption_value(owner);
    if *named != wanted {
        return Consent::Refused(format!(
            "{conflict}: its {ADOPT_BY} names {named:?}, not {wanted:?}"
        ));
    }
    let managed = [OWNED_BY_PROJECTION, OWNED_BY_CLUSTER_PROJECTION]
        .into_iter()
        .find_map(|key| annotations.and_then(|a| a.get(key)).map(|v| (key, v)));
    if let Some((key, value)) = managed {
        return Consent::Refused(format!(
            "{conflict}: it is managed by another CR ({key}={value}); adoption needs an object no CR owns"
        ));
    }
    if matches!(owner, Owner::ClusterProjection { .. }) && namespace == "cluster" {
        // In a namespace named `cluster`, `cluster/<name>` also names the Projection <name> there:
        // the namespace's own Projection is the one named.
        return Consent::Refused(format!(
            "{conflict}: in namespace \"cluster\", {ADOPT_BY}: {named} names the Projection {named}"
        ));
    }
    Consent::Adopt
}

/// Turns the update that makes an adopted object our copy into the adopting write: the consent
/// annotation is removed in the same request.
pub fn adoption_patch(mut patch: Value) -> Value {
    if let Some(root) = patch.as_object_mut() {
        let metadata = root
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(metadata) = metadata.as_object_mut() {
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(ADOPT_BY.to_owned(), Value::Null);
            }
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_value_names_the_tier() {
        let projection = Owner::Projection {
            namespace: "team-a".into(),
            name: "p".into(),
            uid: "u".into(),
            cluster: None,
        };
        let cluster = Owner::ClusterProjection {
            name: "c".into(),
            uid: "u".into(),
            cluster: None,
        };
        assert_eq!(adoption_value(&projection), "team-a/p");
        assert_eq!(adoption_value(&cluster), "cluster/c");
    }

    #[test]
    fn the_adopting_write_removes_the_consent() {
        let patch = json!({"data": {"a": "1"}, "metadata": {"annotations": {"projection.sh/owned-by-projection": "n/p"}, "resourceVersion": "4"}});
        assert_eq!(
            adoption_patch(patch),
            json!({"data": {"a": "1"}, "metadata": {"annotations": {
                "projection.sh/owned-by-projection": "n/p", ADOPT_BY: null}, "resourceVersion": "4"}})
        );
        assert_eq!(
            adoption_patch(json!({})),
            json!({"metadata": {"annotations": {ADOPT_BY: null}}})
        );
    }
}
