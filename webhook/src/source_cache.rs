//! A short-lived memory of source metadata that let a projection in, so a burst of admission
//! requests about one source reads it from the apiserver once per TTL instead of once per request.
//!
//! Its staleness can only ever allow, never deny: only a read that allowed is kept, and a kept
//! answer is used only while it is fresh and still allows. Anything that would deny (the source
//! vetoes or has not opted in) or only warn (the source does not exist yet) is read again from the
//! apiserver. So an owner who opts in is honoured at once, and one who opts out may see a
//! Projection admitted for at most the TTL; the controller re-reads the source at every reconcile
//! and refuses to copy it (`SourceOptedOut`, `SourceNotProjectable`), so nothing is ever copied
//! against the owner's policy. The size is bounded (quick_cache evicts the least useful entry).
//! The rules are pure functions; [`SourceMetadataCache`] only stores.

use kube::discovery::ApiResource;
use shared::{
    api::keys::PROJECTABLE,
    policy::projectable::{SourceMode, check_projectable},
};
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// Which source: its resource (group and plural; the version does not change the metadata), its
/// namespace and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceReadKey {
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl SourceReadKey {
    /// The source `name` of `resource` in `namespace`.
    pub fn new(resource: &ApiResource, namespace: &str, name: &str) -> Self {
        Self {
            group: resource.group.clone(),
            resource: resource.plural.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// What is kept of one read: the only annotation admission decides on, and when it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptSource {
    /// The `projection.sh/projectable` value, if the source had one.
    pub projectable: Option<String>,
    /// When the apiserver answered.
    pub read_at: Instant,
}

impl KeptSource {
    /// What is kept of `annotations` read at `read_at`.
    pub fn of(annotations: &BTreeMap<String, String>, read_at: Instant) -> Self {
        Self {
            projectable: annotations.get(PROJECTABLE).cloned(),
            read_at,
        }
    }

    /// The annotations admission decides on, as read.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.projectable
            .iter()
            .map(|value| (PROJECTABLE.to_owned(), value.clone()))
            .collect()
    }
}

/// Whether something read at `read_at` may still be used at `now` (a clock going back counts as
/// stale). A zero `ttl` keeps nothing fresh.
pub fn is_fresh(read_at: Instant, now: Instant, ttl: Duration) -> bool {
    now.checked_duration_since(read_at).is_some_and(|age| age < ttl)
}

/// Whether a source with these `annotations` (`None`: it does not exist) lets itself be projected
/// under `mode` without any warning: the only kind of read that is kept or reused.
pub fn allows(mode: SourceMode, annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some() && check_projectable(mode, annotations, "", "").is_ok()
}

/// The annotations to decide on without asking the apiserver: `kept`, if it is fresh at `now` and
/// still allows under `mode`; otherwise `None` (read the source).
pub fn reusable(
    kept: Option<&KeptSource>,
    now: Instant,
    ttl: Duration,
    mode: SourceMode,
) -> Option<BTreeMap<String, String>> {
    let kept = kept.filter(|k| is_fresh(k.read_at, now, ttl))?;
    let annotations = kept.annotations();
    allows(mode, Some(&annotations)).then_some(annotations)
}

/// The kept reads: at most `capacity`, each used for at most `ttl`.
pub struct SourceMetadataCache {
    ttl: Duration,
    mode: SourceMode,
    kept: Option<quick_cache::sync::Cache<SourceReadKey, KeptSource>>,
}

impl SourceMetadataCache {
    /// Keeps allowing reads for `ttl`, at most `capacity` of them, judged under `mode`; a zero
    /// `ttl` or `capacity` keeps nothing.
    pub fn new(ttl: Duration, capacity: usize, mode: SourceMode) -> Self {
        let enabled = !ttl.is_zero() && capacity > 0;
        Self {
            ttl,
            mode,
            kept: enabled.then(|| quick_cache::sync::Cache::new(capacity)),
        }
    }

    /// Whether anything is ever kept.
    pub fn enabled(&self) -> bool {
        self.kept.is_some()
    }

    /// The kept annotations of `key` if they may be used at `now` (see [`reusable`]).
    pub fn lookup(&self, key: &SourceReadKey, now: Instant) -> Option<BTreeMap<String, String>> {
        let kept = self.kept.as_ref()?.get(key);
        reusable(kept.as_ref(), now, self.ttl, self.mode)
    }

    /// Keeps `annotations` of `key`, read at `read_at`, if they allow; forgets an earlier read
    /// otherwise.
    pub fn remember(
        &self,
        key: SourceReadKey,
        annotations: Option<&BTreeMap<String, String>>,
        read_at: Instant,
    ) {
        let Some(kept) = &self.kept else { return };
        match annotations.filter(|_| allows(self.mode, annotations)) {
            Some(annotations) => kept.insert(key, KeptSource::of(annotations, read_at)),
            None => {
                kept.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn annotated(value: Option<&str>) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::from([("team".to_owned(), "platform".to_owned())]);
        if let Some(value) = value {
            annotations.insert(PROJECTABLE.to_owned(), value.to_owned());
        }
        annotations
    }

    fn configmaps() -> ApiResource {
        ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        }
    }

    fn key(name: &str) -> SourceReadKey {
        SourceReadKey::new(&configmaps(), "platform", name)
    }

    #[test]
    fn a_read_is_fresh_for_less_than_the_ttl_and_never_after_the_clock_went_back() {
        let t0 = Instant::now() + Duration::from_secs(100);
        for (now, ttl, fresh) in [
            (t0, TTL, true),
            (t0 + Duration::from_millis(2999), TTL, true),
            (t0 + TTL, TTL, false),
            (t0 + Duration::from_secs(60), TTL, false),
            (t0 - Duration::from_millis(1), TTL, false),
            (t0, Duration::ZERO, false),
        ] {
            assert_eq!(
                is_fresh(t0, now, ttl),
                fresh,
                "{:?} after, ttl {ttl:?}",
                now.checked_duration_since(t0)
            );
        }
    }

    #[test]
    fn only_an_existing_source_that_lets_itself_be_projected_allows() {
        use SourceMode::{Allowlist, Permissive};
        for (mode, annotations, allowed) in [
            (Allowlist, Some(annotated(Some("true"))), true),
            (Allowlist, Some(annotated(None)), false),
            (Allowlist, Some(annotated(Some("false"))), false),
            (Allowlist, Some(annotated(Some("yes"))), false),
            (Allowlist, None, false),
            (Permissive, Some(annotated(None)), true),
            (Permissive, Some(annotated(Some("true"))), true),
            (Permissive, Some(annotated(Some("false"))), false),
            // A missing source is admitted with a warning: not kept, so the warning stays current.
            (Permissive, None, false),
        ] {
            assert_eq!(
                allows(mode, annotations.as_ref()),
                allowed,
                "{mode} {annotations:?}"
            );
        }
    }

    #[test]
    fn a_kept_read_is_reused_only_while_fresh_and_only_if_it_allows() {
        use SourceMode::{Allowlist, Permissive};
        let t0 = Instant::now();
        let kept = |value: Option<&str>| KeptSource::of(&annotated(value), t0);
        let opted_in = Some(BTreeMap::from([(PROJECTABLE.to_owned(), "true".to_owned())]));
        for (kept, now, mode, reused) in [
            (
                Some(kept(Some("true"))),
                t0 + Duration::from_secs(1),
                Allowlist,
                opted_in.clone(),
            ),
            (Some(kept(Some("true"))), t0 + TTL, Allowlist, None),
            (Some(kept(None)), t0, Permissive, Some(BTreeMap::new())),
            // Would deny: read again (never kept by `remember`, refused here all the same).
            (Some(kept(None)), t0, Allowlist, None),
            (Some(kept(Some("false"))), t0, Permissive, None),
            (None, t0, Allowlist, None),
        ] {
            assert_eq!(
                reusable(kept.as_ref(), now, TTL, mode),
                reused,
                "{kept:?} under {mode}"
            );
        }
    }

    #[test]
    fn only_the_projectable_annotation_is_kept() {
        let kept = KeptSource::of(&annotated(Some("true")), Instant::now());
        assert_eq!(kept.projectable.as_deref(), Some("true"));
        assert_eq!(kept.annotations().len(), 1);
    }

    #[test]
    fn the_cache_keeps_allowing_reads_and_forgets_a_source_read_again_as_denying() {
        let t0 = Instant::now();
        let cache = SourceMetadataCache::new(TTL, 100, SourceMode::Allowlist);
        assert!(cache.enabled());
        cache.remember(key("open"), Some(&annotated(Some("true"))), t0);
        cache.remember(key("plain"), Some(&annotated(None)), t0);
        cache.remember(key("gone"), None, t0);
        assert!(cache.lookup(&key("open"), t0 + Duration::from_secs(1)).is_some());
        assert!(cache.lookup(&key("open"), t0 + TTL).is_none(), "expired");
        assert!(
            cache.lookup(&key("plain"), t0).is_none(),
            "a denying read is not kept"
        );
        assert!(
            cache.lookup(&key("gone"), t0).is_none(),
            "a missing source is not kept"
        );
        assert!(
            cache
                .lookup(&SourceReadKey::new(&configmaps(), "elsewhere", "open"), t0)
                .is_none(),
            "the namespace is part of the key"
        );
        // The owner opted out and a later read saw it: the earlier allowing read is forgotten.
        cache.remember(
            key("open"),
            Some(&annotated(Some("false"))),
            t0 + Duration::from_secs(1),
        );
        assert!(cache.lookup(&key("open"), t0 + Duration::from_secs(1)).is_none());
    }

    #[test]
    fn the_cache_stays_within_its_capacity() {
        let t0 = Instant::now();
        let cache = SourceMetadataCache::new(TTL, 10, SourceMode::Allowlist);
        for i in 0..1000 {
            cache.remember(key(&format!("source-{i}")), Some(&annotated(Some("true"))), t0);
        }
        let kept = (0..1000)
            .filter(|i| cache.lookup(&key(&format!("source-{i}")), t0).is_some())
            .count();
        assert!((1..=10).contains(&kept), "{kept} kept");
    }

    #[test]
    fn a_zero_ttl_or_capacity_keeps_nothing() {
        let t0 = Instant::now();
        for (ttl, capacity) in [(Duration::ZERO, 10), (TTL, 0)] {
            let cache = SourceMetadataCache::new(ttl, capacity, SourceMode::Allowlist);
            assert!(!cache.enabled());
            cache.remember(key("open"), Some(&annotated(Some("true"))), t0);
            assert!(cache.lookup(&key("open"), t0).is_none(), "{ttl:?}, {capacity}");
        }
    }
}
