//! Where a CR's copies are and what its source builds now: the reads `why` and `sources` share.

use crate::{cluster::Cluster, crs::AnyCr, exit::Failure};
use anyhow::Context as _;
use kube::api::{ApiResource, DynamicObject};
use serde_json::Value;
use shared::api::kind::ProjectionCr;
use shared::copy::content::CopyRules;
use shared::copy::ownership::Owner;
use shared::pass::targets::targets_of;
use shared::{
    copy::content::BuiltContent,
    inspect::copy_of::{CopyState, copy_state},
    pass::targets::NamespaceInfo,
};

/// What a CR's source builds now.
pub struct Built {
    /// The source's kind, when served.
    pub resource: Option<ApiResource>,
    /// The hash of the content its CR builds from it now, or why there is none.
    pub hash: Result<String, String>,
}

/// Reads `cr`'s source and builds its content under the CR's rules, exactly as the controller's
/// pass does (`BuiltContent::build` on the source as read).
pub async fn build_now(cluster: &Cluster, cr: &AnyCr) -> Result<Built, Failure> {
    let source = cr.view().source;
    let Some((resource, _)) = cluster.resolve_source(source).await? else {
        return Ok(Built {
            resource: None,
            hash: Err(format!("the source's kind {} is not served", source.group_kind())),
        });
    };
    let object = cluster
        .objects(&resource, &source.namespace)
        .get_opt(&source.name)
        .await
        .context("reading the source")?;
    let hash = match object {
        None => Err(format!("source {}/{} not found", source.namespace, source.name)),
        Some(object) => {
            let value = serde_json::to_value(&object).context("encoding the source")?;
            BuiltContent::build(&value, &CopyRules::of(cr.view().controls))
                .map(|built| built.hash().to_owned())
                .map_err(|refused| format!("no valid copy can be built: {}", refused.message))
        }
    };
    Ok(Built {
        resource: Some(resource),
        hash,
    })
}

/// The namespaces where `cr` keeps a copy now (written, or kept while terminating), as the
/// controller resolves them.
pub fn placements(cr: &AnyCr, namespaces: &[NamespaceInfo]) -> Result<Vec<String>, String> {
    let targets = targets_of(&cr.view(), namespaces)?;
    Ok(targets.keep().into_iter().collect())
}

/// The object at a copy's coordinates, as JSON.
pub async fn read_copy(
    cluster: &Cluster,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, Failure> {
    let found: Option<DynamicObject> = cluster
        .objects(resource, namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading {namespace}/{name}"))?;
    Ok(found
        .map(|o| serde_json::to_value(o).context("encoding a copy"))
        .transpose()?)
}

/// The state of `cr`'s copy in `namespace` of `cluster` (written from the cluster `from`, when another).
pub async fn state_in(
    (cluster, from): (&Cluster, Option<&str>),
    cr: &AnyCr,
    built: &Built,
    namespace: &str,
) -> Result<CopyState, Failure> {
    let Some(resource) = &built.resource else {
        return Ok(CopyState::Unknown {
            why: built.hash.clone().err().unwrap_or_default(),
        });
    };
    let object = read_copy(cluster, resource, namespace, cr.view().copy_name).await?;
    // A copy written from another cluster (`from`) is ours only when it names that cluster.
    let owner = match from {
        Some(from) => Owner::of_cr(&cr.view()).from_cluster(from),
        None => Owner::of_cr(&cr.view()),
    };
    Ok(copy_state(
        object.as_ref(),
        &owner,
        built.hash.as_deref().map_err(String::as_str),
    ))
}
