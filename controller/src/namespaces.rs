//! The namespaces of the cluster as ClusterProjections see them (names, labels, whether they are
//! being deleted), kept from a metadata-only watch, and the index that maps a namespace event to the
//! ClusterProjections it concerns: those listing the namespace by name, and those whose selector
//! matched its labels before or after the event. No API call, and no scan of ClusterProjections
//! that list other namespaces.

use crate::watches::{CrRef, Wake};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::ObjectRef,
        watcher::{self, Event},
    },
};
use shared::{
    crd::ClusterProjection,
    targets::{NamespaceInfo, TargetRule},
};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
};
use tokio::sync::watch;

type Cp = ObjectRef<ClusterProjection>;

#[derive(Default)]
struct State {
    namespaces: BTreeMap<String, NamespaceInfo>,
    /// Namespaces seen during a relist, swapped in when it completes.
    relisting: Option<BTreeMap<String, NamespaceInfo>>,
    rules: HashMap<Cp, Arc<TargetRule>>,
    listing: HashMap<String, HashSet<Cp>>,
    selecting: HashSet<Cp>,
}

/// The namespace cache and index.
pub struct Namespaces {
    state: Mutex<State>,
    synced: watch::Sender<bool>,
}

impl Namespaces {
    /// An empty cache; [`Namespaces::run`] fills it.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            synced: watch::Sender::new(false),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches namespaces until the task is aborted, waking the ClusterProjections each event
    /// concerns.
    pub async fn run(self: Arc<Self>, client: Client, wake: Wake) {
        let api = Api::<PartialObjectMeta<Namespace>>::all(client);
        watcher::watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .for_each(|event| {
                match event {
                    Ok(event) => {
                        for cp in self.apply(event) {
                            wake.send(CrRef::Cluster(cp));
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "namespace watch error; retrying"),
                }
                std::future::ready(())
            })
            .await;
    }

    /// Applies one watch event and returns the ClusterProjections to wake.
    fn apply(&self, event: Event<PartialObjectMeta<Namespace>>) -> Vec<Cp> {
        let mut state = self.state();
        match event {
            Event::Init => {
                state.relisting = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(ns) => {
                let info = info_of(&ns);
                if let Some(relist) = state.relisting.as_mut() {
                    relist.insert(info.name.clone(), info);
                }
                Vec::new()
            }
            Event::InitDone => {
                let fresh = state.relisting.take().unwrap_or_default();
                let changed = fresh != state.namespaces;
                state.namespaces = fresh;
                drop(state);
                self.synced.send_replace(true);
                // After a relist anything may have changed while the watch was down.
                if changed {
                    self.state().rules.keys().cloned().collect()
                } else {
                    Vec::new()
                }
            }
            Event::Apply(ns) => {
                let info = info_of(&ns);
                let old = state.namespaces.insert(info.name.clone(), info.clone());
                if old.as_ref() == Some(&info) {
                    return Vec::new();
                }
                concerned(&state, &info.name, old.as_ref(), Some(&info))
            }
            Event::Delete(ns) => {
                let info = info_of(&ns);
                let old = state.namespaces.remove(&info.name);
                concerned(&state, &info.name, old.as_ref(), None)
            }
        }
    }

    /// Waits until the first list of namespaces is in.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// Every namespace now.
    pub fn snapshot(&self) -> Vec<NamespaceInfo> {
        self.state().namespaces.values().cloned().collect()
    }

    /// Records (or replaces) which namespaces `cp` targets.
    pub fn set_rule(&self, cp: &Cp, rule: Arc<TargetRule>) {
        let mut state = self.state();
        forget_rule(&mut state, cp);
        match &*rule {
            TargetRule::List(names) => {
                for name in names {
                    state.listing.entry(name.clone()).or_default().insert(cp.clone());
                }
            }
            TargetRule::Selector(_) => {
                state.selecting.insert(cp.clone());
            }
        }
        state.rules.insert(cp.clone(), rule);
    }

    /// Forgets a ClusterProjection that is gone (or has no valid rule).
    pub fn forget(&self, cp: &Cp) {
        forget_rule(&mut self.state(), cp);
    }
}

fn forget_rule(state: &mut State, cp: &Cp) {
    if let Some(old) = state.rules.remove(cp) {
        match &*old {
            TargetRule::List(names) => {
                for name in names {
                    if let Some(set) = state.listing.get_mut(name) {
                        set.remove(cp);
                        if set.is_empty() {
                            state.listing.remove(name);
                        }
                    }
                }
            }
            TargetRule::Selector(_) => {
                state.selecting.remove(cp);
            }
        }
    }
}

/// The ClusterProjections that list `name`, or whose selector matched it before or matches it now.
fn concerned(
    state: &State,
    name: &str,
    before: Option<&NamespaceInfo>,
    after: Option<&NamespaceInfo>,
) -> Vec<Cp> {
    let mut cps: Vec<Cp> = state.listing.get(name).into_iter().flatten().cloned().collect();
    for cp in &state.selecting {
        let Some(rule) = state.rules.get(cp) else { continue };
        if [before, after]
            .into_iter()
            .flatten()
            .any(|ns| rule.selects(name, &ns.labels))
        {
            cps.push(cp.clone());
        }
    }
    cps
}

fn info_of(ns: &PartialObjectMeta<Namespace>) -> NamespaceInfo {
    NamespaceInfo {
        name: ns.metadata.name.clone().unwrap_or_default(),
        labels: ns.metadata.labels.clone().unwrap_or_default(),
        terminating: ns.metadata.deletion_timestamp.is_some(),
    }
}
