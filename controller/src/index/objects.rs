//! Watched objects → the CRs to wake: the CRs reading an object as their source, the CRs waiting
//! for a stranger to leave its coordinates ([`ObjectIndex::route`], for events of the metadata
//! watch of every object of a kind), and the owner named by a copy's ownership annotation (a copy
//! edited or deleted by someone else, unless the [`Journal`] knows the event as ours:
//! [`ObjectIndex::route_copy`], for events of the copies watches, so the owner is woken only once
//! the copies' cache it reads has the event too).

use super::{CrRef, Journal, ObjectKey};
use crate::cache::verified::VerifiedCopies;
use kube::{api::ObjectMeta, runtime::reflector::ObjectRef};
use shared::{
    api::keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION},
    api::source::{GroupKind, SourceKey},
};
use std::{
    collections::{HashMap, HashSet, hash_map::Entry},
    hash::Hash,
    sync::Arc,
};

/// The index of watched objects and the CRs they concern.
#[derive(Debug, Default)]
pub struct ObjectIndex {
    /// Which CRs read which source; the key is shared with the CR's entry in `crs`, one
    /// allocation per source.
    readers: HashMap<Arc<SourceKey>, CrSet>,
    /// Per CR, what it reads and whose discovery it follows: one entry per CR for both.
    crs: HashMap<CrRef, Tracked>,
    /// Which CRs wait for coordinates held by a stranger.
    waiters: HashMap<ObjectKey, CrSet>,
    waits: HashMap<CrRef, Vec<ObjectKey>>,
    /// Our own writes.
    pub journal: Journal,
    /// The copies found up to date, so an unchanged copy is not compared again.
    pub verified: VerifiedCopies,
}

impl ObjectIndex {
    /// Records that `cr` reads `source` (replacing what it read before). Returns the kind `cr` read
    /// before if it read another kind.
    pub fn set_reads(&mut self, cr: &CrRef, source: SourceKey) -> Option<GroupKind> {
        if self.crs.get(cr).and_then(|t| t.reads.as_deref()) == Some(&source) {
            return None;
        }
        let source = match self.readers.get_key_value(&source) {
            Some((shared, _)) => shared.clone(),
            None => Arc::new(source),
        };
        let mut left = None;
        let tracked = self.crs.entry(cr.clone()).or_default();
        if let Some(old) = tracked.reads.replace(source.clone()) {
            remove_from(&mut self.readers, &old, cr);
            if old.group_kind != source.group_kind {
                left = Some(old.group_kind.clone());
            }
        }
        insert_into(&mut self.readers, source, cr.clone());
        left
    }

    /// Records that `cr` reads no source (its author may not read the one it names); whether it
    /// follows discovery stays. Returns the kind it read before, if any.
    pub fn clear_reads(&mut self, cr: &CrRef) -> Option<GroupKind> {
        let tracked = self.crs.get_mut(cr)?;
        let old = tracked.reads.take()?;
        if tracked.follows.is_none() {
            self.crs.remove(cr);
        }
        remove_from(&mut self.readers, &old, cr);
        Some(old.group_kind.clone())
    }

    /// Whether any CR reads a source of `group_kind` (its watches are still needed).
    pub fn is_read(&self, group_kind: &GroupKind) -> bool {
        self.readers.keys().any(|source| &source.group_kind == group_kind)
    }

    /// The CRs reading a source of `group_kind`.
    pub fn readers_of_kind(&self, group_kind: &GroupKind) -> Vec<CrRef> {
        self.readers
            .iter()
            .filter(|(source, _)| &source.group_kind == group_kind)
            .flat_map(|(_, crs)| crs.iter().cloned())
            .collect()
    }

    /// Records the coordinates held by strangers that `cr` waits for (replacing the earlier set).
    pub fn set_waiting(&mut self, cr: &CrRef, keys: Vec<ObjectKey>) {
        for old in self.waits.remove(cr).unwrap_or_default() {
            remove_from(&mut self.waiters, &old, cr);
        }
        if !keys.is_empty() {
            for key in &keys {
                insert_into(&mut self.waiters, key.clone(), cr.clone());
            }
            self.waits.insert(cr.clone(), keys);
        }
    }

    /// Records whether `cr` follows discovery of API group `group`, or no longer does (`None`).
    pub fn follow_discovery(&mut self, cr: &CrRef, group: Option<&str>) {
        match group {
            Some(group) if self.crs.get(cr).and_then(|t| t.follows.as_deref()) != Some(group) => {
                self.crs.entry(cr.clone()).or_default().follows = Some(group.into());
            }
            Some(_) => {}
            None => {
                if let Some(tracked) = self.crs.get_mut(cr) {
                    tracked.follows = None;
                    if tracked.reads.is_none() {
                        self.crs.remove(cr);
                    }
                }
            }
        }
    }

