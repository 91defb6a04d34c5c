//! The watches that wake reconciles, started lazily per source kind, and the indexes that map a
//! watch event to the CRs it concerns without any API call.
//!
//! Per kind there are two watches:
//! - a metadata-only watch of every object of the kind, which holds nothing in memory (so memory does
//!   not grow with unrelated objects) and maps each event through three indexes: the CRs reading that
//!   object as their source, the CRs waiting for those coordinates to free up (a conflict with a
//!   stranger), and the owner named by the object's ownership annotation (a copy edited or deleted by
//!   someone else);
//! - a full-object watch of our copies only, filtered on the server by the ownership label, whose
//!   store lets a reconcile compare a copy with its source without a GET.
//!
//! Our own writes are recognised by the resourceVersion they returned and wake nothing.

use crate::metrics::Metrics;
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, PartialObjectMeta},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, Event},
    },
};
use shared::{
    crd::Projection,
    keys::{OWNED_BY_PROJECTION, OWNED_BY_PROJECTION_UID},
    ownership::Owner,
    source::{GroupKind, SourceKey},
};
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{sync::mpsc::UnboundedSender, task::JoinHandle};

/// Coordinates of one object of a kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Its group and kind.
    pub group_kind: GroupKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A CR that can be woken.
pub type Waker = ObjectRef<Projection>;

/// What we last did to a copy, so the watch events our own writes cause wake nothing.
enum Mark {
    /// A write is on its way: events seen meanwhile (their resourceVersion, `None` for a delete) are
    /// held until it answers, since its resourceVersion is not known yet.
    InFlight(Vec<Option<String>>),
    /// Our last write produced this resourceVersion.
    Wrote(String),
    /// We deleted it.
    Deleted,
}

#[derive(Default)]
struct Indexes {
    /// Which CRs read which source.
    readers: HashMap<SourceKey, HashSet<Waker>>,
    reads: HashMap<Waker, SourceKey>,
    /// Which CRs wait for coordinates held by a stranger.
    waiters: HashMap<ObjectKey, HashSet<Waker>>,
    waits: HashMap<Waker, ObjectKey>,
    /// CRs whose source kind is unknown; woken when a CRD changes.
    unresolved: HashSet<Waker>,
    /// What we last did to each copy.
    written: HashMap<ObjectKey, Mark>,
}

struct KindWatch {
    copies: Store<DynamicObject>,
    tasks: Vec<JoinHandle<()>>,
}

/// The lazily started watches and their indexes.
pub struct WatchRegistry {
    client: Client,
    metrics: Arc<Metrics>,
    wake: UnboundedSender<Waker>,
    indexes: Arc<Mutex<Indexes>>,
    kinds: Mutex<HashMap<GroupKind, KindWatch>>,
}

impl WatchRegistry {
    /// A registry that wakes CRs through `wake`.
    pub fn new(client: Client, metrics: Arc<Metrics>, wake: UnboundedSender<Waker>) -> Self {
        Self {
            client,
            metrics,
            wake,
            indexes: Arc::default(),
            kinds: Mutex::default(),
        }
    }

    fn indexes(&self) -> std::sync::MutexGuard<'_, Indexes> {
        self.indexes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the watches of `resource`'s kind unless they run, and returns the store of our copies
    /// of that kind once it has synced.
    pub async fn ensure(
        &self,
        group_kind: &GroupKind,
        resource: &ApiResource,
    ) -> Result<Store<DynamicObject>, String> {
        let store = {
            let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
            match kinds.get(group_kind) {
                Some(w) => w.copies.clone(),
                None => {
                    let watch = self.start(group_kind.clone(), resource);
                    let store = watch.copies.clone();
                    kinds.insert(group_kind.clone(), watch);
                    self.metrics.watched_gvks.set(kinds.len() as i64);
                    self.metrics.watched_dest_gvks.set(kinds.len() as i64);
                    store
                }
            }
        };
        if !store_ready(&store, Duration::from_secs(30)).await {
            return Err(format!("the watch of {group_kind} did not sync within 30s"));
        }
        Ok(store)
    }

