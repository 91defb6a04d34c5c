//! Resolving a source's group/version/kind to an API resource through discovery, pinned or at the
//! group's preferred version. Results are cached and dropped whenever a CRD changes, so an unpinned
//! source follows a new preferred version and an unknown kind resolves as soon as its CRD is served.

use kube::{
    Client,
    core::GroupVersionKind,
    discovery::{ApiCapabilities, ApiResource, Scope},
};
use shared::api::{
    crd::{SourceRef, WrittenDestination},
    source,
};
use std::{collections::HashMap, sync::Mutex};

/// A resolved source kind.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The API resource (group, version, plural, kind).
    pub resource: ApiResource,
    /// `SourceResolved` message.
    pub message: String,
}

/// Why a source kind cannot be used.
#[derive(Debug)]
pub enum ResolveError {
    /// Discovery does not know the kind (yet), or it is cluster-scoped.
    Unusable(String),
    /// Discovery itself failed.
    Api(kube::Error),
}

/// Group, version (empty when unpinned) and kind.
type CacheKey = (String, String, String);

/// Cached discovery.
pub struct Discovery {
    client: Client,
    cache: Mutex<HashMap<CacheKey, (ApiResource, ApiCapabilities)>>,
}

impl Discovery {
    /// Discovery through `client`, with an empty cache.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::default(),
        }
    }

    /// Forgets every cached resolution (a CRD appeared, changed or went).
    pub fn invalidate(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Forgets the cached resolution of `source`'s kind (the apiserver answered that it does not
    /// serve it), so the next reconcile asks discovery again.
    pub fn forget(&self, source: &SourceRef) {
        let key = (source.group.clone(), source.version.clone(), source.kind.clone());
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
    }

    /// Resolves `source` (its group, version and kind) to a namespaced API resource.
    pub async fn resolve(&self, source: &SourceRef) -> Result<Resolved, ResolveError> {
        let key = (source.group.clone(), source.version.clone(), source.kind.clone());
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let (resource, caps) = match cached {
            Some(found) => found,
            None => {
                let found = self.lookup(source).await?;
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, found.clone());
                found
            }
        };
        if caps.scope == Scope::Cluster {
            return Err(ResolveError::Unusable(source::cluster_scoped_message(source)));
        }
        let message = source::resolved_message(source, &resource.version);
        Ok(Resolved { resource, message })
    }

    async fn lookup(&self, source: &SourceRef) -> Result<(ApiResource, ApiCapabilities), ResolveError> {
        let unknown = |detail: String| ResolveError::Unusable(source::unknown_kind_message(source, &detail));
        let classify = |e: kube::Error| match e {
            kube::Error::Discovery(d) => unknown(d.to_string()),
            kube::Error::Api(s) if s.is_not_found() => {
                unknown(format!("{} is not served", source.display_gvk()))
            }
            other => ResolveError::Api(other),
        };
        if source.version.is_empty() {
            let group = kube::discovery::group(&self.client, &source.group)
                .await
                .map_err(classify)?;
            group.recommended_kind(&source.kind).ok_or_else(|| {
                unknown(format!(
                    "no kind {} in group {:?} at its preferred version {}",
                    source.kind,
                    source.group,
                    group.preferred_version_or_latest()
                ))
            })
        } else {
            let gvk = GroupVersionKind::gvk(&source.group, &source.version, &source.kind);
            kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(classify)
        }
    }
}

/// The API resource of copies recorded in a status, or `None` when their kind is no longer served
/// (its CRD was deleted, and its objects with it); `Err` says why it could not be resolved.
pub async fn recorded_resource(
    client: &kube::Client,
    recorded: &WrittenDestination,
) -> Result<Option<ApiResource>, String> {
    let gvk = kube::core::GroupVersionKind::gvk(&recorded.group, &recorded.version, &recorded.kind);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((resource, _)) => Ok(Some(resource)),
        Err(kube::Error::Discovery(_)) => Ok(None),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
        Err(e) => {
            let error = crate::error::describe(&e);
            tracing::warn!(error, "could not resolve the recorded copies' kind");
            Err(format!("resolving the kind {}: {error}", recorded.kind))
        }
    }
}
