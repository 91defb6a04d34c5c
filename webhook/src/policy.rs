//! Source policy at admission: the kind must be namespaced, the requesting user must be allowed to
//! read the source (confused-deputy defence), and an existing source must let itself be projected;
//! a Projection that writes into another cluster names a kubeconfig Secret its writer may read.
//! Runs only for an authenticated caller with the access check on (`PolicySettings::reads_sources`).

use crate::{
    cluster_view::{ClusterView, KindScope, UserInfo},
    error::PolicyError,
};
use kube::discovery::ApiResource;
use shared::{
    api::crd::{SecretKeyReference, SourceRef},
    api::keys::PROJECTABLE,
    api::reason::Reason,
    api::source::cluster_scoped_message,
    policy::projectable::{SourceMode, check_projectable},
};

/// The policy's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// Admit, telling the user what to be aware of.
    Allow {
        /// Warnings `kubectl` prints.
        warnings: Vec<String>,
    },
    /// Deny with this message.
    Deny(String),
}

/// Which checks run.
#[derive(Clone, Copy, Debug)]
pub struct PolicySettings {
    /// `--source-mode`.
    pub source_mode: SourceMode,
    /// `--check-source-access`. Off, nothing that reads the cluster runs (see `review`).
    pub check_source_access: bool,
    /// The caller proved to be the apiserver (a client certificate verified against
    /// `--client-ca-file`), so the request's userInfo can be believed. Without it nothing that
    /// reads the cluster runs (see `review`).
    pub caller_authenticated: bool,
}

impl PolicySettings {
    /// Whether a review reads the source and the other CRs: only for a caller proved to be the
    /// apiserver, and only behind the access check, which runs first so that a writer who may not
    /// read the source learns nothing about it.
    pub fn reads_sources(&self) -> bool {
        self.caller_authenticated && self.check_source_access
    }
}

/// Whether `user` may get the kubeconfig Secret `secret` of a Projection in `namespace`
/// (`spec.destination.kubeConfig`): nobody writes through credentials they could not read, nor
/// learns through the controller what another tenant's reach. `Some` is the denial.
pub async fn check_kubeconfig_access<C: ClusterView>(
    cluster: &C,
    user: &UserInfo,
    namespace: &str,
    secret: &SecretKeyReference,
) -> Result<Option<String>, PolicyError> {
    let secrets = ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    if cluster.can_get(user, &secrets, namespace, &secret.name).await? {
        return Ok(None);
    }
    let who = user.username.as_deref().unwrap_or("the requesting user");
    Ok(Some(format!(
        "{who} may not get secrets {namespace}/{}, the kubeconfig of spec.destination.kubeConfig; \
         the copy would be written with credentials its author cannot read (ask for get access to \
         that Secret, or name one you may read)",
        secret.name
    )))
}

/// Checks `source` for a request from `user`.
pub async fn check_source<C: ClusterView>(
    cluster: &C,
    settings: PolicySettings,
    user: &UserInfo,
    source: &SourceRef,
) -> Result<PolicyVerdict, PolicyError> {
    let resource = match cluster.resolve(source).await? {
        KindScope::Cluster => return Ok(PolicyVerdict::Deny(cluster_scoped_message(source))),
        KindScope::Unknown => {
            return Ok(PolicyVerdict::Allow {
                warnings: vec![format!(
                    "source kind {} is not served by this cluster (yet); the copy is made once it is",
                    source.display_gvk()
                )],
            });
        }
        KindScope::Namespaced(resource) => resource,
    };
    let (namespace, name) = (source.namespace.as_str(), source.name.as_str());
    // Before anything about the source is revealed: whether it exists, how it is annotated.
    // The caller of this function checked `settings.reads_sources()`: the access check always runs.
    if !cluster.can_get(user, &resource, namespace, name).await? {
        let who = user.username.as_deref().unwrap_or("the requesting user");
        return Ok(PolicyVerdict::Deny(format!(
            "{who} may not get {} {namespace}/{name}; a projection would expose the source through its \
             copy, so its author needs get access to the source (ask for it, or project another source)",
            resource_name(&resource)
        )));
    }
    let annotations = match cluster.annotations(&resource, namespace, name).await {
        // Permanent until an admin widens the operator's RBAC: say so rather than "try again".
        Err(PolicyError::SourceRead(kube::Error::Api(status))) if status.is_forbidden() => {
            return Ok(PolicyVerdict::Deny(format!(
                "projection may not read {kind} (forbidden to its ServiceAccount): {kind} is not among \
                 the kinds this installation supports (Helm value supportedKinds); a cluster admin can add it",
                kind = resource_name(&resource)
            )));
        }
        read => read?,
    };
    let Some(annotations) = annotations else {
        return Ok(PolicyVerdict::Allow {
            warnings: vec![format!(
                "source {} {namespace}/{name} does not exist (yet); the copy is made once it does",
                source.kind
            )],
        });
    };
    Ok(
        match check_projectable(settings.source_mode, Some(&annotations), namespace, name) {
            Ok(()) => PolicyVerdict::Allow { warnings: vec![] },
            Err(blocked) if blocked.reason == Reason::SourceNotProjectable => PolicyVerdict::Deny(format!(
                "{}; its owner can opt in with: kubectl annotate {}/{name} -n {namespace} {PROJECTABLE}=true",
                blocked.message,
                resource_name(&resource)
            )),
            Err(blocked) => PolicyVerdict::Deny(blocked.message),
        },
    )
}

/// `secrets`, or `widgets.example.com` outside the core group: what kubectl and RBAC call it.
fn resource_name(resource: &ApiResource) -> String {
    if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}
