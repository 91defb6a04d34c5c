//! The watches that wake reconciles, started lazily per source kind, and the indexes that map a
//! watch event to the CRs it concerns without any API call.
//!
//! Per kind there are:
//! - a metadata-only watch of every object of the kind, which holds nothing in memory (so memory does
//!   not grow with unrelated objects) and maps each event through three indexes: the CRs reading that
//!   object as their source, the CRs waiting for those coordinates to free up (a conflict with a
//!   stranger), and the owner named by the object's ownership annotation (a copy edited or deleted by
//!   someone else);
//! - per tier (Projection, ClusterProjection), a full-object watch of our copies only, filtered on
//!   the server by the tier's ownership label, whose store lets a reconcile compare copies with their
//!   source without a GET and find every copy of an owner without a LIST.
//!
//! Our own writes are recognised by the resourceVersion they returned and wake nothing. A kind the
//! apiserver does not let the controller list or watch (HTTP 403: its RBAC does not cover the kind)
//! fails the reconcile at once, and its watches are stopped until the next attempt.

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
    crd::{ClusterProjection, Projection},
    keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION},
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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CrRef {
    /// A Projection.
    Projection(ObjectRef<Projection>),
    /// A ClusterProjection.
    Cluster(ObjectRef<ClusterProjection>),
}

impl CrRef {
    /// The CR that owns copies stamped for `owner`.
    pub fn of(owner: &Owner) -> Self {
        match owner {
            Owner::Projection { namespace, name, .. } => {
                Self::Projection(ObjectRef::new(name).within(namespace))
            }
            Owner::ClusterProjection { name, .. } => Self::Cluster(ObjectRef::new(name)),
        }
    }
}

/// Which CRs' copies a copies-watch follows (they carry different ownership labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Copies of Projections.
    Projection,
    /// Copies of ClusterProjections.
    Cluster,
}

impl Tier {
    fn uid_label(self) -> &'static str {
        match self {
            Self::Projection => shared::keys::OWNED_BY_PROJECTION_UID,
            Self::Cluster => shared::keys::OWNED_BY_CLUSTER_PROJECTION_UID,
        }
    }
}

/// Senders that wake each kind of CR.
#[derive(Clone)]
pub struct Wake {
    /// Wakes Projections.
    pub projections: UnboundedSender<ObjectRef<Projection>>,
    /// Wakes ClusterProjections.
    pub clusters: UnboundedSender<ObjectRef<ClusterProjection>>,
}

impl Wake {
    /// Queues a reconcile of `waker`.
    pub fn send(&self, waker: CrRef) {
        // A closed channel means the controller is shutting down: nothing left to wake.
        let _ = match waker {
            CrRef::Projection(r) => self.projections.send(r).map_err(|_| ()),
            CrRef::Cluster(r) => self.clusters.send(r).map_err(|_| ()),
        };
    }
}

/// How many of our own recent writes per copy are remembered: a watch lagging behind a burst of
/// writes still recognises each of them.
const REMEMBERED_WRITES: usize = 4;

/// How long a reconcile waits for the watches of a kind to sync.
const SYNC_LIMIT: Duration = Duration::from_secs(30);

/// What we did to a copy, so the watch events our own writes cause wake nothing.
#[derive(Default)]
struct Mark {
    /// The resourceVersions our recent writes produced, newest last.
    ours: std::collections::VecDeque<String>,
    /// A write is on its way: events seen meanwhile that are not known to be ours (their
    /// resourceVersion, `None` for a delete) are held until it answers.
    in_flight: Option<Vec<Option<String>>>,
    /// We deleted it.
    deleted: bool,
}

impl Mark {
    /// Whether a watch event is one of ours (or held until our write answers).
    fn absorbs(&mut self, resource_version: Option<&String>, deleted: bool) -> bool {
        if deleted && self.deleted {
            return true;
        }
        if !deleted && resource_version.is_some_and(|rv| self.ours.contains(rv)) {
            return true;
        }
        match &mut self.in_flight {
            Some(held) => {
                held.push(if deleted { None } else { resource_version.cloned() });
                true
            }
            None => false,
        }
    }
}

#[derive(Default)]
struct Indexes {
    /// Which CRs read which source.
    readers: HashMap<SourceKey, HashSet<CrRef>>,
    reads: HashMap<CrRef, SourceKey>,
    /// Which CRs wait for coordinates held by a stranger.
    waiters: HashMap<ObjectKey, HashSet<CrRef>>,
    waits: HashMap<CrRef, Vec<ObjectKey>>,
    /// CRs that follow discovery of their source's API group (their kind is unknown, or their
    /// source names no version): woken when that group's CRDs or APIServices change.
    discovery_followers: HashMap<CrRef, String>,
    /// What we last did to each copy.
    written: HashMap<ObjectKey, Mark>,
}