    /// The CRs that follow discovery of `group` (a scan: discovery changes are rare).
    pub fn discovery_followers(&self, group: &str) -> Vec<CrRef> {
        self.crs
            .iter()
            .filter(|(_, t)| t.follows.as_deref() == Some(group))
            .map(|(cr, _)| cr.clone())
            .collect()
    }

    /// Forgets a CR that is gone. Returns the kind it read, if any.
    pub fn forget(&mut self, cr: &CrRef) -> Option<GroupKind> {
        let read = self.crs.remove(cr).and_then(|t| t.reads).map(|old| {
            remove_from(&mut self.readers, &old, cr);
            old.group_kind.clone()
        });
        for old in self.waits.remove(cr).unwrap_or_default() {
            remove_from(&mut self.waiters, &old, cr);
        }
        read
    }

    /// The CRs one watch event of an object of `group_kind` concerns.
    pub fn route(&self, group_kind: &GroupKind, meta: &ObjectMeta) -> Vec<CrRef> {
        let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
            return Vec::new();
        };
        let key = ObjectKey {
            group_kind: group_kind.clone(),
            namespace,
            name,
        };
        let source = SourceKey {
            group_kind: key.group_kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        let mut crs: Vec<CrRef> = Vec::new();
        crs.extend(
            self.readers
                .get(&source)
                .into_iter()
                .flat_map(CrSet::iter)
                .cloned(),
        );
        crs.extend(self.waiters.get(&key).into_iter().flat_map(CrSet::iter).cloned());
        crs
    }

    /// The owner one watch event of our copy of `group_kind` wakes, unless the event is ours. A
    /// deleted copy is no longer remembered as verified.
    pub fn route_copy(&mut self, group_kind: &GroupKind, meta: &ObjectMeta, deleted: bool) -> Option<CrRef> {
        let key = ObjectKey {
            group_kind: group_kind.clone(),
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
        };
        if deleted {
            self.verified.forget(&key);
        }
        let owner = annotated_owner(meta)?;
        (!self
            .journal
            .absorbs(&key, meta.resource_version.as_ref(), deleted))
        .then_some(owner)
    }
}

/// What the index knows of one CR.
#[derive(Debug, Default)]
struct Tracked {
    /// The source it reads.
    reads: Option<Arc<SourceKey>>,
    /// The API group whose discovery it follows (its kind is unknown, or its source names no
    /// version): it is woken when that group's CRDs or APIServices change.
    follows: Option<Box<str>>,
}

/// A set of CRs, most often of one: that one is held inline (a hash set, even of one, allocates
/// room for several), a set only once a second CR joins.
#[derive(Debug)]
enum CrSet {
    One(CrRef),
    Many(HashSet<CrRef>),
}

impl CrSet {
    fn insert(&mut self, cr: CrRef) {
        match self {
            Self::One(one) if *one == cr => {}
            Self::One(one) => *self = Self::Many(HashSet::from([one.clone(), cr])),
            Self::Many(many) => {
                many.insert(cr);
            }
        }
    }

