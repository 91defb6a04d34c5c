//! Which copies go: those a spec change left behind (another namespace, name or kind), and every copy
//! of a CR whose source is gone. The ownership annotation is the only proof that a copy may be
//! deleted; the UID label only finds candidates, which the delete re-checks against the annotation.

use crate::{cached_copy::CachedCopy, crd::WrittenDestination, ownership::Owner};
use std::collections::BTreeSet;

/// Whether a cached copy of the current kind is no longer wanted: `owner` owns it, and it lies
/// outside the namespaces to `keep` or carries another name than `name`.
pub fn is_unwanted(copy: &CachedCopy, owner: &Owner, keep: &BTreeSet<String>, name: &str) -> bool {
    copy.is_owned_by(owner) && (!keep.contains(copy.namespace()) || copy.name() != name)
}

/// The copies an earlier spec wrote in another kind than `now`'s, which a ClusterProjection sweeps
/// (copies of the current kind under another name are found by [`is_unwanted`]).
pub fn earlier_kind(
    recorded: Option<&WrittenDestination>,
    now: &WrittenDestination,
) -> Option<WrittenDestination> {
    recorded
        .filter(|old| old.group != now.group || old.kind != now.kind)
        .cloned()
}

/// The copy an earlier spec wrote under another kind or name than `now`'s, which a Projection
/// removes.
pub fn earlier_copy(
    recorded: Option<&WrittenDestination>,
    now: &WrittenDestination,
) -> Option<WrittenDestination> {
    recorded
        .filter(|old| old.group != now.group || old.kind != now.kind || old.name != now.name)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::OWNED_BY_CLUSTER_PROJECTION;
    use std::collections::BTreeMap;

    fn owner() -> Owner {
        Owner::ClusterProjection {
            name: "cp".into(),
            uid: "u1".into(),
        }
    }

    fn cached(namespace: &str, name: &str, annotated: Option<&str>) -> CachedCopy {
        let resource = kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut object = kube::core::DynamicObject::new(name, &resource).within(namespace);
        object.metadata.annotations = annotated
            .map(|owner| BTreeMap::from([(OWNED_BY_CLUSTER_PROJECTION.to_owned(), owner.to_owned())]));
        CachedCopy::new(object, "projection-controller")
    }

    #[test]
    fn unwanted_copies_are_ours_and_outside_the_targets_or_renamed() {
        let keep = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        // (namespace, name, ownership annotation, unwanted)
        for (ns, name, annotated, unwanted) in [
            ("a", "cfg", Some("cp"), false),
            ("c", "cfg", Some("cp"), true),
            ("a", "old-name", Some("cp"), true),
            ("c", "cfg", None, false),
            ("c", "cfg", Some("other"), false),
        ] {
            assert_eq!(
                is_unwanted(&cached(ns, name, annotated), &owner(), &keep, "cfg"),
                unwanted,
                "{ns}/{name} {annotated:?}"
            );
        }
    }

    #[test]
    fn earlier_copies_are_those_of_another_kind_or_name() {
        let written = |group: &str, kind: &str, name: &str| WrittenDestination {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
        };
        let now = written("", "ConfigMap", "cfg");
        // (recorded, earlier kind, earlier copy)
        for (recorded, kind, copy) in [
            (None, false, false),
            (Some(written("", "ConfigMap", "cfg")), false, false),
            (Some(written("", "ConfigMap", "old")), false, true),
            (Some(written("", "Secret", "cfg")), true, true),
            (Some(written("example.com", "ConfigMap", "cfg")), true, true),
        ] {
            assert_eq!(
                earlier_kind(recorded.as_ref(), &now).is_some(),
                kind,
                "{recorded:?}"
            );
            assert_eq!(
                earlier_copy(recorded.as_ref(), &now).is_some(),
                copy,
                "{recorded:?}"
            );
        }
        // A version change alone moves nothing: copies are the same objects.
        let other_version = WrittenDestination {
            version: "v2".into(),
            ..now.clone()
        };
        assert_eq!(earlier_copy(Some(&other_version), &now), None);
    }
}
