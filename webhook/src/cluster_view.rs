//! What admission needs to know about the cluster: a source kind's scope and resource, whether a
//! user may read the source, and the source's annotations. A trait, so the handler can be tested
//! in-process with a fixed cluster; [`KubeCluster`] is the real one, which keeps SubjectAccessReview
//! grants ([`AllowedAnswers`]) and allowing source reads ([`SourceMetadataCache`]) for a few seconds.

use crate::{
    access_cache::{AllowedAnswers, GrantKey},
    claim_watch::ClaimWatch,
    error::PolicyError,
    metrics::CacheLabels,
    source_cache::{SourceMetadataCache, SourceReadKey},
};
use arc_swap::ArcSwapOption;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::{ApiResource, Scope},
};
use prometheus_client::metrics::{counter::Counter, family::Family};
use shared::api::crd::SourceRef;
use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// The user who sent a request (from the AdmissionRequest's userInfo).
pub type UserInfo = k8s_openapi::api::authentication::v1::UserInfo;

/// What discovery says about a source kind.
#[derive(Clone, Debug, PartialEq)]
pub enum KindScope {
    /// A namespaced kind, served as this resource.
    Namespaced(ApiResource),
    /// A cluster-scoped kind: it cannot be a source.
    Cluster,
    /// Not served (yet): its CRD may come later.
    Unknown,
}

/// The cluster as admission sees it.
pub trait ClusterView: Send + Sync + 'static {
    /// The scope and resource of the source's kind (at its pinned or preferred version).
    fn resolve(&self, source: &SourceRef) -> impl Future<Output = Result<KindScope, PolicyError>> + Send;

    /// Whether `user` may `get` the object `name` of `resource` in `namespace`.
    fn can_get(
        &self,
        user: &UserInfo,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<bool, PolicyError>> + Send;

    /// The object's annotations (at least `projection.sh/projectable`, the one admission decides
    /// on), or `None` when it does not exist.
    fn annotations(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, PolicyError>> + Send;

    /// The whole object, or `None` when it does not exist or this view cannot read it (then the
    /// checks that need it are left to the controller).
    fn object(
        &self,
        _resource: &ApiResource,
        _namespace: &str,
        _name: &str,
    ) -> impl Future<Output = Result<Option<serde_json::Value>, PolicyError>> + Send {
        async { Ok(None) }
    }

    /// The index of the other CRs' claims, when there is one (overlap and loop checks).
    fn claims(&self) -> Option<&ClaimWatch> {
        None
    }
}

/// A discovery miss refreshes the snapshot at most this often (a CRD installed just before its
/// first Projection resolves at once; a typo does not hammer the apiserver).
const MISS_REFRESH_INTERVAL: Duration = Duration::from_secs(2);

/// The real cluster. Discovery is a snapshot of every served resource, refreshed in the background
/// and on a miss, so the request path makes no discovery call.
pub struct KubeCluster {
    client: Client,
    snapshot: ArcSwapOption<kube::Discovery>,
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
    claims: std::sync::OnceLock<Arc<ClaimWatch>>,
    /// SubjectAccessReview grants kept for a few seconds (see [`AllowedAnswers`]).
    granted: Mutex<AllowedAnswers>,
    /// Lookups in `granted`, by `hit` or `miss` (not counted when the cache is off).
    granted_lookups: Family<CacheLabels, Counter>,
    /// Source metadata reads that allowed, kept for a few seconds (see [`SourceMetadataCache`]).
    sources: SourceMetadataCache,
    /// Lookups in `sources`, by `hit` or `miss` (not counted when the cache is off).
    source_lookups: Family<CacheLabels, Counter>,
}

impl KubeCluster {
    /// A cluster behind `client`, with no discovery snapshot yet (see [`Self::refresh`]), keeping
    /// SubjectAccessReview grants in `granted` and allowing source reads in `sources`, and counting
    /// their lookups in `granted_lookups` and `source_lookups`.
    pub fn new(
        client: Client,
        granted: AllowedAnswers,
        granted_lookups: Family<CacheLabels, Counter>,
        sources: SourceMetadataCache,
        source_lookups: Family<CacheLabels, Counter>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            snapshot: ArcSwapOption::empty(),
            last_refresh: tokio::sync::Mutex::new(None),
            claims: std::sync::OnceLock::new(),
            granted: Mutex::new(granted),
            granted_lookups,
            sources,
            source_lookups,
        })
    }

    /// Whether a kept grant answers `question` (`None`: the cache is off).
    fn kept_grant(&self, question: &GrantKey) -> Option<bool> {
        let granted = self
            .granted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        granted
            .enabled()
            .then(|| granted.is_granted(question, Instant::now()))
    }

    fn keep_grant(&self, question: GrantKey) {
        let mut granted = self
            .granted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        granted.remember(question, Instant::now());
    }

    /// Gives admission the index of the other CRs (set once, at startup).
    pub fn know_claims(&self, claims: Arc<ClaimWatch>) {
        let _ = self.claims.set(claims);
    }

    /// Takes a new discovery snapshot.
    pub async fn refresh(&self) -> Result<(), kube::Error> {
        let mut last = self.last_refresh.lock().await;
        self.refresh_locked(&mut last).await
    }

    async fn refresh_locked(&self, last: &mut Option<Instant>) -> Result<(), kube::Error> {
        let discovery = kube::Discovery::new(self.client.clone()).run_aggregated().await?;
        self.snapshot.store(Some(Arc::new(discovery)));
        *last = Some(Instant::now());
        Ok(())
    }

    /// Refreshes unless another refresh happened within [`MISS_REFRESH_INTERVAL`] (concurrent misses
    /// wait for one refresh and share it).
    async fn refresh_after_miss(&self) -> Result<(), kube::Error> {
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|t| t.elapsed() < MISS_REFRESH_INTERVAL) {
            return Ok(());
        }
        self.refresh_locked(&mut last).await
    }

    /// Refreshes the snapshot every `interval` (kinds that went away or changed scope) until
    /// `stop` resolves.
    pub async fn refresh_every(self: Arc<Self>, interval: Duration, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = &mut stop => return,
            }
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %runtime::api_error::describe(&e), "discovery refresh failed; keeping the previous snapshot");
            }
        }
    }

    fn lookup(&self, source: &SourceRef) -> Option<KindScope> {
        let snapshot = self.snapshot.load_full()?;
        let found = if source.version.is_empty() {
            snapshot.get(&source.group)?.recommended_kind(&source.kind)
        } else {
            snapshot.resolve_gvk(&GroupVersionKind::gvk(
                &source.group,
                &source.version,
                &source.kind,
            ))
        };
        Some(match found {
            Some((_, caps)) if caps.scope == Scope::Cluster => KindScope::Cluster,
            Some((resource, _)) => KindScope::Namespaced(resource),
            None => KindScope::Unknown,
        })
    }
}

