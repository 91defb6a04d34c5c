//! The cluster as the plugin reads it: kubectl's kubeconfig and context resolution, discovery of the
//! served kinds, and the CRs.

use crate::{cli::Global, exit::Failure};
use anyhow::Context as _;
use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Namespace},
    apimachinery::pkg::apis::meta::v1::APIResourceList,
};
use kube::{
    Api, Client, Config,
    api::{ApiResource, DynamicObject, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use shared::{
    api::{
        crd::{ClusterProjection, Projection, SourceRef},
        source::GroupKind,
    },
    inspect::resource_name::{Served, resolve, split_reference},
    pass::targets::NamespaceInfo,
};

/// The answer to a request the user may not be allowed to make: `None` when the apiserver refused it
/// (HTTP 403), said in one `note:` line on stderr (what a tenant may not read is skipped, never an
/// error when the rest answers); any other failure is an error, with `what` was being done.
pub fn unless_forbidden<T>(
    answer: Result<T, kube::Error>,
    note: impl FnOnce() -> String,
    what: &str,
) -> Result<Option<T>, Failure> {
    match answer {
        Ok(value) => Ok(Some(value)),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            eprintln!("note: {}", note());
            Ok(None)
        }
        Err(e) => Err(anyhow::Error::new(e).context(what.to_owned()).into()),
    }
}

/// An object named on the command line as `KIND/NAME` (in the namespace of `-n`).
pub struct Named {
    /// The connection.
    pub cluster: Cluster,
    /// Its kind.
    pub resource: ApiResource,
    /// Its group and kind.
    pub group_kind: GroupKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The object as stored, as JSON; `None` when it does not exist.
    pub object: Option<serde_json::Value>,
}

impl Named {
    /// Connects and reads the object `reference` (`KIND/NAME`) names.
    pub async fn read(global: &Global, reference: &str) -> Result<Self, Failure> {
        let (kind_name, name) = split_reference(reference).map_err(Failure::Usage)?;
        let cluster = Cluster::connect(global).await?;
        let resource = cluster.resolve_name(kind_name).await?;
        let namespace = cluster.namespace.clone();
        let object = cluster
            .objects(&resource, &namespace)
            .get_opt(name)
            .await
            .with_context(|| format!("reading {} {namespace}/{name}", resource.kind))?
            .map(serde_json::to_value)
            .transpose()
            .context("encoding the object")?;
        Ok(Self {
            group_kind: GroupKind {
                group: resource.group.clone(),
                kind: resource.kind.clone(),
            },
            cluster,
            resource,
            namespace,
            name: name.to_owned(),
            object,
        })
    }
}

/// A connection to the cluster and the namespace commands default to.
pub struct Cluster {
    pub client: Client,
    /// What `client` was made from (another client can impersonate from it).
    pub config: Config,
    /// `-n`, else the context's namespace, else `default`.
    pub namespace: String,
    /// `-A`.
    pub all_namespaces: bool,
}

/// `--as` and `--as-group`, as kubectl takes them: groups only with a user.
fn impersonate(config: &mut Config, global: &Global) -> Result<(), Failure> {
    match &global.as_user {
        Some(user) => {
            config.auth_info.impersonate = Some(user.clone());
            if !global.as_groups.is_empty() {
                config.auth_info.impersonate_groups = Some(global.as_groups.clone());
            }
            Ok(())
        }
        None if !global.as_groups.is_empty() => Err(Failure::Usage(
            "--as-group needs --as: the groups are those of the user impersonated".to_owned(),
        )),
        None => Ok(()),
    }
}

impl Cluster {
    /// Connects as kubectl would: `--kubeconfig`, else `$KUBECONFIG` (several files merged), else
    /// `~/.kube/config`, else the in-cluster ServiceAccount; `--context` picks the context.
    pub async fn connect(global: &Global) -> Result<Self, Failure> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &global.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .context("invalid kubeconfig")?
            }
            None => match Config::from_kubeconfig(&options).await {
                Ok(config) => config,
                Err(e) if global.context.is_some() => {
                    return Err(anyhow::Error::new(e).context("invalid kubeconfig").into());
                }
                Err(e) => Config::incluster()
                    .map_err(|_| anyhow::Error::new(e).context("no kubeconfig, and not in a cluster"))?,
            },
        };
        let mut config = config;
        impersonate(&mut config, global)?;
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let mut timeouts = runtime::kube_client::Timeouts::for_config(&config);
        if let Some(limit) = global.request_timeout {
            // kubectl's 0 is no limit: a day stands for it.
            let limit = if limit.is_zero() {
                std::time::Duration::from_secs(24 * 3600)
            } else {
                limit
            };
            (timeouts.response, timeouts.read, timeouts.write) = (limit, limit, limit);
        }
        let client = runtime::kube_client::client_with_timeouts(config.clone(), timeouts)
            .context("cannot build the client")?;
        Ok(Self {
            client,
            config,
            namespace,
            all_namespaces: global.all_namespaces,
        })
    }

    /// Every kind the server serves at its groups' preferred versions (what kubectl resolves names
    /// against).
    pub async fn served(&self) -> Result<Vec<Served>, Failure> {
        let mut served = Vec::new();
        let core = self
            .client
            .list_core_api_resources("v1")
            .await
            .context("discovery of the core group")?;
        served.extend(from_list("", "v1", core));
        let groups = self
            .client
            .list_api_groups()
            .await
            .context("discovery of the API groups")?;
        let lists = futures::future::join_all(groups.groups.iter().filter_map(|g| {
            let version = g.preferred_version.as_ref().or(g.versions.first())?;
            let (name, version) = (g.name.clone(), version.version.clone());
            Some(async move {
                let list = self
                    .client
                    .list_api_group_resources(&format!("{name}/{version}"))
                    .await;
                (name, version, list)
            })
        }))
        .await;
        for (group, version, list) in lists {
            // An aggregated API that is down is skipped, as kubectl does (with a warning).
            match list {
                Ok(list) => served.extend(from_list(&group, &version, list)),
                Err(e) => eprintln!("warning: discovery of {group}/{version} failed: {e}"),
            }
        }
        Ok(served)
    }

    /// The served kind kubectl's `name` means.
    pub async fn resolve_name(&self, name: &str) -> Result<ApiResource, Failure> {
        let served = self.served().await?;
        let found = resolve(name, &served).map_err(Failure::NotFound)?;
        Ok(api_resource(found))
    }

    /// The kind a CR's `source` names, at its pinned version or its group's preferred one, and
    /// whether it is namespaced; `Ok(None)` when it is not served.
    pub async fn resolve_source(&self, source: &SourceRef) -> Result<Option<(ApiResource, bool)>, Failure> {
        let version = if !source.version.is_empty() {
            source.version.clone()
        } else if source.group.is_empty() {
            "v1".to_owned()
        } else {
            let groups = self
                .client
                .list_api_groups()
                .await
                .context("discovery of the API groups")?;
            let Some(group) = groups.groups.into_iter().find(|g| g.name == source.group) else {
                return Ok(None);
            };
            match group
                .preferred_version
                .or_else(|| group.versions.into_iter().next())
            {
                Some(v) => v.version,
                None => return Ok(None),
            }
        };
        let list = if source.group.is_empty() {
            self.client.list_core_api_resources(&version).await
        } else {
            self.client
                .list_api_group_resources(&format!("{}/{version}", source.group))
                .await
        };
        let list = match list {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context("discovery of the source's kind")
                    .into());
            }
        };
        Ok(from_list(&source.group, &version, list)
            .into_iter()
            .find(|s| s.kind == source.kind)
            .map(|s| (api_resource(&s), s.namespaced)))
    }

    /// The API of `resource` in `namespace`.
    pub fn objects(&self, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, resource)
    }

    /// Every Projection (of every namespace) and ClusterProjection the user may list. A tenant
    /// may list neither cluster-wide: the Projections of the namespace stand in for all of them,
    /// and the ClusterProjections are skipped, each said in one line on stderr.
    pub async fn all_crs(&self) -> Result<(Vec<Projection>, Vec<ClusterProjection>), Failure> {
        let projections = self.projections(true, &ListParams::default()).await?;
        let clusters = self.cluster_projections(&ListParams::default()).await?;
        Ok((projections, clusters))
    }

    /// The Projections matching `params`: of every namespace when `everywhere` (and allowed), else
    /// of the namespace.
    pub async fn projections(
        &self,
        everywhere: bool,
        params: &ListParams,
    ) -> Result<Vec<Projection>, Failure> {
        if everywhere {
            let all = unless_forbidden(
                Api::<Projection>::all(self.client.clone()).list(params).await,
                || {
                    format!(
                        "you may not list Projections in all namespaces; only those of namespace {} are shown",
                        self.namespace
                    )
                },
                "listing Projections",
            )?;
            if let Some(list) = all {
                return Ok(list.items);
            }
        }
        Ok(
            Api::<Projection>::namespaced(self.client.clone(), &self.namespace)
                .list(params)
                .await
                .with_context(|| format!("listing Projections in {}", self.namespace))?
                .items,
        )
    }

    /// The ClusterProjections matching `params`; none, said in one line on stderr, for a user who
    /// may not list them.
    pub async fn cluster_projections(&self, params: &ListParams) -> Result<Vec<ClusterProjection>, Failure> {
        let list = unless_forbidden(
            Api::<ClusterProjection>::all(self.client.clone())
                .list(params)
                .await,
            || "you may not list ClusterProjections; they are not shown".to_owned(),
            "listing ClusterProjections",
        )?;
        Ok(list.map(|l| l.items).unwrap_or_default())
    }

    /// The Deployments of every namespace labelled `selector` (the projection controllers); `None`,
    /// said in one line on stderr, for a user who may not list Deployments cluster-wide (a tenant):
    /// what only the platform team may read is skipped, not an error.
    pub async fn deployments_everywhere(&self, selector: &str) -> Result<Option<Vec<Deployment>>, Failure> {
        let list = unless_forbidden(
            Api::<Deployment>::all(self.client.clone())
                .list(&ListParams::default().labels(selector))
                .await,
            || {
                "you may not list Deployments in all namespaces; the projection controllers are not checked"
                    .to_owned()
            },
            "listing Deployments",
        )?;
        Ok(list.map(|l| l.items))
    }

    /// The namespaces as the controller's targets see them.
    /// A user who may not list namespaces gets the current one alone (its labels unknown), said in
    /// one line on stderr.
    pub async fn namespaces(&self) -> Result<Vec<NamespaceInfo>, Failure> {
        let listed = unless_forbidden(
            Api::<Namespace>::all(self.client.clone())
                .list(&ListParams::default())
                .await,
            || {
                format!(
                    "you may not list namespaces; ClusterProjections' targets are evaluated against namespace {} alone",
                    self.namespace
                )
            },
            "listing namespaces",
        )?;
        let Some(list) = listed else {
            return Ok(vec![NamespaceInfo {
                name: self.namespace.clone(),
                labels: Default::default(),
                terminating: false,
            }]);
        };
        Ok(list
            .items
            .into_iter()
            .map(|ns| NamespaceInfo {
                terminating: ns.metadata.deletion_timestamp.is_some()
                    || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"),
                name: ns.metadata.name.unwrap_or_default(),
                labels: ns.metadata.labels.unwrap_or_default(),
            })
            .collect())
    }
}

fn from_list(group: &str, version: &str, list: APIResourceList) -> Vec<Served> {
    list.resources
        .into_iter()
        .filter(|r| !r.name.contains('/'))
        .map(|r| Served {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: r.kind,
            plural: r.name,
            singular: r.singular_name,
            short_names: r.short_names.unwrap_or_default(),
            namespaced: r.namespaced,
        })
        .collect()
}

/// The `ApiResource` of a served kind.
pub fn api_resource(served: &Served) -> ApiResource {
    let api_version = if served.group.is_empty() {
        served.version.clone()
    } else {
        format!("{}/{}", served.group, served.version)
    };
    ApiResource {
        group: served.group.clone(),
        version: served.version.clone(),
        api_version,
        kind: served.kind.clone(),
        plural: served.plural.clone(),
    }
}
