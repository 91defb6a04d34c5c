//! Which copies go: those a spec change left behind (another namespace, name or kind), and every copy
//! of a CR whose source is gone. The ownership annotation is the only proof that a copy may be
//! deleted; the UID label only finds candidates, which the delete re-checks against the annotation.

use crate::{crd::WrittenDestination, ownership::Owner};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeSet;

/// Whether a copy of the current kind (its metadata) is no longer wanted: `owner` owns it, and it
/// lies outside the namespaces to `keep` or carries another name than `name`.
pub fn is_unwanted(meta: &ObjectMeta, owner: &Owner, keep: &BTreeSet<String>, name: &str) -> bool {
    owner.owns(meta.annotations.as_ref())
        && (!keep.contains(meta.namespace.as_deref().unwrap_or_default())
            || meta.name.as_deref() != Some(name))
}

/// Whether an object carries `owner`'s UID label: a candidate when every copy of the owner goes.
pub fn is_labelled_for(meta: &ObjectMeta, owner: &Owner) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(owner.uid_label_key()))
        .is_some_and(|uid| uid == owner.uid())
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
    use crate::keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_CLUSTER_PROJECTION_UID};
    use std::collections::BTreeMap;

    fn owner() -> Owner {
        Owner::ClusterProjection {
            name: "cp".into(),
            uid: "u1".into(),
        }
    }

    fn meta(namespace: &str, name: &str, annotated: Option<&str>, uid_label: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            annotations: annotated
                .map(|owner| BTreeMap::from([(OWNED_BY_CLUSTER_PROJECTION.to_owned(), owner.to_owned())])),
            labels: uid_label
                .map(|uid| BTreeMap::from([(OWNED_BY_CLUSTER_PROJECTION_UID.to_owned(), uid.to_owned())])),
            ..ObjectMeta::default()
        }
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
                is_unwanted(&meta(ns, name, annotated, None), &owner(), &keep, "cfg"),
                unwanted,
                "{ns}/{name} {annotated:?}"
            );
        }
    }

    #[test]
    fn the_uid_label_finds_candidates() {
        assert!(is_labelled_for(&meta("a", "cfg", None, Some("u1")), &owner()));
        assert!(!is_labelled_for(&meta("a", "cfg", None, Some("u2")), &owner()));
        assert!(!is_labelled_for(&meta("a", "cfg", Some("cp"), None), &owner()));
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