    fn start(&self, group_kind: GroupKind, resource: &ApiResource) -> KindWatch {
        let all_metadata = Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), resource);
        let events =
            watcher::watcher(all_metadata, watcher::Config::default().any_semantic()).default_backoff();
        let indexes = self.indexes.clone();
        let wake = self.wake.clone();
        let gk = group_kind.clone();
        let metadata_task = tokio::spawn(async move {
            events
                .for_each(|event| {
                    match event {
                        Ok(Event::Apply(o) | Event::InitApply(o)) => {
                            route(&indexes, &wake, &gk, &o.metadata, false)
                        }
                        Ok(Event::Delete(o)) => route(&indexes, &wake, &gk, &o.metadata, true),
                        Ok(Event::Init | Event::InitDone) => {}
                        Err(e) => tracing::warn!(kind = %gk, error = %e, "source watch error; retrying"),
                    }
                    std::future::ready(())
                })
                .await;
        });

        let writer = reflector::store::Writer::new(resource.clone());
        let copies = writer.as_reader();
        let ours = Api::<DynamicObject>::all_with(self.client.clone(), resource);
        let config = watcher::Config::default()
            .labels(OWNED_BY_PROJECTION_UID)
            .any_semantic();
        let copies_stream = watcher::watcher(ours, config).default_backoff().reflect(writer);
        let gk = group_kind.clone();
        let copies_task = tokio::spawn(async move {
            copies_stream
                .for_each(|event| {
                    if let Err(e) = event {
                        tracing::warn!(kind = %gk, error = %e, "destination watch error; retrying");
                    }
                    std::future::ready(())
                })
                .await;
        });
        tracing::info!(kind = %group_kind, version = %resource.version, "watching kind");
        KindWatch {
            copies,
            tasks: vec![metadata_task, copies_task],
        }
    }

    /// Records that `waker` reads `source` (replacing what it read before).
    pub fn set_reads(&self, waker: &Waker, source: SourceKey) {
        let mut ix = self.indexes();
        if let Some(old) = ix.reads.insert(waker.clone(), source.clone())
            && old != source
        {
            remove_from(&mut ix.readers, &old, waker);
        }
        ix.readers.entry(source).or_default().insert(waker.clone());
    }

    /// Records that `waker` waits for `key` to be freed by a stranger (or stops waiting).
    pub fn set_waiting(&self, waker: &Waker, key: Option<ObjectKey>) {
        let mut ix = self.indexes();
        if let Some(old) = ix.waits.remove(waker) {
            remove_from(&mut ix.waiters, &old, waker);
        }
        if let Some(key) = key {
            ix.waits.insert(waker.clone(), key.clone());
            ix.waiters.entry(key).or_default().insert(waker.clone());
        }
    }

    /// Records whether `waker`'s source kind failed to resolve.
    pub fn set_unresolved(&self, waker: &Waker, unresolved: bool) {
        let mut ix = self.indexes();
        if unresolved {
            ix.unresolved.insert(waker.clone());
        } else {
            ix.unresolved.remove(waker);
        }
    }

    /// Wakes every CR whose source kind did not resolve (a CRD changed).
    pub fn wake_unresolved(&self) {
        let wakers: Vec<_> = self.indexes().unresolved.iter().cloned().collect();
        for w in wakers {
            let _ = self.wake.send(w);
        }
    }

    /// Forgets a CR that is gone.
    pub fn forget(&self, waker: &Waker) {
        let mut ix = self.indexes();
        if let Some(old) = ix.reads.remove(waker) {
            remove_from(&mut ix.readers, &old, waker);
        }
        if let Some(old) = ix.waits.remove(waker) {
            remove_from(&mut ix.waiters, &old, waker);
        }
        ix.unresolved.remove(waker);
    }

    /// Records that we are about to write a copy.
    pub fn begin_write(&self, key: ObjectKey) {
        self.indexes().written.insert(key, Mark::InFlight(Vec::new()));
    }

    /// Records how our write of a copy ended (its resourceVersion, or `None` if it failed). Events
    /// held meanwhile that were not ours wake `owner`.
    pub fn finish_write(&self, key: ObjectKey, owner: &Owner, resource_version: Option<String>) {
        let held = {
            let mut ix = self.indexes();
            let held = match ix.written.remove(&key) {
                Some(Mark::InFlight(held)) => held,
                _ => Vec::new(),
            };
            if let Some(rv) = &resource_version {
                ix.written.insert(key, Mark::Wrote(rv.clone()));
            }
            held
        };
        let foreign = held.iter().any(|rv| rv.is_none() || *rv != resource_version);
        if foreign && let Some(waker) = waker_of(owner) {
            let _ = self.wake.send(waker);
        }
    }

    /// Records that we are deleting a copy, so its delete event wakes nothing.
    pub fn record_delete(&self, key: ObjectKey) {
        self.indexes().written.insert(key, Mark::Deleted);
    }
}