struct KindWatch {
    resource: ApiResource,
    copies: HashMap<Tier, Store<DynamicObject>>,
    tasks: Vec<JoinHandle<()>>,
    /// The apiserver's message when one of this kind's watches was refused (HTTP 403): the
    /// controller's RBAC does not let it list or watch the kind. Cleared by the next success.
    refused: Refusal,
}

/// Where a watch task records that the apiserver refused it.
type Refusal = Arc<Mutex<Option<String>>>;

/// Why the watches of a kind cannot serve a reconcile.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchError {
    /// The apiserver refused to list or watch the kind (its message): missing RBAC.
    Forbidden(String),
    /// The watches did not sync in time (the message for the condition).
    NotSynced(String),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forbidden(message) | Self::NotSynced(message) => f.write_str(message),
        }
    }
}

/// The apiserver's message if a watch error is a refusal (HTTP 403).
fn refusal(error: &watcher::Error) -> Option<String> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    (status.code == 403).then(|| crate::error::describe_status(status))
}

/// A watch error for the log, with the apiserver's message instead of the dump of its answer.
fn describe_watch_error(error: &watcher::Error) -> String {
    use crate::error::{describe, describe_status};
    match error {
        watcher::Error::InitialListFailed(e) => {
            format!("failed to perform initial object list: {}", describe(e))
        }
        watcher::Error::WatchStartFailed(e) => format!("failed to start watching object: {}", describe(e)),
        watcher::Error::WatchFailed(e) => format!("watch stream failed: {}", describe(e)),
        watcher::Error::WatchError(s) => {
            format!("error returned by apiserver during watch: {}", describe_status(s))
        }
        other => other.to_string(),
    }
}

/// Records the outcome of one watch step: a refusal is kept until the watch succeeds again.
fn record(refused: &Refusal, error: Option<&watcher::Error>) {
    let mut slot = refused.lock().unwrap_or_else(|e| e.into_inner());
    match error {
        Some(e) => {
            if let Some(message) = refusal(e) {
                *slot = Some(message);
            }
        }
        None => {
            if slot.is_some() {
                *slot = None;
            }
        }
    }
}

/// The lazily started watches and their indexes.
pub struct WatchRegistry {
    client: Client,
    metrics: Arc<Metrics>,
    wake: Wake,
    indexes: Arc<Mutex<Indexes>>,
    kinds: Mutex<HashMap<GroupKind, KindWatch>>,
}

impl WatchRegistry {
    /// A registry that wakes CRs through `wake`.
    pub fn new(client: Client, metrics: Arc<Metrics>, wake: Wake) -> Self {
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

    /// Starts the watches of `resource`'s kind (and of `tier`'s copies of it) unless they run, and
    /// returns the store of those copies once it has synced. A refusal by the apiserver (the
    /// controller may not list or watch the kind) ends the wait at once; the refused watches are
    /// stopped, so the next reconcile starts them anew (after the CR's backoff) instead of a
    /// watch retrying on its own.
    pub async fn ensure(
        &self,
        group_kind: &GroupKind,
        resource: &ApiResource,
        tier: Tier,
    ) -> Result<Store<DynamicObject>, WatchError> {
        let (store, refused) = {
            let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
            let watch = kinds
                .entry(group_kind.clone())
                .or_insert_with(|| self.watch_kind(group_kind, resource));
            let store = match watch.copies.get(&tier) {
                Some(store) => store.clone(),
                None => {
                    let (store, task) = self.watch_copies(group_kind, &watch.resource, tier, &watch.refused);
                    watch.copies.insert(tier, store.clone());
                    watch.tasks.push(task);
                    store
                }
            };
            let refused = watch.refused.clone();
            self.update_gauges(&kinds);
            (store, refused)
        };
        let deadline = tokio::time::Instant::now() + SYNC_LIMIT;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready()).await {
                Ok(Ok(())) => return Ok(store),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
            let message = refused.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(message) = message {
                self.stop_refused(group_kind, &refused);
                return Err(WatchError::Forbidden(message));
            }
        }
        Err(WatchError::NotSynced(format!(
            "the watch of {group_kind} did not sync within {}s",
            SYNC_LIMIT.as_secs()
        )))
    }

