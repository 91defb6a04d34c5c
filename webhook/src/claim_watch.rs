//! The webhook's own index of the other CRs (SPEC §10): watches of Projections, ClusterProjections
//! and namespaces (metadata only) feed a [`ClaimIndex`], so admission warns of overlaps and denies
//! loops without listing anything per request. Only the claims are kept, never the objects. Until
//! every watch has listed once the index says nothing (no warning, no denial): admission never
//! depends on it, and an installation whose RBAC does not let the webhook watch CRs works as before.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use shared::{
    admission::claims::{
        Claim, ClaimIndex, ClaimVerdict, Claimant, KnownClusters, check, cluster_claim, cluster_targets,
        projection_claim,
    },
    api::{
        crd::{ClusterProjection, ClusterProjectionSpec, Projection},
        kind::ProjectionCr,
    },
};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    sync::{Arc, RwLock},
};

/// Namespace name → labels.
type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// What the watches have seen.
#[derive(Default)]
struct State {
    index: ClaimIndex,
    /// Which clusters the CRs' kubeconfig Secrets reach, as their statuses recorded.
    clusters: KnownClusters,
    /// ClusterProjections with a selector, re-resolved when namespaces change, with the identity
    /// of the cluster they write into that their status recorded.
    selecting: HashMap<Claimant, (ClusterProjectionSpec, Option<String>)>,
    namespaces: NamespaceLabels,
    /// Which of the three watches have listed once.
    synced: [bool; 3],
}

const PROJECTIONS: usize = 0;
const CLUSTER_PROJECTIONS: usize = 1;
const NAMESPACES: usize = 2;

impl State {
    /// Records the claim of `who`, placed by the cluster identity its status `recorded`.
    fn set(&mut self, who: Claimant, claim: Claim, recorded: Option<&str>) {
        self.clusters.learn(&claim, recorded);
        let claim = claim.placed(&self.clusters, recorded);
        self.index.set(who, claim);
    }

    fn set_cluster(&mut self, who: Claimant, spec: ClusterProjectionSpec, recorded: Option<String>) {
        let targets = cluster_targets(&spec, &self.namespaces);
        self.set(who.clone(), cluster_claim(&spec, &targets), recorded.as_deref());
        if spec.destination.namespace_selector.is_some() {
            self.selecting.insert(who, (spec, recorded));
        } else {
            self.selecting.remove(&who);
        }
    }

    fn remove(&mut self, who: &Claimant) {
        self.index.remove(who);
        self.selecting.remove(who);
    }

    /// Re-resolves the selectors against the namespaces as they are now.
    fn reselect(&mut self) {
        let selecting: Vec<_> = self.selecting.drain().collect();
        for (who, (spec, recorded)) in selecting {
            self.set_cluster(who, spec, recorded);
        }
    }
}

/// The index and the watches that keep it.
#[derive(Default)]
pub struct ClaimWatch {
    state: RwLock<State>,
}

/// The spec under review.
pub enum Candidate<'a> {
    /// A Projection in `namespace`.
    Projection {
        /// Its namespace.
        namespace: &'a str,
        /// Its spec.
        spec: &'a shared::api::crd::ProjectionSpec,
    },
    /// A ClusterProjection.
    Cluster {
        /// Its spec.
        spec: &'a ClusterProjectionSpec,
    },
}

