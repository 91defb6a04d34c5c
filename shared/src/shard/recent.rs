//! The source objects that changed lately. A replica with shards wakes only its own CRs when a
//! source changes, so an edit of a source read by another replica's CR leaves that CR's copies to
//! that replica; if that replica is gone and the ring moves its CRs here, the ones reading a source
//! changed meanwhile are the ones whose copies may be stale, and they go first.

use crate::api::{
    crd::{SOURCE_SELECTABLE_FIELDS, SourceRef},
    keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION},
    source::GroupKind,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    time::{Duration, Instant},
};

/// One source object, by kind (any version), namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceObject {
    pub group_kind: GroupKind,
    pub namespace: String,
    pub name: String,
}

impl SourceObject {
    /// The object a watch event of `group_kind` tells of, if it may be a source: not a copy of
    /// ours (copies change by the thousand in a fan-out, and would crowd the sources out).
    pub fn changed(group_kind: &GroupKind, meta: &ObjectMeta) -> Option<Self> {
        let annotations = meta.annotations.as_ref();
        if annotations.is_some_and(|a| {
            a.contains_key(OWNED_BY_PROJECTION) || a.contains_key(OWNED_BY_CLUSTER_PROJECTION)
        }) {
            return None;
        }
        Some(Self {
            group_kind: group_kind.clone(),
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
        })
    }

    /// The object a CR's source names.
    pub fn named_by(source: &SourceRef) -> Self {
        Self {
            group_kind: source.group_kind(),
            namespace: source.namespace.clone(),
            name: source.name.clone(),
        }
    }
}

/// The field selectors that list the CRs reading one of `objects` (the latest changed first): one
/// per source namespace and name, at most `limit`, on the fields the CRDs declare selectable
/// ([`SOURCE_SELECTABLE_FIELDS`]). The kind is not selectable, so a CR reading another kind of the
/// same name comes too; a replica taking CRs over lists these ahead of its ranges gained, so the
/// CRs whose copies an edit made stale are handed over without waiting for that list.
pub fn source_field_selectors<'a>(
    objects: impl IntoIterator<Item = &'a SourceObject>,
    limit: usize,
) -> Vec<String> {
    let [namespace_field, name_field] = SOURCE_SELECTABLE_FIELDS;
    let mut seen = std::collections::HashSet::new();
    objects
        .into_iter()
        .filter(|object| seen.insert((object.namespace.as_str(), object.name.as_str())))
        .take(limit)
        .map(|object| {
            format!(
                "{namespace_field}={},{name_field}={}",
                escape_field_value(&object.namespace),
                escape_field_value(&object.name)
            )
        })
        .collect()
}