    /// Stops the watches of a kind the apiserver refused, unless they were replaced meanwhile.
    fn stop_refused(&self, group_kind: &GroupKind, refused: &Refusal) {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if kinds
            .get(group_kind)
            .is_some_and(|w| Arc::ptr_eq(&w.refused, refused))
            && let Some(watch) = kinds.remove(group_kind)
        {
            for task in &watch.tasks {
                task.abort();
            }
            tracing::info!(kind = %group_kind, "stopped the refused watches of kind");
        }
        self.update_gauges(&kinds);
    }

    fn update_gauges(&self, kinds: &HashMap<GroupKind, KindWatch>) {
        self.metrics.watched_gvks.set(kinds.len() as i64);
        self.metrics
            .watched_dest_gvks
            .set(kinds.values().map(|w| w.copies.len() as i64).sum());
    }

    fn watch_kind(&self, group_kind: &GroupKind, resource: &ApiResource) -> KindWatch {
        let all_metadata = Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), resource);
        let events =
            watcher::watcher(all_metadata, watcher::Config::default().any_semantic()).default_backoff();
        let indexes = self.indexes.clone();
        let wake = self.wake.clone();
        let gk = group_kind.clone();
        let refused = Refusal::default();
        let recorder = refused.clone();
        let task = tokio::spawn(async move {
            events
                .for_each(|event| {
                    record(&recorder, event.as_ref().err());
                    match event {
                        Ok(Event::Apply(o) | Event::InitApply(o)) => {
                            route(&indexes, &wake, &gk, &o.metadata, false)
                        }
                        Ok(Event::Delete(o)) => route(&indexes, &wake, &gk, &o.metadata, true),
                        Ok(Event::Init | Event::InitDone) => {}
                        Err(e) => tracing::warn!(kind = %gk, error = %describe_watch_error(&e), "source watch error; retrying"),
                    }
                    std::future::ready(())
                })
                .await;
        });
        tracing::info!(kind = %group_kind, version = %resource.version, "watching kind");
        KindWatch {
            resource: resource.clone(),
            copies: HashMap::new(),
            tasks: vec![task],
            refused,
        }
    }

    fn watch_copies(
        &self,
        group_kind: &GroupKind,
        resource: &ApiResource,
        tier: Tier,
        refused: &Refusal,
    ) -> (Store<DynamicObject>, JoinHandle<()>) {
        let writer = reflector::store::Writer::new(resource.clone());
        let copies = writer.as_reader();
        let ours = Api::<DynamicObject>::all_with(self.client.clone(), resource);
        let config = watcher::Config::default().labels(tier.uid_label()).any_semantic();
        let stream = watcher::watcher(ours, config).default_backoff().reflect(writer);
        let gk = group_kind.clone();
        let recorder = refused.clone();
        let task = tokio::spawn(async move {
            stream
                .for_each(|event| {
                    record(&recorder, event.as_ref().err());
                    if let Err(e) = event {
                        tracing::warn!(kind = %gk, error = %describe_watch_error(&e), "destination watch error; retrying");
                    }
                    std::future::ready(())
                })
                .await;
        });
        (copies, task)
    }

    /// Records that `waker` reads `source` (replacing what it read before).
    pub fn set_reads(&self, waker: &CrRef, source: SourceKey) {
        let mut ix = self.indexes();
        if let Some(old) = ix.reads.insert(waker.clone(), source.clone())
            && old != source
        {
            remove_from(&mut ix.readers, &old, waker);
        }
        ix.readers.entry(source).or_default().insert(waker.clone());
    }

    /// Records the coordinates held by strangers that `waker` waits for (replacing the earlier set).
    pub fn set_waiting(&self, waker: &CrRef, keys: Vec<ObjectKey>) {
        let mut ix = self.indexes();
        for old in ix.waits.remove(waker).unwrap_or_default() {
            remove_from(&mut ix.waiters, &old, waker);
        }
        if !keys.is_empty() {
            for key in &keys {
                ix.waiters.entry(key.clone()).or_default().insert(waker.clone());
            }
            ix.waits.insert(waker.clone(), keys);
        }
    }

    /// Records whether `waker` follows discovery of API group `group` (its source kind did not
    /// resolve, or it takes the group's preferred version), or no longer does (`None`).
    pub fn follow_discovery(&self, waker: &CrRef, group: Option<&str>) {
        let mut ix = self.indexes();
        match group {
            Some(group) => {
                ix.discovery_followers.insert(waker.clone(), group.to_owned());
            }
            None => {
                ix.discovery_followers.remove(waker);
            }
        }
    }

    /// Wakes every CR that follows discovery of `group` (a CRD or APIService of it changed).
    pub fn wake_discovery_followers(&self, group: &str) {
        let wakers: Vec<_> = self
            .indexes()
            .discovery_followers
            .iter()
            .filter(|(_, g)| g.as_str() == group)
            .map(|(w, _)| w.clone())
            .collect();
        for w in wakers {
            self.wake.send(w);
        }
    }

    /// Forgets a CR that is gone.
    pub fn forget(&self, waker: &CrRef) {
        let mut ix = self.indexes();
        if let Some(old) = ix.reads.remove(waker) {
            remove_from(&mut ix.readers, &old, waker);
        }
        for old in ix.waits.remove(waker).unwrap_or_default() {
            remove_from(&mut ix.waiters, &old, waker);
        }
        ix.discovery_followers.remove(waker);
    }

    /// Records that we are about to write a copy.
    pub fn begin_write(&self, key: ObjectKey) {
        let mut ix = self.indexes();
        let mark = ix.written.entry(key).or_default();
        mark.in_flight = Some(Vec::new());
        mark.deleted = false;
    }

    /// Records how our write of a copy ended (its resourceVersion, or `None` if it failed). Events
    /// held meanwhile that were not ours wake `owner`.
    pub fn finish_write(&self, key: ObjectKey, owner: &Owner, resource_version: Option<String>) {
        let foreign = {
            let mut ix = self.indexes();
            let mark = ix.written.entry(key).or_default();
            let held = mark.in_flight.take().unwrap_or_default();
            if let Some(rv) = resource_version {
                mark.ours.push_back(rv);
                if mark.ours.len() > REMEMBERED_WRITES {
                    mark.ours.pop_front();
                }
            }
            held.iter()
                .any(|rv| rv.as_ref().is_none_or(|rv| !mark.ours.contains(rv)))
        };
        if foreign {
            self.wake.send(CrRef::of(owner));
        }
    }

    /// Records that we are deleting a copy, so its delete event wakes nothing.
    pub fn record_delete(&self, key: ObjectKey) {
        self.indexes().written.insert(
            key,
            Mark {
                deleted: true,
                ..Mark::default()
            },
        );
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

fn remove_from<K: std::hash::Hash + Eq>(map: &mut HashMap<K, HashSet<CrRef>>, key: &K, waker: &CrRef) {
    if let Some(set) = map.get_mut(key) {
        set.remove(waker);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// The owner named by a copy's ownership annotations.
fn annotated_owner(meta: &kube::api::ObjectMeta) -> Option<CrRef> {
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

/// Maps one watch event to the CRs to wake.
fn route(
    indexes: &Mutex<Indexes>,
    wake: &Wake,
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
    let mut wakers: Vec<CrRef> = Vec::new();
    {
        let mut ix = indexes.lock().unwrap_or_else(|e| e.into_inner());
        wakers.extend(ix.readers.get(&source).into_iter().flatten().cloned());
        wakers.extend(ix.waiters.get(&key).into_iter().flatten().cloned());
        if let Some(owner) = annotated_owner(meta) {
            let ours = ix
                .written
                .get_mut(&key)
                .is_some_and(|mark| mark.absorbs(meta.resource_version.as_ref(), deleted));
            if deleted && ix.written.get(&key).is_some_and(|mark| mark.deleted) {
                // The copy is gone for good: nothing more to recognise.
                ix.written.remove(&key);
            }
            if !ours {
                wakers.push(owner);
            }
        }
    }
    for w in wakers {
        wake.send(w);
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

/// The key of an object we read or wrote.
pub fn key_of(group_kind: &GroupKind, object: &DynamicObject) -> ObjectKey {
    ObjectKey {
        group_kind: group_kind.clone(),
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> Box<kube::core::Status> {
        kube::core::Status::failure(
            "secrets is forbidden: User \"u\" cannot list resource \"secrets\"",
            "Forbidden",
        )
        .with_code(code)
        .boxed()
    }

    #[test]
    fn a_refusal_is_kept_until_the_watch_succeeds() {
        let refused = Refusal::default();
        let forbidden = watcher::Error::InitialListFailed(kube::Error::Api(status(403)));
        record(&refused, Some(&forbidden));
        assert_eq!(
            refused.lock().unwrap().as_deref(),
            Some("secrets is forbidden: User \"u\" cannot list resource \"secrets\"")
        );
        // Another failure does not clear it, a success does.
        record(
            &refused,
            Some(&watcher::Error::WatchFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_some());
        record(&refused, None);
        assert!(refused.lock().unwrap().is_none());
        // Only a 403 is a refusal.
        record(
            &refused,
            Some(&watcher::Error::InitialListFailed(kube::Error::Api(status(500)))),
        );
        assert!(refused.lock().unwrap().is_none());
        record(&refused, Some(&watcher::Error::WatchError(status(403))));
        assert!(refused.lock().unwrap().is_some());
    }
}