impl ClusterView for Arc<KubeCluster> {
    async fn resolve(&self, source: &SourceRef) -> Result<KindScope, PolicyError> {
        match self.lookup(source) {
            Some(KindScope::Unknown) | None => {
                self.refresh_after_miss().await.map_err(PolicyError::Discovery)?;
                Ok(self.lookup(source).unwrap_or(KindScope::Unknown))
            }
            Some(known) => Ok(known),
        }
    }

    async fn can_get(
        &self,
        user: &UserInfo,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<bool, PolicyError> {
        let question = GrantKey::new(user, resource, namespace, name, "get");
        if let Some(kept) = self.kept_grant(&question) {
            let result = if kept { "hit" } else { "miss" };
            self.granted_lookups.get_or_create(&CacheLabels { result }).inc();
            if kept {
                return Ok(true);
            }
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: question.user.clone(),
                groups: question.groups.clone(),
                uid: question.uid.clone(),
                extra: question.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(question.group.clone()),
                    resource: Some(question.resource.clone()),
                    namespace: Some(question.namespace.clone()),
                    name: Some(question.name.clone()),
                    verb: Some(question.verb.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(PolicyError::AccessReview)?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        // Only grants: a denial is asked again next time, so a new grant takes effect at once.
        if allowed {
            self.keep_grant(question);
        }
        Ok(allowed)
    }

    async fn annotations(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, PolicyError> {
        let key = SourceReadKey::new(resource, namespace, name);
        if self.sources.enabled() {
            // Only a read that allowed comes back from the cache: what would deny is read again.
            let kept = self.sources.lookup(&key, Instant::now());
            let result = if kept.is_some() { "hit" } else { "miss" };
            self.source_lookups.get_or_create(&CacheLabels { result }).inc();
            if kept.is_some() {
                return Ok(kept);
            }
        }
        // Its age counts from before the request, so a kept read is never older than the TTL.
        let read_at = Instant::now();
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource);
        let meta = api
            .get_metadata_opt(name)
            .await
            .map_err(PolicyError::SourceRead)?;
        let annotations = meta.map(|m| m.metadata.annotations.unwrap_or_default());
        self.sources.remember(key, annotations.as_ref(), read_at);
        Ok(annotations)
    }

    async fn object(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>, PolicyError> {
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, resource);
        let object = api.get_opt(name).await.map_err(PolicyError::SourceRead)?;
        Ok(object.and_then(|o| serde_json::to_value(o).ok()))
    }

    fn claims(&self) -> Option<&ClaimWatch> {
        self.claims.get().map(Arc::as_ref)
    }
}
