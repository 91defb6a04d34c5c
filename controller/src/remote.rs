//! Other clusters the copies go to (`spec.destination.kubeConfig`): each is reached with the
//! kubeconfig of the Secret a CR points to, read at every pass (rotated credentials are used from
//! the next pass on), checked by `shared::policy::kubeconfig` (inline credentials only: nothing runs,
//! no file of ours is read) and turned into a client of its own. A cluster's copies are written
//! through a [`CopyCluster`] of its own, with watches of our copies there only (one namespace for a
//! Projection, so a credential bound to that namespace suffices), so everything the pass does
//! locally it does there. A cluster no CR points to any more is dropped with its connections and
//! watches. What fails is reported on the CR that points there, never on another.

use crate::{
    context::{CopyCluster, Destination, Settings},
    error::describe,
    impersonation::AuthorClients,
    metrics::Metrics,
    namespace_watch::Namespaces,
    wake::Wake,
    watches::{Reach, WatchRegistry},
};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use shared::{
    api::{kind::CrName, reason::Reason},
    policy::{
        kubeconfig::{KubeconfigSecret, RemoteAccess},
        write_as::CopyWriter,
    },
};
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{sync::OnceCell, task::JoinHandle};

/// How long connecting to another cluster may take, and waiting for its answer to a request: one
/// that does not answer fails the pass soon (`DestinationClusterUnreachable`), and the pass is
/// retried with backoff, instead of holding a reconcile for the minute a local request may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a pass waits for another cluster's identity (recorded for admission) when it first
/// writes there: a cluster that does not answer costs its passes this much more, not a timeout.
const IDENTITY_WITHIN: Duration = Duration::from_secs(2);

/// Why another cluster cannot take the copies now: the reason and the message of the CR's status.
pub type Unusable = (Reason, String);

/// One other cluster, reached with one kubeconfig.
pub struct RemoteCluster {
    /// The digest of the kubeconfig it was opened with: another value opens it again.
    fingerprint: [u8; 32],
    /// Which apiserver it is (`RemoteAccess::server_id`), recorded with the copies written there.
    server: String,
    client: Client,
    /// The identity of the CRs' own cluster, stamped on the copies.
    identity: String,
    /// This cluster's own identity, once read (`None`: its credentials may not read it).
    identity_there: OnceCell<Option<String>>,
    settings: RemoteSettings,
    /// Where the copies of Projections go, per namespace.
    by_namespace: Mutex<HashMap<String, Arc<CopyCluster>>>,
    /// Where the copies of ClusterProjections go, with the cluster's namespaces they select.
    everywhere: OnceCell<(Arc<CopyCluster>, Arc<Namespaces>, NamespaceTask)>,
}

/// The namespace watch of a cluster, stopped with it.
struct NamespaceTask(JoinHandle<()>);

impl Drop for NamespaceTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What every cluster's copies are written with.
#[derive(Clone)]
pub struct RemoteSettings {
    metrics: Arc<Metrics>,
    wake: Wake,
    settings: Settings,
}

impl RemoteCluster {
    /// The copies of one registry reaching `namespace` (`None`: every namespace).
    fn copy_cluster(&self, namespace: Option<String>) -> Arc<CopyCluster> {
        let watches = Arc::new(WatchRegistry::reaching(
            Reach::Remote { namespace },
            self.client.clone(),
            self.settings.metrics.clone(),
            self.settings.wake.clone(),
            self.settings.settings.initial_list,
        ));
        let settings = &self.settings.settings;
        Arc::new(CopyCluster {
            client: self.client.clone(),
            journal: watches.journal(),
            watches,
            concurrency: settings.write_concurrency.max(1),
            recreate_on_immutable: settings.recreate_on_immutable.clone(),
            // There the kubeconfig's identity is the only authority: its RBAC decides.
            writer: CopyWriter::Controller,
            author_clients: AuthorClients::new(self.client.clone()),
            source_cluster: Some(self.identity.clone()),
        })
    }

    /// This cluster's identity (`runtime::cluster_identity`), read once with its credentials;
    /// `None` when they may not read it, or when it does not answer within [`IDENTITY_WITHIN`]
    /// (asked again next pass: a pass to a cluster that does not answer waits on its copies, not
    /// on this).
    async fn identity_there(&self) -> Option<String> {
        let read = self
            .identity_there
            .get_or_try_init(|| async {
                let read =
                    tokio::time::timeout(IDENTITY_WITHIN, runtime::cluster_identity::read(&self.client))
                        .await;
                match read {
                    Ok(Ok(identity)) => Ok(Some(identity).filter(|i| !i.is_empty())),
                    // Refused or absent: a credential bound to its namespaces; it stays unknown.
                    Ok(Err(kube::Error::Api(_))) => Ok(None),
                    Ok(Err(_)) | Err(_) => Err(()),
                }
            })
            .await;
        read.ok().and_then(Clone::clone)
    }