/// A value as a field selector carries it: `\`, `,` and `=` escaped with a backslash (names and
/// namespaces hold none of them; a selector is still never split by one).
fn escape_field_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The keys recorded within the last `window`, at most `capacity` records kept (the oldest go
/// first), so a flood of edits costs bounded memory.
#[derive(Debug)]
pub struct RecentChanges<K> {
    window: Duration,
    capacity: usize,
    /// Every record in the order made (a key recorded twice is in it twice).
    records: VecDeque<(Instant, K)>,
    /// Each key's latest record.
    latest: HashMap<K, Instant>,
}

impl<K: Clone + Eq + Hash> RecentChanges<K> {
    pub fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity: capacity.max(1),
            records: VecDeque::new(),
            latest: HashMap::new(),
        }
    }

    /// Records that `key` changed at `now`.
    pub fn record(&mut self, key: K, now: Instant) {
        self.forget_before(now.checked_sub(self.window));
        self.records.push_back((now, key.clone()));
        self.latest.insert(key, now);
        while self.records.len() > self.capacity {
            self.pop_oldest();
        }
    }

    /// Whether `key` was recorded within the window before `now`.
    pub fn changed_lately(&self, key: &K, now: Instant) -> bool {
        self.latest
            .get(key)
            .is_some_and(|at| now.saturating_duration_since(*at) <= self.window)
    }

    /// The keys recorded within the window before `now`, the latest changed first.
    pub fn newest_first(&self, now: Instant) -> Vec<&K> {
        let mut keys: Vec<(&K, Instant)> = self
            .latest
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) <= self.window)
            .map(|(key, at)| (key, *at))
            .collect();
        keys.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
        keys.into_iter().map(|(key, _)| key).collect()
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn forget_before(&mut self, oldest: Option<Instant>) {
        let Some(oldest) = oldest else { return };
        while self.records.front().is_some_and(|(at, _)| *at < oldest) {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((at, key)) = self.records.pop_front()
            && self.latest.get(&key) == Some(&at)
        {
            self.latest.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(30);

    fn object(name: &str) -> SourceObject {
        SourceObject {
            group_kind: GroupKind {
                group: String::new(),
                kind: "ConfigMap".into(),
            },
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_change_counts_within_the_window_only() {
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 10);
        recent.record(object("settings"), start);
        assert!(recent.changed_lately(&object("settings"), start + Duration::from_secs(29)));
        assert!(recent.changed_lately(&object("settings"), start + WINDOW));
        assert!(!recent.changed_lately(&object("settings"), start + WINDOW + Duration::from_millis(1)));
        assert!(!recent.changed_lately(&object("other"), start));
    }

    #[test]
    fn the_source_named_by_a_cr_matches_the_object_of_any_version() {
        let source = SourceRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "team-a".into(),
            name: "settings".into(),
        };
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 10);
        recent.record(object("settings"), start);
        assert!(recent.changed_lately(&SourceObject::named_by(&source), start));
    }

    #[test]
    fn a_copy_of_ours_is_no_source_change() {
        let kind = object("x").group_kind;
        let meta = |annotations: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(serde_json::json!({"namespace": "team-a", "name": "settings",
                "annotations": annotations}))
            .expect("metadata")
        };
        assert_eq!(
            SourceObject::changed(
                &kind,
                &meta(serde_json::json!({"projection.sh/projectable": "true"}))
            ),
            Some(object("settings"))
        );
        for owned in [OWNED_BY_PROJECTION, OWNED_BY_CLUSTER_PROJECTION] {
            assert_eq!(
                SourceObject::changed(&kind, &meta(serde_json::json!({owned: "team-b/p"}))),
                None,
                "{owned}"
            );
        }
        let cluster_scoped: ObjectMeta =
            serde_json::from_value(serde_json::json!({"name": "n"})).expect("metadata");
        assert_eq!(SourceObject::changed(&kind, &cluster_scoped), None);
    }

    #[test]
    fn the_keys_changed_lately_come_latest_first() {
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 10);
        recent.record(object("a"), start);
        recent.record(object("b"), start + Duration::from_secs(10));
        recent.record(object("c"), start + Duration::from_secs(20));
        recent.record(object("a"), start + Duration::from_secs(25));
        let names = |now| -> Vec<String> {
            recent
                .newest_first(now)
                .into_iter()
                .map(|o| o.name.clone())
                .collect()
        };
        assert_eq!(names(start + Duration::from_secs(30)), ["a", "c", "b"]);
        // b is older than the window by then.
        assert_eq!(names(start + Duration::from_secs(41)), ["a", "c"]);
    }

    #[test]
    fn the_crs_reading_the_sources_changed_lately_are_selected_by_namespace_and_name() {
        let secret = SourceObject {
            group_kind: GroupKind {
                group: String::new(),
                kind: "Secret".into(),
            },
            ..object("a")
        };
        let elsewhere = SourceObject {
            namespace: "team-b".into(),
            ..object("a")
        };
        let objects = [object("a"), secret, elsewhere, object("b"), object("c")];
        assert_eq!(
            source_field_selectors(&objects, 10),
            [
                "spec.source.namespace=team-a,spec.source.name=a",
                "spec.source.namespace=team-b,spec.source.name=a",
                "spec.source.namespace=team-a,spec.source.name=b",
                "spec.source.namespace=team-a,spec.source.name=c",
            ],
            "one selector per namespace and name, whatever the kind, in the order given"
        );
        assert_eq!(
            source_field_selectors(&objects, 2),
            [
                "spec.source.namespace=team-a,spec.source.name=a",
                "spec.source.namespace=team-b,spec.source.name=a",
            ],
            "the first ones (the latest changed) up to the limit"
        );
        assert!(source_field_selectors(&[], 10).is_empty());
        let odd = SourceObject {
            name: r"x,y=z\w".into(),
            ..object("a")
        };
        assert_eq!(
            source_field_selectors([&odd], 1),
            [r"spec.source.namespace=team-a,spec.source.name=x\,y\=z\\w"],
            "a separator in a value is escaped"
        );
    }

    #[test]
    fn a_key_changed_again_counts_from_its_latest_change() {
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 10);
        recent.record(object("a"), start);
        recent.record(object("a"), start + Duration::from_secs(20));
        // The first record leaves with the window; the second still counts.
        recent.record(object("b"), start + Duration::from_secs(40));
        assert!(recent.changed_lately(&object("a"), start + Duration::from_secs(45)));
        assert_eq!(recent.len(), 2);
    }

    #[test]
    fn records_beyond_the_capacity_drop_the_oldest() {
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 3);
        for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            recent.record(object(name), start + Duration::from_millis(i as u64));
        }
        let now = start + Duration::from_millis(10);
        assert_eq!(recent.len(), 3);
        assert!(!recent.changed_lately(&object("a"), now));
        assert!(
            ["b", "c", "d"]
                .iter()
                .all(|name| recent.changed_lately(&object(name), now))
        );
    }

    #[test]
    fn a_flood_of_one_key_keeps_it_and_stays_bounded() {
        let start = Instant::now();
        let mut recent = RecentChanges::new(WINDOW, 4);
        for i in 0..100 {
            recent.record(object("hot"), start + Duration::from_millis(i));
        }
        assert_eq!(recent.len(), 4);
        assert!(recent.changed_lately(&object("hot"), start + Duration::from_millis(100)));
    }
}
