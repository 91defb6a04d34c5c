//! The watches that wake reconciles, started lazily per source kind; they only feed the
//! [`ObjectIndex`](crate::index::ObjectIndex), which maps each event to the CRs it concerns.
//!
//! Per kind there are:
//! - a metadata-only watch of every object of the kind, which holds nothing in memory (so memory does
//!   not grow with unrelated objects) and routes each event through the index to the CRs reading or
//!   waiting for that object;
//! - per tier (Projection, ClusterProjection), a full-object watch of our copies only, filtered on
//!   the server by the tier's ownership label, whose [`CopyStore`] lets a reconcile compare copies
//!   with their source without a GET and find every copy of an owner without a LIST. The store keeps
//!   each copy compact, trimmed to what those decisions read (`crate::cache::cached_copy`). An event of a
//!   copy that is not ours (someone edited or deleted the copy) wakes its owner from this watch,
//!   after the store has it: a reconcile woken earlier could find the copy's old state cached and
//!   leave a deleted copy missing.
//!
//! A kind the apiserver does not let the controller list or watch (HTTP 403: its RBAC does not cover
//! the kind) fails the reconcile at once, and its watches are stopped until the next attempt (see
//! `watch_errors`).
//!
//! The watches of a kind stop when no CR reads a source of that kind any more, and when its CRD is
//! deleted; when a CRD changes while its kind's watches are failing (it was deleted and created
//! again while we were not looking), they are replaced by fresh ones at once rather than left to
//! their backoff. Either way the CRs reading the kind are woken, so the next reconcile starts the
//! watches again if it still needs them.

use crate::initial_list::InitialList;
use crate::{
    cache::copy_store::{CopyStore, copy_store},
    index::{CrRef, ObjectIndex, ObjectKey},
    metrics::Metrics,
    wake::Wake,
    watch_errors::{Refusal, Refused, describe_watch_error, record, watch_backoff},
    write_journal::WriteJournal,
};
use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PartialObjectMeta},
    runtime::{
        reflector::Store,
        watcher::{self, Event},
    },
};
use shared::{
    api::{
        kind::Scope,
        source::{GroupKind, SourceKey},
    },
    shard::recent::SourceObject,
};
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::task::JoinHandle;

/// The UID label a copies-watch of `scope`'s copies filters on (the two kinds' copies carry
/// different ownership labels).
fn uid_label(scope: Scope) -> &'static str {
    match scope {
        Scope::OwnNamespace => shared::api::keys::OWNED_BY_PROJECTION_UID,
        Scope::Namespaces => shared::api::keys::OWNED_BY_CLUSTER_PROJECTION_UID,
    }
}

/// How long a reconcile waits for the watches of a kind to sync.
const SYNC_LIMIT: Duration = Duration::from_secs(30);
/// The same in another cluster, which may be gone: a pass fails sooner and retries with backoff.
const REMOTE_SYNC_LIMIT: Duration = Duration::from_secs(10);

/// Which cluster a registry watches, and what of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The CRs' own cluster: every object of a kind read as a source (metadata only), and our
    /// copies of it in every namespace.
    Local,
    /// Another cluster the copies go to (`spec.destination.kubeConfig`): only our copies, in one
    /// namespace (a Projection's, which a credential bound to that namespace may watch) or in all.
    Remote {
        /// The namespace watched; `None`: every namespace.
        namespace: Option<String>,
    },
}

struct KindWatch {
    resource: ApiResource,
    copies: HashMap<Scope, CopyStore>,
    tasks: Vec<JoinHandle<()>>,
    /// The apiserver's refusal when one of this kind's watches was refused (HTTP 403: the
    /// controller's RBAC does not let it list or watch the kind; HTTP 404: the kind is not served).
    /// Cleared by the next success.
    refused: Refusal,
    /// Whether one of this kind's watches failed its last step.
    failing: Arc<AtomicBool>,
}

impl KindWatch {
    fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }

    /// Whether this is the watch of the CRD named `crd_name` (`<plural>.<group>`).
    fn is_of_crd(&self, crd_name: &str) -> bool {
        crd_name
            .strip_prefix(self.resource.plural.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|group| group == self.resource.group)
    }
}