    /// Where a Projection of `namespace` writes its copy here.
    fn in_namespace(&self, namespace: &str) -> Arc<CopyCluster> {
        let mut by_namespace = self.by_namespace.lock().unwrap_or_else(|e| e.into_inner());
        by_namespace
            .entry(namespace.to_owned())
            .or_insert_with(|| self.copy_cluster(Some(namespace.to_owned())))
            .clone()
    }

    /// Where a ClusterProjection writes its copies here, and the namespaces it selects among.
    async fn everywhere(&self) -> (Arc<CopyCluster>, Arc<Namespaces>) {
        let (copies, namespaces, _) = self
            .everywhere
            .get_or_init(|| async {
                let namespaces = Namespaces::new();
                let task = tokio::spawn(namespaces.clone().run(
                    self.client.clone(),
                    self.settings.wake.clone(),
                    self.settings.settings.initial_list,
                ));
                (self.copy_cluster(None), namespaces, NamespaceTask(task))
            })
            .await;
        (copies.clone(), namespaces.clone())
    }
}

/// Every other cluster a CR points to, by the Secret holding its kubeconfig.
pub struct RemoteClusters {
    /// The CRs' own cluster: where the Secrets are read, and whose identity the copies carry.
    local: Client,
    /// Where a ClusterProjection's Secret is.
    controller_namespace: String,
    settings: RemoteSettings,
    /// The identity of the CRs' own cluster (`runtime::cluster_identity`), read once.
    identity: OnceCell<String>,
    clusters: Mutex<Clusters>,
}

/// The open clusters and the CRs that use each.
#[derive(Default)]
struct Clusters {
    open: HashMap<KubeconfigSecret, Arc<RemoteCluster>>,
    used_by: HashMap<CrName, KubeconfigSecret>,
}

impl RemoteClusters {
    /// No cluster open yet.
    pub fn new(
        local: Client,
        controller_namespace: String,
        metrics: Arc<Metrics>,
        wake: Wake,
        settings: Settings,
    ) -> Self {
        Self {
            local,
            controller_namespace,
            settings: RemoteSettings {
                metrics,
                wake,
                settings,
            },
            identity: OnceCell::new(),
            clusters: Mutex::default(),
        }
    }

    /// Where a ClusterProjection's kubeconfig Secret is.
    pub fn controller_namespace(&self) -> &str {
        &self.controller_namespace
    }

    /// The identity of the CRs' own cluster, stamped on every copy written elsewhere.
    async fn identity(&self) -> Result<String, Unusable> {
        self.identity
            .get_or_try_init(|| async {
                runtime::cluster_identity::read(&self.local).await.map_err(|e| {
                    (
                        Reason::DestinationClusterUnreachable,
                        format!("cannot read this cluster's identity: {}", describe(&e)),
                    )
                })
            })
            .await
            .cloned()
    }

    /// Where the copies of `cr` go in the cluster of `secret` (in `namespace` for a Projection,
    /// everywhere for a ClusterProjection): reads the Secret, checks its kubeconfig and opens the
    /// cluster, or reuses it when the kubeconfig is the one it was opened with. A Secret that
    /// reaches another apiserver than the one `recorded` (where the CR's copies were written) is
    /// refused: the copies there would be left behind.
    pub async fn destination(
        &self,
        cr: &CrName,
        secret: &KubeconfigSecret,
        recorded: Option<&str>,
    ) -> Result<Destination, Unusable> {
        let identity = self.identity().await?;
        let cluster = self.open(cr, secret, identity).await?;
        secret
            .same_server(recorded, &cluster.server)
            .map_err(|message| (Reason::DestinationClusterInvalid, message))?;
        let (copies, namespaces) = match cr {
            CrName::Projection { namespace, .. } => (cluster.in_namespace(namespace), None),
            CrName::ClusterProjection { .. } => {
                let (copies, namespaces) = cluster.everywhere().await;
                (copies, Some(namespaces))
            }
        };
        Ok(Destination {
            copies,
            namespaces,
            cluster: Some(cluster.server.clone()),
            cluster_identity: cluster.identity_there().await,
        })
    }

