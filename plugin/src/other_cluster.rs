//! Another cluster a CR's copies go to (`spec.destination.kubeConfig`), opened as the controller
//! opens it: its kubeconfig Secret read here, judged by the controller's rules
//! (`shared::policy::kubeconfig`), a client built from its parts. `preview` plans against it;
//! `check api` asks whether it answers.

use crate::{cluster::Cluster, exit::Failure};
use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use shared::{api::reason::Reason, policy::kubeconfig::KubeconfigSecret};

/// The other cluster of `secret`, as the controller opens it: the Secret read here (with your
/// credentials), its kubeconfig judged by the controller's own rules, a client from its parts; and
/// this cluster's identity, which the copies there name. `Err`: the reason and message the
/// controller would report, also for a Secret that reaches another apiserver than `recorded`, the
/// one a CR's copies were written to.
pub async fn open(
    cluster: &Cluster,
    secret: &KubeconfigSecret,
    recorded: Option<&str>,
) -> Result<Result<(Cluster, String), (Reason, String)>, Failure> {
    let invalid = |message: String| Ok(Err((Reason::DestinationClusterInvalid, message)));
    let found = match Api::<Secret>::namespaced(cluster.client.clone(), &secret.namespace)
        .get_opt(&secret.name)
        .await
    {
        Ok(found) => found,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Ok(Err((
                Reason::DestinationClusterForbidden,
                format!(
                    "you may not get Secret {}, which preview reads with your credentials: {}",
                    secret.path(),
                    s.message
                ),
            )));
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context("reading the kubeconfig Secret")
                .into());
        }
    };
    let Some(found) = found else {
        return invalid(secret.missing());
    };
    let Some(bytes) = found.data.and_then(|mut d| d.remove(&secret.key)) else {
        return invalid(secret.missing_key());
    };
    let access = match secret.access(&bytes.0) {
        Ok(access) => access,
        Err(message) => return invalid(message),
    };
    if let Err(message) = secret.same_server(recorded, &access.server_id()) {
        return invalid(message);
    }
    let config = match runtime::kube_client::config_from_parts(
        &access.server,
        access.certificate_authority.as_deref(),
        access.tls_server_name.clone(),
        access.credentials.kubeconfig_user(),
    ) {
        Ok(config) => config,
        Err(why) => return invalid(secret.unusable(&why)),
    };
    let client =
        runtime::kube_client::client_for(config.clone()).context("building the other cluster's client")?;
    let identity = runtime::cluster_identity::read(&cluster.client)
        .await
        .context("reading this cluster's identity (the copies there name it)")?;
    let there = Cluster {
        client,
        config,
        namespace: cluster.namespace.clone(),
        all_namespaces: false,
    };
    Ok(Ok((there, identity)))
}
