//! What wakes a CR's next pass, decided from how far its read got. The controller registers it in
//! one place, after the author check and before anything of the source or the namespaces is read,
//! so no change between a read and its registration is missed, and a source whose author may not
//! read it wakes nothing.

use crate::api::{kind::CrView, source::SourceKey};
use crate::pass::targets::{TargetError, TargetRule};

/// How far the read of a CR's source got before the pass registered its interest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    /// Discovery could not be asked: what the CR watches stays as it was.
    DiscoveryFailed,
    /// Discovery does not serve the kind (yet): the CR waits for its group.
    KindUnusable,
    /// The kind resolved, but the author's access could not be asked: unchanged, retried.
    AuthorUnanswered,
    /// The source may be read, but the other cluster the copies go to cannot be used now (its
    /// kubeconfig Secret is missing or refused): unchanged, retried.
    DestinationUnusable,
    /// The kind resolved, and the source may not be read: the platform refuses its kind, or the
    /// author may not read it (or no author is recorded).
    Refused,
    /// The kind resolved and the source may be read.
    Readable,
}

/// Whether a CR follows discovery of its source's API group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Woken when the group's discovery changes.
    Group(String),
    /// Not woken by discovery.
    No,
    /// As it was.
    Unchanged,
}

/// Which source's events wake the CR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reads {
    /// This one.
    Source(SourceKey),
    /// None: its author may not read it.
    Nothing,
    /// As it was.
    Unchanged,
}

/// What wakes a CR's next pass.
#[derive(Debug)]
pub struct Interest {
    /// Discovery of the source's group.
    pub follows: Follow,
    /// The source's own events.
    pub reads: Reads,
    /// A ClusterProjection's target rule (namespace events wake it); `None` for a Projection,
    /// whose only target is its own namespace. A rule that does not compile is registered as none
    /// and stops the pass with `TargetResolutionFailed`.
    pub targets: Option<Result<TargetRule, TargetError>>,
}

impl Interest {
    /// The interest of `cr` whose read got as far as `reached`. An unpinned source follows its
    /// group's preferred version; one whose kind is not served waits for its group to serve it.
    pub fn of(cr: &CrView<'_>, reached: Reached) -> Self {
        let source = cr.source;
        let follows = match reached {
            Reached::DiscoveryFailed => Follow::Unchanged,
            Reached::KindUnusable => Follow::Group(source.group.clone()),
            _ if source.version.is_empty() => Follow::Group(source.group.clone()),
            _ => Follow::No,
        };
        let reads = match reached {
            Reached::Readable => Reads::Source(SourceKey::of(source)),
            Reached::Refused => Reads::Nothing,
            Reached::DiscoveryFailed
            | Reached::KindUnusable
            | Reached::AuthorUnanswered
            | Reached::DestinationUnusable => Reads::Unchanged,
        };
        Self {
            follows,
            reads,
            targets: cr.namespaces.map(TargetRule::of),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        crd::{ClusterProjection, Projection},
        kind::ProjectionCr,
    };
    use serde_json::json;

    fn projection(version: &str) -> Projection {
        serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1",
            "kind": "Projection",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {
                "source": {"group": "example.com", "version": version, "kind": "Widget",
                           "namespace": "src", "name": "w"},
            }
        }))
        .unwrap()
    }

    fn cluster_projection(destination: serde_json::Value) -> ClusterProjection {
        serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1",
            "kind": "ClusterProjection",
            "metadata": {"name": "c"},
            "spec": {
                "source": {"group": "", "version": "v1", "kind": "ConfigMap", "namespace": "src", "name": "cfg"},
                "destination": destination,
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_readable_source_is_read_and_an_unpinned_one_follows_its_group() {
        let pinned = projection("v1");
        let interest = Interest::of(&pinned.view(), Reached::Readable);
        assert_eq!(interest.follows, Follow::No);
        assert_eq!(interest.reads, Reads::Source(SourceKey::of(&pinned.spec.source)));
        assert!(interest.targets.is_none(), "a Projection has no target rule");

        let unpinned = projection("");
        let interest = Interest::of(&unpinned.view(), Reached::Readable);
        assert_eq!(interest.follows, Follow::Group("example.com".into()));
    }

    #[test]
    fn a_refused_source_wakes_nothing() {
        let cr = projection("v1");
        let interest = Interest::of(&cr.view(), Reached::Refused);
        assert_eq!(interest.reads, Reads::Nothing);
        assert_eq!(
            interest.follows,
            Follow::No,
            "the kind resolved: nothing to wait for"
        );
    }

    #[test]
    fn an_unserved_kind_waits_for_its_group_and_failures_change_nothing() {
        let cr = projection("v1");
        let unusable = Interest::of(&cr.view(), Reached::KindUnusable);
        assert_eq!(unusable.follows, Follow::Group("example.com".into()));
        assert_eq!(unusable.reads, Reads::Unchanged);
        for reached in [
            Reached::DiscoveryFailed,
            Reached::AuthorUnanswered,
            Reached::DestinationUnusable,
        ] {
            let interest = Interest::of(&cr.view(), reached);
            assert_eq!(interest.reads, Reads::Unchanged, "{reached:?}");
        }
        assert_eq!(
            Interest::of(&cr.view(), Reached::DiscoveryFailed).follows,
            Follow::Unchanged
        );
    }

    #[test]
    fn a_cluster_projection_registers_its_rule_or_none_when_it_does_not_compile() {
        let listing = cluster_projection(json!({"namespaces": ["a", "b"]}));
        let interest = Interest::of(&listing.view(), Reached::Readable);
        assert!(matches!(interest.targets, Some(Ok(TargetRule::List(ref names))) if names.len() == 2));

        let invalid = cluster_projection(json!({"namespaceSelector": {}}));
        let interest = Interest::of(&invalid.view(), Reached::Refused);
        assert!(matches!(interest.targets, Some(Err(_))));
    }
}
