//! The one place a pass tells the watches what wakes its CR next. What that is, the pass decides as
//! data: its inputs (`shared::pass::interest`, registered after the author check and before
//! anything is read, so no change between a read and its registration is missed) and the strangers
//! its copies wait for (`Concluded::waiting`, registered once the writes found them).

use crate::{
    index::{CrRef, ObjectKey},
    namespace_watch::Namespaces,
    watches::WatchRegistry,
};
use kube::runtime::reflector::ObjectRef;
use shared::{
    api::{
        crd::ClusterProjection,
        kind::{CrName, CrView},
        source::GroupKind,
    },
    pass::{
        interest::{Follow, Interest, Reads},
        status::Concluded,
        targets::{TargetError, TargetRule},
    },
};
use std::sync::Arc;

/// A ClusterProjection's target rule as registered (`None` for a Projection).
pub type Rule = Option<Result<Arc<TargetRule>, TargetError>>;

/// Registers what wakes `cr` on its source, its group's discovery and (for a ClusterProjection)
/// the namespaces of the cluster its copies go to (`None` when that cluster could not be reached:
/// its rule stays as it was); returns the target rule, which the targets are resolved with.
pub fn register_inputs(
    (watches, namespaces): (&WatchRegistry, Option<&Namespaces>),
    cr: &CrView<'_>,
    interest: Interest,
) -> Rule {
    let waker = CrRef::named(&cr.name());
    match &interest.follows {
        Follow::Group(group) => watches.follow_discovery(&waker, Some(group)),
        Follow::No => watches.follow_discovery(&waker, None),
        Follow::Unchanged => {}
    }
    match interest.reads {
        Reads::Source(source) => watches.set_reads(&waker, source),
        Reads::Nothing => watches.clear_reads(&waker),
        Reads::Unchanged => {}
    }
    let rule = interest.targets?.map(Arc::new);
    if let (CrName::ClusterProjection { name }, Some(namespaces)) = (cr.name(), namespaces) {
        let name = ObjectRef::<ClusterProjection>::new(&name);
        match &rule {
            Ok(rule) => namespaces.set_rule(&name, rule.clone()),
            Err(_) => namespaces.forget(&name),
        }
    }
    Some(rule)
}

/// Registers the strangers `cr`'s copies (named `copy_name`, of `group_kind`) wait for: the CR is
/// woken when one leaves.
pub fn register_waits(
    watches: &WatchRegistry,
    cr: &CrView<'_>,
    (group_kind, copy_name): (&GroupKind, &str),
    concluded: &Concluded,
) {
    let waiting = concluded
        .waiting
        .iter()
        .map(|namespace| ObjectKey {
            group_kind: group_kind.clone(),
            namespace: namespace.clone(),
            name: copy_name.to_owned(),
        })
        .collect();
    watches.set_waiting(&CrRef::named(&cr.name()), waiting);
}
