//! The namespace watch: a metadata-only watch of every namespace that feeds the
//! [`NamespaceIndex`] and wakes the ClusterProjections each event concerns.

use crate::initial_list::InitialList;
use crate::{
    index::{CrRef, NamespaceIndex},
    wake::Wake,
};
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
    api::crd::{ClusterProjection, SourceRef},
    pass::targets::{NamespaceInfo, TargetRule, Targets},
};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

type Cp = ObjectRef<ClusterProjection>;

/// The namespace cache and index, shared by the watch task and the reconcilers.
pub struct Namespaces {
    index: Mutex<NamespaceIndex>,
    synced: watch::Sender<bool>,
}

impl Namespaces {
    /// An empty cache; [`Namespaces::run`] fills it.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            index: Mutex::default(),
            synced: watch::Sender::new(false),
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, NamespaceIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches namespaces until the task is aborted, waking the ClusterProjections each event
    /// concerns.
    pub async fn run(self: Arc<Self>, client: Client, wake: Wake, initial: InitialList) {
        let api = Api::<PartialObjectMeta<Namespace>>::all(client);
        crate::initial_list::watch(api, watcher::Config::default().any_semantic(), initial)
            .default_backoff()
            .for_each(|event| {
                match event {
                    Ok(event) => {
                        for cp in self.apply(event) {
                            wake.send(CrRef::Cluster(cp));
                        }
                    }
                    Err(e) => tracing::warn!(error = %crate::watch_errors::describe_watch_error(&e), "namespace watch error; retrying"),
                }
                std::future::ready(())
            })
            .await;
    }

    /// Feeds one watch event to the index and returns the ClusterProjections to wake.
    fn apply(&self, event: Event<PartialObjectMeta<Namespace>>) -> Vec<Cp> {
        let mut index = self.index();
        match event {
            Event::Init => {
                index.relist_started();
                Vec::new()
            }
            Event::InitApply(ns) => {
                index.relisted(info_of(&ns));
                Vec::new()
            }
            Event::InitDone => {
                let woken = index.relist_done();
                drop(index);
                self.synced.send_replace(true);
                woken
            }
            Event::Apply(ns) => index.applied(info_of(&ns)),
            Event::Delete(ns) => index.deleted(&info_of(&ns).name),
        }
    }

    /// Waits until the first list of namespaces is in.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// The targets of `rule` among the namespaces now (resolved under the lock: a pass over 1000
    /// namespaces copies none of them).
    pub fn resolve(&self, rule: &TargetRule, source: Option<&SourceRef>, copy_name: &str) -> Targets {
        rule.resolve(self.index().all(), source, copy_name)
    }

    /// Records (or replaces) which namespaces `cp` targets.
    pub fn set_rule(&self, cp: &Cp, rule: Arc<TargetRule>) {
        self.index().set_rule(cp, rule);
    }

    /// Forgets a ClusterProjection that is gone (or has no valid rule).
    pub fn forget(&self, cp: &Cp) {
        self.index().forget(cp);
    }
}

fn info_of(ns: &PartialObjectMeta<Namespace>) -> NamespaceInfo {
    NamespaceInfo {
        name: ns.metadata.name.clone().unwrap_or_default(),
        labels: ns.metadata.labels.clone().unwrap_or_default(),
        terminating: ns.metadata.deletion_timestamp.is_some(),
    }
}