impl Drop for WatchRegistry {
    fn drop(&mut self) {
        for watch in self.kinds.lock().unwrap_or_else(|e| e.into_inner()).values() {
            for task in &watch.tasks {
                task.abort();
            }
        }
    }
}

fn remove_from<K: std::hash::Hash + Eq>(map: &mut HashMap<K, HashSet<Waker>>, key: &K, waker: &Waker) {
    if let Some(set) = map.get_mut(key) {
        set.remove(waker);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// Maps one watch event to the CRs to wake.
fn route(
    indexes: &Mutex<Indexes>,
    wake: &UnboundedSender<Waker>,
    group_kind: &GroupKind,
    meta: &kube::api::ObjectMeta,
    deleted: bool,
) {
    let (Some(namespace), Some(name)) = (meta.namespace.clone(), meta.name.clone()) else {
        return;
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
    let mut wakers: Vec<Waker> = Vec::new();
    {
        let mut ix = indexes.lock().unwrap_or_else(|e| e.into_inner());
        wakers.extend(ix.readers.get(&source).into_iter().flatten().cloned());
        wakers.extend(ix.waiters.get(&key).into_iter().flatten().cloned());
        if let Some(owner) = meta.annotations.as_ref().and_then(|a| a.get(OWNED_BY_PROJECTION)) {
            let ours = match (ix.written.get_mut(&key), deleted) {
                (Some(Mark::InFlight(held)), _) => {
                    held.push(if deleted {
                        None
                    } else {
                        meta.resource_version.clone()
                    });
                    true
                }
                (Some(Mark::Wrote(rv)), false) => Some(&*rv) == meta.resource_version.as_ref(),
                (Some(Mark::Deleted), true) => {
                    ix.written.remove(&key);
                    true
                }
                _ => false,
            };
            if !ours && let Some((ns, n)) = owner.split_once('/') {
                wakers.push(ObjectRef::new(n).within(ns));
            }
        }
    }
    for w in wakers {
        let _ = wake.send(w);
    }
}

/// Waits until `store` has synced, up to `limit`. `Store::wait_until_ready` wakes only the last of
/// several concurrent waiters (it parks on a oneshot receiver), so every waiter re-polls briefly.
pub async fn store_ready<K>(store: &Store<K>, limit: Duration) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready()).await {
            Ok(Ok(())) => return true,
            Ok(Err(_)) => return false,
            Err(_) => {}
        }
    }
    false
}

/// The CR to wake about a copy of `owner`.
pub fn waker_of(owner: &Owner) -> Option<Waker> {
    match owner {
        Owner::Projection { namespace, name, .. } => Some(ObjectRef::new(name).within(namespace)),
        Owner::ClusterProjection { .. } => None,
    }
}

/// The key of an object we read or wrote.
pub fn key_of(group_kind: &GroupKind, object: &DynamicObject) -> ObjectKey {
    ObjectKey {
        group_kind: group_kind.clone(),
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}