/// Why the watches of a kind cannot serve a reconcile.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchError {
    /// The apiserver refused to list or watch the kind (its message): missing RBAC.
    Forbidden(String),
    /// The apiserver does not serve the kind (its CRD is gone): the watches were stopped rather
    /// than left retrying; the next reconcile resolves the kind again.
    NotServed(String),
    /// The watches did not sync in time (the message for the condition).
    NotSynced(String),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forbidden(message) | Self::NotServed(message) | Self::NotSynced(message) => {
                f.write_str(message)
            }
        }
    }
}

/// The lazily started watches and their indexes.
pub struct WatchRegistry {
    client: Client,
    reach: Reach,
    metrics: Arc<Metrics>,
    wake: Wake,
    initial_list: InitialList,
    index: Arc<Mutex<ObjectIndex>>,
    kinds: Mutex<HashMap<GroupKind, KindWatch>>,
}

impl WatchRegistry {
    /// A registry of the CRs' own cluster that wakes CRs through `wake`.
    pub fn new(client: Client, metrics: Arc<Metrics>, wake: Wake, initial_list: InitialList) -> Self {
        Self::reaching(Reach::Local, client, metrics, wake, initial_list)
    }

    /// A registry of the cluster `client` reaches, as far as `reach` says.
    pub fn reaching(
        reach: Reach,
        client: Client,
        metrics: Arc<Metrics>,
        wake: Wake,
        initial_list: InitialList,
    ) -> Self {
        Self {
            client,
            reach,
            metrics,
            wake,
            initial_list,
            index: Arc::default(),
            kinds: Mutex::default(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, ObjectIndex> {
        lock(&self.index)
    }

    /// The journal of our own writes, over the same index.
    pub fn journal(&self) -> WriteJournal {
        WriteJournal::new(self.index.clone(), self.wake.clone())
    }

    /// Starts the watches of `resource`'s kind (and of `tier`'s copies of it) unless they run, and
    /// returns the store of those copies once it has synced. A refusal by the apiserver (the
    /// controller may not list or watch the kind, or the kind is not served: its CRD was deleted
    /// while discovery still listed it) ends the wait at once; the refused watches are
    /// stopped, so the next reconcile starts them anew (after the CR's backoff) instead of a
    /// watch retrying on its own.
    pub async fn ensure(
        &self,
        group_kind: &GroupKind,
        resource: &ApiResource,
        tier: Scope,
    ) -> Result<CopyStore, WatchError> {
        let (store, refused) = {
            let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
            let watch = kinds
                .entry(group_kind.clone())
                .or_insert_with(|| self.watch_kind(group_kind, resource));
            let store = match watch.copies.get(&tier) {
                Some(store) => store.clone(),
                None => {
                    let (store, task) =
                        self.watch_copies(group_kind, &watch.resource, tier, &watch.refused, &watch.failing);
                    watch.copies.insert(tier, store.clone());
                    watch.tasks.push(task);
                    store
                }
            };
            let refused = watch.refused.clone();
            self.update_gauges(&kinds);
            (store, refused)
        };
        let limit = match self.reach {
            Reach::Local => SYNC_LIMIT,
            Reach::Remote { .. } => REMOTE_SYNC_LIMIT,
        };
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready()).await {
                Ok(true) => return Ok(store),
                Ok(false) => break,
                Err(_) => {}
            }
            let refusal = refused.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(refusal) = refusal {
                self.stop_refused(group_kind, &refused);
                return Err(match refusal {
                    Refused::Forbidden(message) => WatchError::Forbidden(message),
                    Refused::NotServed(message) => {
                        WatchError::NotServed(format!("{group_kind} is not served: {message}"))
                    }
                });
            }
        }
        Err(WatchError::NotSynced(format!(
            "the watch of {group_kind} did not sync within {}s",
            limit.as_secs()
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
            watch.stop();
            tracing::info!(kind = %group_kind, "stopped the refused watches of kind");
        }
        self.update_gauges(&kinds);
    }

    /// Stops the watches of `group_kind` if no CR reads that kind any more. The index is checked
    /// under the registry's lock, so a reconcile that has just recorded its read either sees the
    /// watches still running or starts new ones.
    /// In another cluster no CR reads anything: its watches live as long as the cluster is used.
    pub fn release_if_unread(&self, group_kind: &GroupKind) {
        if self.reach != Reach::Local {
            return;
        }
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if self.index().is_read(group_kind) {
            return;
        }
        if let Some(watch) = kinds.remove(group_kind) {
            watch.stop();
            tracing::info!(kind = %group_kind, "stopped the watches of kind: no CR reads it any more");
        }
        self.update_gauges(&kinds);
    }

    /// A CRD changed (`deleted`: it is gone). Its kind's watches are stopped if it is gone, or
    /// replaced if they are failing (the kind was served again after a gap: the old watches would
    /// wait out their backoff first); the CRs reading the kind are woken to start them again.
    pub fn crd_changed(&self, crd_name: &str, deleted: bool) {
        let stopped: Vec<GroupKind> = {
            let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
            let stale: Vec<GroupKind> = kinds
                .iter()
                .filter(|(_, w)| w.is_of_crd(crd_name) && (deleted || w.failing.load(Ordering::Acquire)))
                .map(|(gk, _)| gk.clone())
                .collect();
            for group_kind in &stale {
                if let Some(watch) = kinds.remove(group_kind) {
                    watch.stop();
                    tracing::info!(kind = %group_kind, crd = crd_name, deleted, "stopped the watches of kind: its CRD changed");
                }
            }
            self.update_gauges(&kinds);
            stale
        };
        for group_kind in stopped {
            let readers = self.index().readers_of_kind(&group_kind);
            for cr in readers {
                self.wake.send(cr);
            }
        }
    }

    fn update_gauges(&self, kinds: &HashMap<GroupKind, KindWatch>) {
        // The gauges count the CRs' own cluster's watches.
        if self.reach != Reach::Local {
            return;
        }
        self.metrics.watched_gvks.set(kinds.len() as i64);
        self.metrics
            .watched_dest_gvks
            .set(kinds.values().map(|w| w.copies.len() as i64).sum());
    }

    fn watch_kind(&self, group_kind: &GroupKind, resource: &ApiResource) -> KindWatch {
        if self.reach != Reach::Local {
            // Another cluster holds no source: only the copies are watched there.
            return KindWatch {
                resource: resource.clone(),
                copies: HashMap::new(),
                tasks: Vec::new(),
                refused: Refusal::default(),
                failing: Arc::new(AtomicBool::new(false)),
            };
        }
        let all_metadata = Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), resource);
        let events = watch_backoff(crate::initial_list::watch(
            all_metadata,
            watcher::Config::default().any_semantic(),
            self.initial_list,
        ));
        let index = self.index.clone();
        let wake = self.wake.clone();
        let gk = group_kind.clone();
        let refused = Refusal::default();
        let recorder = refused.clone();
        let failing = Arc::new(AtomicBool::new(false));
        let failed = failing.clone();
        let task = tokio::spawn(async move {
            events
                .for_each(|event| {
                    record(&recorder, event.as_ref().err());
                    failed.store(event.is_err(), Ordering::Release);
                    match event {
                        Ok(Event::InitApply(o)) => {
                            let routed = lock(&index).route(&gk, &o.metadata);
                            routed.into_iter().for_each(|cr| wake.send_listed(cr));
                        }
                        Ok(Event::Apply(o) | Event::Delete(o)) => {
                            let routed = lock(&index).route(&gk, &o.metadata);
                            wake.source_changed(|| SourceObject::changed(&gk, &o.metadata));
                            routed.into_iter().for_each(|cr| wake.send(cr));
                        }
                        Ok(Event::Init | Event::InitDone) => {}
                        Err(e) => {
                            tracing::warn!(kind = %gk, error = %describe_watch_error(&e), "source watch error; retrying");
                        }
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
            failing,
        }
    }

    fn watch_copies(
        &self,
        group_kind: &GroupKind,
        resource: &ApiResource,
        tier: Scope,
        refused: &Refusal,
        failing: &Arc<AtomicBool>,
    ) -> (CopyStore, JoinHandle<()>) {
        let (copies, writer) = copy_store(shared::api::keys::FIELD_MANAGER);
        let ours = match &self.reach {
            Reach::Remote {
                namespace: Some(namespace),
            } => Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource),
            _ => Api::<DynamicObject>::all_with(self.client.clone(), resource),
        };
        let config = watcher::Config::default().labels(uid_label(tier)).any_semantic();
        let stream = watch_backoff(crate::initial_list::watch(ours, config, self.initial_list));
        let gk = group_kind.clone();
        let recorder = refused.clone();
        let failed = failing.clone();
        let index = self.index.clone();
        let wake = self.wake.clone();
        // The owners a relist's events wake are held until the relist is swapped into the store.
        let mut held: Vec<CrRef> = Vec::new();
        let task = tokio::spawn(async move {
            stream
                .for_each(move |event| {
                    record(&recorder, event.as_ref().err());
                    failed.store(event.is_err(), Ordering::Release);
                    let event = match event {
                        Ok(event) => event,
                        Err(e) => {
                            tracing::warn!(kind = %gk, error = %describe_watch_error(&e), "destination watch error; retrying");
                            return std::future::ready(());
                        }
                    };
                    // With shards, a copy of another replica's CR wakes nothing here: that CR is not in
                    // this replica's stores (every replica receives every copy event of the kind).
                    let route = |copy: &DynamicObject, deleted: bool| {
                        let uid = copy.metadata.labels.as_ref().and_then(|l| l.get(uid_label(tier)));
                        lock(&index)
                            .route_copy(&gk, &copy.metadata, deleted)
                            .filter(|_| !wake.owned_elsewhere(uid.map(String::as_str)))
                    };
                    let owner = match &event {
                        Event::Apply(copy) | Event::InitApply(copy) => route(copy, false),
                        Event::Delete(copy) => route(copy, true),
                        Event::Init => {
                            held.clear();
                            None
                        }
                        Event::InitDone => None,
                    };
                    let relisting = matches!(event, Event::InitApply(_));
                    let done = matches!(event, Event::InitDone);
                    let vanished = writer.apply(event);
                    match owner {
                        Some(owner) if relisting => held.push(owner),
                        Some(owner) => wake.send(owner),
                        None => {}
                    }
                    if done {
                        for owner in held.drain(..) {
                            wake.send_listed(owner);
                        }
                        // Deleted while the watch was down: as if their delete event had come.
                        for copy in vanished.iter().filter_map(|c| c.object()) {
                            let owner = lock(&index).route_copy(&gk, &copy.metadata, true);
                            owner.into_iter().for_each(|owner| wake.send(owner));
                        }
                    }
                    std::future::ready(())
                })
                .await;
        });
        (copies, task)
    }

    /// Records that `cr` reads `source` (replacing what it read before).
    pub fn set_reads(&self, cr: &CrRef, source: SourceKey) {
        let left = self.index().set_reads(cr, source);
        if let Some(group_kind) = left {
            self.release_if_unread(&group_kind);
        }
    }

    /// Records that `cr` reads no source, and stops the watches of the kind it read if it was the
    /// last.
    pub fn clear_reads(&self, cr: &CrRef) {
        let left = self.index().clear_reads(cr);
        if let Some(group_kind) = left {
            self.release_if_unread(&group_kind);
        }
    }

    /// Records the coordinates held by strangers that `cr` waits for (replacing the earlier set).
    pub fn set_waiting(&self, cr: &CrRef, keys: Vec<ObjectKey>) {
        self.index().set_waiting(cr, keys);
    }

    /// Records whether `cr` follows discovery of API group `group` (its source kind did not
    /// resolve, or it takes the group's preferred version), or no longer does (`None`).
    pub fn follow_discovery(&self, cr: &CrRef, group: Option<&str>) {
        self.index().follow_discovery(cr, group);
    }

    /// Wakes every CR that follows discovery of `group` (a CRD or APIService of it changed).
    pub fn wake_discovery_followers(&self, group: &str) {
        let followers = self.index().discovery_followers(group);
        for cr in followers {
            self.wake.send(cr);
        }
    }

    /// Forgets a CR that is gone, and stops the watches of the kind it read if it was the last.
    pub fn forget(&self, cr: &CrRef) {
        let read = self.index().forget(cr);
        if let Some(group_kind) = read {
            self.release_if_unread(&group_kind);
        }
    }
}

impl Drop for WatchRegistry {
    fn drop(&mut self) {
        for watch in self.kinds.lock().unwrap_or_else(|e| e.into_inner()).values() {
            watch.stop();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