    /// Removes `cr`; returns whether the set is empty then.
    fn remove(&mut self, cr: &CrRef) -> bool {
        match self {
            Self::One(one) => one == cr,
            Self::Many(many) => {
                many.remove(cr);
                many.is_empty()
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &CrRef> {
        let (one, many) = match self {
            Self::One(one) => (Some(one), None),
            Self::Many(many) => (None, Some(many)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

fn insert_into<K: Hash + Eq>(map: &mut HashMap<K, CrSet>, key: K, cr: CrRef) {
    match map.entry(key) {
        Entry::Occupied(mut set) => set.get_mut().insert(cr),
        Entry::Vacant(slot) => {
            slot.insert(CrSet::One(cr));
        }
    }
}

fn remove_from<K: Hash + Eq + std::borrow::Borrow<Q>, Q: Hash + Eq + ?Sized>(
    map: &mut HashMap<K, CrSet>,
    key: &Q,
    cr: &CrRef,
) {
    if map.get_mut(key).is_some_and(|set| set.remove(cr)) {
        map.remove(key);
    }
}

/// The owner named by a copy's ownership annotations.
fn annotated_owner(meta: &ObjectMeta) -> Option<CrRef> {
    let annotations = meta.annotations.as_ref()?;
    if let Some((ns, name)) = annotations
        .get(OWNED_BY_PROJECTION)
        .and_then(|v| v.split_once('/'))
    {
        return Some(CrRef::Projection(ObjectRef::new(name).within(ns)));
    }
    annotations
        .get(OWNED_BY_CLUSTER_PROJECTION)
        .map(|name| CrRef::Cluster(ObjectRef::new(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn configmaps() -> GroupKind {
        GroupKind {
            group: String::new(),
            kind: "ConfigMap".into(),
        }
    }

    fn key(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group_kind: configmaps(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn source(namespace: &str, name: &str) -> SourceKey {
        SourceKey {
            group_kind: configmaps(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn projection(name: &str) -> CrRef {
        CrRef::Projection(ObjectRef::new(name).within("dst"))
    }

    fn cluster(name: &str) -> CrRef {
        CrRef::Cluster(ObjectRef::new(name))
    }

    fn meta(namespace: &str, name: &str, annotation: Option<(&str, &str)>, rv: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            annotations: annotation.map(|(k, v)| BTreeMap::from([(k.to_owned(), v.to_owned())])),
            ..ObjectMeta::default()
        }
    }

    fn sorted(mut crs: Vec<CrRef>) -> Vec<String> {
        let mut names: Vec<String> = crs
            .drain(..)
            .map(|cr| match cr {
                CrRef::Projection(r) => format!("p:{}", r.name),
                CrRef::Cluster(r) => format!("c:{}", r.name),
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn events_wake_readers_waiters_and_owners() {
        let mut ix = ObjectIndex::default();
        ix.set_reads(&projection("a"), source("src", "cfg"));
        ix.set_reads(&cluster("c"), source("src", "cfg"));
        ix.set_waiting(&projection("b"), vec![key("dst", "held")]);
        // Events of the metadata watch: (event object, woken)
        for (namespace, name, woken) in [
            ("src", "cfg", vec!["c:c", "p:a"]),
            ("src", "other", vec![]),
            ("dst", "held", vec!["p:b"]),
        ] {
            let got = ix.route(&configmaps(), &meta(namespace, name, None, "1"));
            assert_eq!(sorted(got), woken, "{namespace}/{name}");
        }
        let owned = meta("dst", "copy", Some((OWNED_BY_PROJECTION, "dst/a")), "1");
        assert!(
            ix.route(&configmaps(), &owned).is_empty(),
            "a copy's owner is woken by the copies watch"
        );
        let unnamed = ObjectMeta::default();
        assert!(ix.route(&configmaps(), &unnamed).is_empty());
        // Events of the copies watches: (event object, ownership annotation, woken)
        for (namespace, name, annotation, woken) in [
            ("dst", "copy", Some((OWNED_BY_PROJECTION, "dst/a")), Some("p:a")),
            (
                "team",
                "copy",
                Some((OWNED_BY_CLUSTER_PROJECTION, "c")),
                Some("c:c"),
            ),
            ("dst", "copy", Some((OWNED_BY_PROJECTION, "malformed")), None),
            ("dst", "copy", None, None),
        ] {
            let got = ix.route_copy(&configmaps(), &meta(namespace, name, annotation, "1"), false);
            assert_eq!(
                got.map(|cr| sorted(vec![cr]).remove(0)).as_deref(),
                woken,
                "{namespace}/{name}"
            );
        }
        assert_eq!(ix.route_copy(&configmaps(), &unnamed, false), None);
    }

    #[test]
    fn replacing_and_forgetting_update_every_direction() {
        let mut ix = ObjectIndex::default();
        let a = projection("a");
        ix.set_reads(&a, source("src", "old"));
        ix.set_reads(&a, source("src", "new"));
        ix.set_waiting(&a, vec![key("dst", "x")]);
        ix.set_waiting(&a, vec![key("dst", "y")]);
        ix.follow_discovery(&a, Some("example.com"));
        // (event object, woken)
        for (name, woken) in [("old", 0), ("new", 1), ("x", 0), ("y", 1)] {
            let ns = if name.len() == 1 { "dst" } else { "src" };
            assert_eq!(
                ix.route(&configmaps(), &meta(ns, name, None, "1")).len(),
                woken,
                "{name}"
            );
        }
        assert_eq!(ix.discovery_followers("example.com"), vec![a.clone()]);
        assert!(ix.discovery_followers("other.io").is_empty());
        ix.follow_discovery(&a, None);
        assert!(ix.discovery_followers("example.com").is_empty());
        ix.follow_discovery(&a, Some("example.com"));
        ix.forget(&a);
        assert!(ix.discovery_followers("example.com").is_empty());
        assert!(ix.route(&configmaps(), &meta("src", "new", None, "1")).is_empty());
        assert!(ix.route(&configmaps(), &meta("dst", "y", None, "1")).is_empty());
        assert!(
            ix.readers.is_empty() && ix.waiters.is_empty() && ix.crs.is_empty(),
            "no empty sets left behind"
        );
        // A CR that only follows discovery (its kind is unknown) is forgotten when it stops.
        ix.follow_discovery(&a, Some("example.com"));
        ix.follow_discovery(&a, None);
        assert!(ix.crs.is_empty());
    }

    #[test]
    fn a_source_shared_by_many_readers_keeps_the_rest_as_each_leaves() {
        let mut ix = ObjectIndex::default();
        let readers = ["a", "b", "c"].map(projection);
        for cr in &readers {
            ix.set_reads(cr, source("src", "cfg"));
            // Recording the same read again changes nothing.
            assert_eq!(ix.set_reads(cr, source("src", "cfg")), None);
        }
        let wake = |ix: &ObjectIndex| sorted(ix.route(&configmaps(), &meta("src", "cfg", None, "1")));
        assert_eq!(wake(&ix), ["p:a", "p:b", "p:c"]);
        ix.forget(&readers[1]);
        assert_eq!(wake(&ix), ["p:a", "p:c"]);
        ix.set_reads(&readers[0], source("src", "other"));
        assert_eq!(wake(&ix), ["p:c"]);
        ix.forget(&readers[2]);
        assert!(wake(&ix).is_empty());
        assert_eq!(ix.readers.len(), 1, "only the source a still reads");
        assert_eq!(ix.readers_of_kind(&configmaps()), vec![readers[0].clone()]);
    }

    #[test]
    fn a_reader_refused_its_source_is_woken_by_it_no_more() {
        let mut ix = ObjectIndex::default();
        let a = projection("a");
        ix.set_reads(&a, source("src", "cfg"));
        ix.follow_discovery(&a, Some("example.com"));
        assert_eq!(
            ix.clear_reads(&a),
            Some(configmaps()),
            "the kind it read is handed back"
        );
        assert!(ix.route(&configmaps(), &meta("src", "cfg", None, "1")).is_empty());
        assert!(!ix.is_read(&configmaps()));
        assert_eq!(
            ix.discovery_followers("example.com"),
            vec![a.clone()],
            "it still follows discovery"
        );
        assert_eq!(ix.clear_reads(&a), None, "nothing left to clear");
        ix.follow_discovery(&a, None);
        assert!(ix.crs.is_empty() && ix.readers.is_empty());
    }

    #[test]
    fn our_own_writes_wake_nothing() {
        let mut ix = ObjectIndex::default();
        let owned = Some((OWNED_BY_PROJECTION, "dst/a"));
        let owner = Some(projection("a"));
        ix.journal.begin_write(key("dst", "copy"));
        assert!(!ix.journal.finish_write(key("dst", "copy"), Some("7".into())));
        assert_eq!(
            ix.route_copy(&configmaps(), &meta("dst", "copy", owned, "7"), false),
            None
        );
        assert_eq!(
            ix.route_copy(&configmaps(), &meta("dst", "copy", owned, "8"), false),
            owner
        );
        ix.journal.record_delete(key("dst", "copy"));
        assert_eq!(
            ix.route_copy(&configmaps(), &meta("dst", "copy", owned, "8"), true),
            None
        );
        assert_eq!(
            ix.route_copy(&configmaps(), &meta("dst", "copy", owned, "9"), true),
            owner,
            "a delete after ours is someone else's"
        );
    }

    #[test]
    fn a_kind_is_read_until_its_last_reader_leaves_or_moves() {
        let secrets = GroupKind {
            group: String::new(),
            kind: "Secret".into(),
        };
        let secret = SourceKey {
            group_kind: secrets.clone(),
            namespace: "src".into(),
            name: "s".into(),
        };
        let mut ix = ObjectIndex::default();
        assert_eq!(ix.set_reads(&projection("a"), source("src", "cfg")), None);
        assert_eq!(ix.set_reads(&cluster("c"), source("src", "other")), None);
        assert_eq!(
            ix.set_reads(&projection("a"), source("src", "renamed")),
            None,
            "same kind"
        );
        assert!(ix.is_read(&configmaps()) && !ix.is_read(&secrets));
        assert_eq!(sorted(ix.readers_of_kind(&configmaps())), ["c:c", "p:a"]);

        assert_eq!(
            ix.set_reads(&projection("a"), secret),
            Some(configmaps()),
            "a moved to another kind"
        );
        assert!(ix.is_read(&configmaps()), "c still reads a ConfigMap");
        assert_eq!(ix.forget(&cluster("c")), Some(configmaps()));
        assert!(!ix.is_read(&configmaps()));
        assert!(ix.readers_of_kind(&configmaps()).is_empty());
        assert_eq!(sorted(ix.readers_of_kind(&secrets)), ["p:a"]);
        assert_eq!(ix.forget(&cluster("c")), None, "forgotten twice");
    }
}