impl ClaimWatch {
    /// Starts the three watches, after reading this cluster's identity (so that copies through a
    /// kubeconfig that reaches this very cluster are known to land here); they run until `stop`
    /// completes.
    pub fn start(client: Client, stop: impl Future<Output = ()> + Send + 'static) -> Arc<Self> {
        let watch = Arc::new(Self::default());
        let run = {
            let watch = watch.clone();
            async move {
                let this = this_cluster(&client).await;
                watch.write().clusters = KnownClusters::new(this);
                tokio::join!(
                    watch.follow_projections(client.clone()),
                    watch.follow_cluster_projections(client.clone()),
                    watch.follow_namespaces(client),
                );
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                () = run => {}
                () = stop => {}
            }
        });
        watch
    }

    /// Whether every watch has listed once.
    pub fn synced(&self) -> bool {
        self.read().synced.iter().all(|s| *s)
    }

    /// How many CRs the index holds.
    pub fn len(&self) -> usize {
        self.read().index.len()
    }

    /// Whether the index holds no CR.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The overlaps and loop of `candidate`, named `name`; nothing until synced.
    pub fn check(&self, name: &str, candidate: Candidate<'_>) -> ClaimVerdict {
        let state = self.read();
        if !state.synced.iter().all(|s| *s) {
            return ClaimVerdict::default();
        }
        let (who, claim) = match candidate {
            Candidate::Projection { namespace, spec } => (
                Claimant::Projection {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
                projection_claim(namespace, spec).placed(&state.clusters, None),
            ),
            Candidate::Cluster { spec } => (
                Claimant::ClusterProjection {
                    name: name.to_owned(),
                },
                cluster_claim(spec, &cluster_targets(spec, &state.namespaces)).placed(&state.clusters, None),
            ),
        };
        check(&state.index, &who, &claim)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    async fn follow_projections(&self, client: Client) {
        let mut relisted: HashSet<Claimant> = HashSet::new();
        let mut events = watcher(Api::<Projection>::all(client), watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Some(event) = ok_or_log(event, "projections") else {
                continue;
            };
            let who = |p: &Projection| Claimant::Projection {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
            };
            let mut state = self.write();
            match event {
                watcher::Event::Init => relisted.clear(),
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let namespace = p.namespace().unwrap_or_default();
                    relisted.insert(who(&p));
                    let recorded = recorded_identity(&p);
                    state.set(
                        who(&p),
                        projection_claim(&namespace, &p.spec),
                        recorded.as_deref(),
                    );
                }
                watcher::Event::Delete(p) => state.remove(&who(&p)),
                watcher::Event::InitDone => {
                    forget_unlisted(&mut state, &relisted, |c| {
                        matches!(c, Claimant::Projection { .. })
                    });
                    state.synced[PROJECTIONS] = true;
                    tracing::info!(
                        listed = relisted.len(),
                        indexed = state.index.len(),
                        "CR index: Projections listed"
                    );
                }
            }
        }
    }

    async fn follow_cluster_projections(&self, client: Client) {
        let mut relisted: HashSet<Claimant> = HashSet::new();
        let mut events = watcher(Api::<ClusterProjection>::all(client), watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Some(event) = ok_or_log(event, "clusterprojections") else {
                continue;
            };
            let who = |cp: &ClusterProjection| Claimant::ClusterProjection { name: cp.name_any() };
            let mut state = self.write();
            match event {
                watcher::Event::Init => relisted.clear(),
                watcher::Event::Apply(cp) | watcher::Event::InitApply(cp) => {
                    relisted.insert(who(&cp));
                    let recorded = recorded_identity(&cp);
                    state.set_cluster(who(&cp), cp.spec, recorded);
                }
                watcher::Event::Delete(cp) => state.remove(&who(&cp)),
                watcher::Event::InitDone => {
                    forget_unlisted(&mut state, &relisted, |c| {
                        matches!(c, Claimant::ClusterProjection { .. })
                    });
                    state.synced[CLUSTER_PROJECTIONS] = true;
                    tracing::info!(
                        listed = relisted.len(),
                        indexed = state.index.len(),
                        "CR index: ClusterProjections listed"
                    );
                }
            }
        }
    }

    async fn follow_namespaces(&self, client: Client) {
        let mut listing = NamespaceLabels::new();
        let mut events = watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        while let Some(event) = events.next().await {
            let Some(event) = ok_or_log(event, "namespaces") else {
                continue;
            };
            let mut state = self.write();
            match event {
                watcher::Event::Init => listing.clear(),
                watcher::Event::InitApply(ns) => {
                    listing.insert(ns.name_any(), ns.labels().clone());
                }
                watcher::Event::InitDone => {
                    state.namespaces = std::mem::take(&mut listing);
                    state.synced[NAMESPACES] = true;
                    tracing::info!(listed = state.namespaces.len(), "CR index: namespaces listed");
                    state.reselect();
                }
                watcher::Event::Apply(ns) => {
                    let labels = ns.labels().clone();
                    if state.namespaces.insert(ns.name_any(), labels.clone()) != Some(labels) {
                        state.reselect();
                    }
                }
                watcher::Event::Delete(ns) => {
                    state.namespaces.remove(&ns.name_any());
                    state.reselect();
                }
            }
        }
    }
}

/// The identity of the cluster a CR's copies were written to, as its status recorded it.
fn recorded_identity<K: ProjectionCr>(cr: &K) -> Option<String> {
    cr.view().recorded()?.cluster_identity.clone()
}

/// This cluster's identity, as the controller stamps it on copies elsewhere; `None` when the
/// webhook may not read it (then no kubeconfig is known to reach this cluster). Asked a few times:
/// the apiserver may not answer yet while the webhook starts.
async fn this_cluster(client: &Client) -> Option<String> {
    for attempt in 1..=5u32 {
        match runtime::cluster_identity::read(client).await {
            Ok(identity) => return Some(identity).filter(|i| !i.is_empty()),
            Err(kube::Error::Api(status)) => {
                tracing::info!(
                    code = status.code,
                    "CR index: this cluster's identity is not readable; copies through a kubeconfig are placed by their Secret"
                );
                return None;
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, "CR index: reading this cluster's identity failed");
                tokio::time::sleep(std::time::Duration::from_secs(u64::from(attempt))).await;
            }
        }
    }
    None
}

/// After a relist: forgets the CRs of one kind (`of_kind`) that the list no longer holds.
fn forget_unlisted(state: &mut State, listed: &HashSet<Claimant>, of_kind: impl Fn(&Claimant) -> bool) {
    let gone: Vec<Claimant> = state
        .index
        .claimants()
        .filter(|c| of_kind(c) && !listed.contains(*c))
        .cloned()
        .collect();
    for who in gone {
        state.remove(&who);
    }
}

fn ok_or_log<T>(event: Result<T, watcher::Error>, what: &str) -> Option<T> {
    match event {
        Ok(event) => Some(event),
        Err(e) => {
            let error = runtime::api_error::describe_watch_error(&e);
            tracing::warn!(watch = what, error, "watch of the CR index failed; retrying");
            None
        }
    }
}
