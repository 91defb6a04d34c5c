//! The cache of our copies of one kind for one tier, fed by that tier's copies watch: one
//! [`CachedCopy`] per copy, by `<namespace>/<name>`. It stands in for kube's reflector store, which
//! would keep each copy as a whole `DynamicObject` under a key carrying the kind's whole
//! `ApiResource`; what an entry keeps and why is in `crate::cache::cached_copy`.
//!
//! Like the reflector, a relist (the watch restarted) builds the new contents aside and swaps them
//! in when it is complete, so readers never see a half-listed cache. Unlike it, the swap says which
//! copies were gone from the new list (deleted while the watch was down: no delete event tells).

use crate::cache::cached_copy::CachedCopy;
use kube::{api::DynamicObject, runtime::watcher::Event};
use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::{Hash, Hasher},
    sync::{Arc, RwLock},
};
use tokio::sync::watch;

/// A cached copy, hashed and compared by its `<namespace>/<name>` so the set needs no separate key.
#[derive(Clone, Debug)]
struct Entry(Arc<CachedCopy>);

impl Borrow<str> for Entry {
    fn borrow(&self) -> &str {
        self.0.path()
    }
}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes, so that lookups by `&str` find it (`Borrow`'s contract).
        self.0.path().hash(state);
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.path() == other.0.path()
    }
}

impl Eq for Entry {}

#[derive(Default)]
struct Contents {
    live: HashSet<Entry>,
    /// A relist in progress.
    relisting: Option<HashSet<Entry>>,
}

/// The read side, cheap to clone.
#[derive(Clone)]
pub struct CopyStore {
    contents: Arc<RwLock<Contents>>,
    ready: watch::Receiver<bool>,
}

/// The side the watch writes.
pub struct CopyStoreWriter {
    contents: Arc<RwLock<Contents>>,
    ready: watch::Sender<bool>,
    field_manager: &'static str,
}

/// An empty store, not ready until its first list is complete, and its writer; `field_manager` is
/// ours (the `managedFields` entry kept of each copy).
pub fn copy_store(field_manager: &'static str) -> (CopyStore, CopyStoreWriter) {
    let contents = Arc::<RwLock<Contents>>::default();
    let (ready, ready_rx) = watch::channel(false);
    let store = CopyStore {
        contents: contents.clone(),
        ready: ready_rx,
    };
    let writer = CopyStoreWriter {
        contents,
        ready,
        field_manager,
    };
    (store, writer)
}

impl CopyStoreWriter {
    /// Applies one watch event. Returns, when a relist completes, the copies cached before it that
    /// it did not list.
    pub fn apply(&self, event: Event<DynamicObject>) -> Vec<Arc<CachedCopy>> {
        // Encoded before the lock is taken, so readers wait for no serialization.
        let entry = |object: DynamicObject| Entry(Arc::new(CachedCopy::new(object, self.field_manager)));
        match event {
            Event::Init => self.write().relisting = Some(HashSet::new()),
            Event::InitApply(object) => {
                let entry = entry(object);
                self.write().relisting.get_or_insert_default().replace(entry);
            }
            Event::InitDone => {
                let mut contents = self.write();
                let vanished = match contents.relisting.take() {
                    Some(listed) => {
                        let before = std::mem::replace(&mut contents.live, listed);
                        before
                            .into_iter()
                            .filter(|entry| !contents.live.contains(entry))
                            .map(|entry| entry.0)
                            .collect()
                    }
                    None => Vec::new(),
                };
                drop(contents);
                self.ready.send_replace(true);
                return vanished;
            }
            Event::Apply(object) => {
                let entry = entry(object);
                self.write().live.replace(entry);
            }
            Event::Delete(object) => {
                let path = CachedCopy::path_of(
                    object.metadata.namespace.as_deref().unwrap_or_default(),
                    object.metadata.name.as_deref().unwrap_or_default(),
                );
                self.write().live.remove(path.as_str());
            }
        }
        Vec::new()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Contents> {
        self.contents.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl CopyStore {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Contents> {
        self.contents.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The copy at `namespace`/`name`, if the cache holds one.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<CachedCopy>> {
        let path = CachedCopy::path_of(namespace, name);
        self.read().live.get(path.as_str()).map(|e| e.0.clone())
    }

    /// Every cached copy.
    pub fn all(&self) -> Vec<Arc<CachedCopy>> {
        self.read().live.iter().map(|e| e.0.clone()).collect()
    }

    /// Waits until the first list is complete; `false` if the watch is gone before that.
    pub async fn wait_until_ready(&self) -> bool {
        self.ready.clone().wait_for(|ready| *ready).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;

    fn copy(namespace: &str, name: &str, resource_version: &str) -> DynamicObject {
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut object = DynamicObject::new(name, &resource).within(namespace);
        object.metadata.resource_version = Some(resource_version.into());
        object
    }

    fn versions(store: &CopyStore) -> Vec<(String, String)> {
        let mut all: Vec<_> = store
            .all()
            .iter()
            .map(|c| {
                (
                    c.path().to_owned(),
                    c.resource_version().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        all.sort();
        all
    }

    #[tokio::test]
    async fn events_keep_the_cache_in_step_and_a_relist_swaps_in_whole() {
        let (store, writer) = copy_store("me");
        assert!(!*store.ready.borrow());
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(copy("a", "cfg", "1")));
        assert!(!*store.ready.borrow(), "not before the list is complete");
        assert!(
            store.get("a", "cfg").is_none(),
            "a list in progress is not visible"
        );
        writer.apply(Event::InitDone);
        assert!(store.wait_until_ready().await);
        assert_eq!(
            store
                .get("a", "cfg")
                .and_then(|c| c.resource_version().map(str::to_owned)),
            Some("1".into())
        );

        writer.apply(Event::Apply(copy("a", "cfg", "2")));
        writer.apply(Event::Apply(copy("b", "cfg", "3")));
        assert_eq!(
            versions(&store),
            [("a/cfg".into(), "2".into()), ("b/cfg".into(), "3".into())]
        );
        writer.apply(Event::Delete(copy("a", "cfg", "4")));
        assert!(store.get("a", "cfg").is_none());

        // A relist: the old contents stay visible until it is complete, then are replaced whole,
        // and the copies it no longer lists are told.
        writer.apply(Event::Apply(copy("d", "cfg", "4")));
        writer.apply(Event::Init);
        writer.apply(Event::InitApply(copy("c", "cfg", "5")));
        writer.apply(Event::InitApply(copy("d", "cfg", "6")));
        assert_eq!(
            versions(&store),
            [("b/cfg".into(), "3".into()), ("d/cfg".into(), "4".into())]
        );
        let vanished = writer.apply(Event::InitDone);
        assert_eq!(
            versions(&store),
            [("c/cfg".into(), "5".into()), ("d/cfg".into(), "6".into())]
        );
        let vanished: Vec<&str> = vanished.iter().map(|c| c.path()).collect();
        assert_eq!(vanished, ["b/cfg"]);
        assert!(*store.ready.borrow());
    }

    #[tokio::test]
    async fn a_store_whose_watch_is_gone_is_never_ready() {
        let (store, writer) = copy_store("me");
        drop(writer);
        assert!(!store.wait_until_ready().await);
    }
}