    /// The cluster of `secret`, opened for `cr`.
    async fn open(
        &self,
        cr: &CrName,
        secret: &KubeconfigSecret,
        identity: String,
    ) -> Result<Arc<RemoteCluster>, Unusable> {
        let kubeconfig = self.read_kubeconfig(secret).await?;
        let fingerprint: [u8; 32] = Sha256::digest(&kubeconfig).into();
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        clusters.used_by.insert(cr.clone(), secret.clone());
        if let Some(open) = clusters.open.get(secret).filter(|c| c.fingerprint == fingerprint) {
            return Ok(open.clone());
        }
        let invalid = |message: String| (Reason::DestinationClusterInvalid, message);
        let access = secret.access(&kubeconfig).map_err(invalid)?;
        let client = client_of(&access, (&self.settings.metrics.rest_client, secret.alias()))
            .map_err(|message| invalid(secret.unusable(&message)))?;
        // A new kubeconfig (rotated credentials, or a cluster not open yet): the old connections
        // and watches go when the last pass holding them ends.
        let cluster = Arc::new(RemoteCluster {
            fingerprint,
            server: access.server_id(),
            client,
            identity,
            identity_there: OnceCell::new(),
            settings: self.settings.clone(),
            by_namespace: Mutex::default(),
            everywhere: OnceCell::new(),
        });
        clusters.open.insert(secret.clone(), cluster.clone());
        self.settings
            .metrics
            .remote_clusters
            .set(clusters.open.len() as i64);
        tracing::info!(secret = %secret.path(), key = %secret.key, cluster = %secret.alias(), "opened another cluster");
        Ok(cluster)
    }

    /// The kubeconfig in `secret`, read as the controller (after the CR's author was found allowed
    /// to read it).
    async fn read_kubeconfig(&self, secret: &KubeconfigSecret) -> Result<Vec<u8>, Unusable> {
        let api = Api::<Secret>::namespaced(self.local.clone(), &secret.namespace);
        let found = api.get_opt(&secret.name).await.map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 403 => (
                Reason::DestinationClusterForbidden,
                format!(
                    "the controller may not get Secret {}: {}",
                    secret.path(),
                    describe(&e)
                ),
            ),
            _ => (
                Reason::DestinationClusterUnreachable,
                format!("reading Secret {} failed: {}", secret.path(), describe(&e)),
            ),
        })?;
        let Some(found) = found else {
            return Err((Reason::DestinationClusterInvalid, secret.missing()));
        };
        found
            .data
            .and_then(|mut data| data.remove(&secret.key))
            .map(|bytes| bytes.0)
            .ok_or_else(|| (Reason::DestinationClusterInvalid, secret.missing_key()))
    }

    /// Forgets that `cr` writes into another cluster (it is gone, or writes here now): a cluster
    /// no CR uses any more is dropped, and a namespace of it no Projection writes in any more.
    pub fn forget(&self, cr: &CrName) {
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let Some(secret) = clusters.used_by.remove(cr) else {
            return;
        };
        let users: Vec<&CrName> = clusters
            .used_by
            .iter()
            .filter(|(_, s)| **s == secret)
            .map(|(user, _)| user)
            .collect();
        if users.is_empty() {
            clusters.open.remove(&secret);
            self.settings
                .metrics
                .remote_clusters
                .set(clusters.open.len() as i64);
            tracing::info!(secret = %secret.path(), cluster = %secret.alias(), "closed another cluster: no CR writes there any more");
            return;
        }
        if let CrName::Projection { namespace, .. } = cr {
            let still: HashSet<&str> = users.iter().filter_map(|u| u.namespace()).collect();
            if !still.contains(namespace.as_str())
                && let Some(cluster) = clusters.open.get(&secret)
            {
                cluster
                    .by_namespace
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(namespace);
            }
        }
    }
}

/// A client for the cluster of `access`, built from its parts only: kube's kubeconfig loaders are
/// not used, so nothing but what `remote_access` accepted can reach it. Its requests are counted in
/// `rest_client_requests_total` under the cluster's alias (never its URL).
fn client_of(
    access: &RemoteAccess,
    (requests, alias): (&runtime::rest_client_metrics::RestClientMetrics, String),
) -> Result<Client, String> {
    let mut config = runtime::kube_client::config_from_parts(
        &access.server,
        access.certificate_authority.as_deref(),
        access.tls_server_name.clone(),
        access.credentials.kubeconfig_user(),
    )?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    let timeouts = runtime::kube_client::Timeouts {
        response: RESPONSE_TIMEOUT,
        ..runtime::kube_client::Timeouts::for_config(&config)
    };
    runtime::kube_client::client_counted_as(config, timeouts, Some((requests, alias)))
        .map_err(|e| describe(&e))
}
