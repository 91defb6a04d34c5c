//! The second local control plane (`tests/control-plane/remote.sh up`, started by
//! `scripts/test.sh`): the cluster the cross-cluster tests write copies into. A client for it as its
//! admin, namespaces there that go with the test, and a kubeconfig for a ServiceAccount of it with
//! only the rights a test grants: what a platform team would hand the controller.

use crate::{control_plane_bin, repo_root, wait_for};
use anyhow::Context as _;
use base64::{Engine, engine::general_purpose::STANDARD};
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Namespace, ServiceAccount},
};
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

/// The folder of the second control plane.
pub fn remote_testenv_dir() -> PathBuf {
    std::env::var_os("REMOTE_TESTENV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".testenv-remote"))
}

/// Its admin kubeconfig.
pub fn remote_kubeconfig_path() -> PathBuf {
    remote_testenv_dir().join("admin.kubeconfig")
}

const HOW_TO_START: &str = "start the second control plane first: `tests/control-plane/remote.sh up` \
     (or run the whole suite with `scripts/test.sh`, which starts it)";

/// A client for the second control plane as its admin; panics, saying how to start it, when it
/// does not run.
pub async fn remote_client() -> Client {
    try_remote_client()
        .await
        .unwrap_or_else(|e| panic!("no second control plane: {e:#}\n{HOW_TO_START}"))
}

async fn try_remote_client() -> anyhow::Result<Client> {
    let path = remote_kubeconfig_path();
    let kubeconfig =
        Kubeconfig::read_from(&path).with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = runtime::kube_client::client_for(config)?;
    tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .context("the second apiserver did not answer within 10s")?
        .context("the second apiserver is not reachable")?;
    Ok(client)
}

/// The second apiserver's URL and its CA (PEM), from its admin kubeconfig.
pub fn remote_server_and_ca() -> (String, String) {
    let text = std::fs::read_to_string(remote_kubeconfig_path()).expect("the remote admin kubeconfig");
    let config: Value = serde_yaml::from_str(&text).expect("a kubeconfig");
    let cluster = &config["clusters"][0]["cluster"];
    let server = cluster["server"].as_str().expect("server").to_owned();
    let ca = match cluster["certificate-authority-data"].as_str() {
        Some(data) => String::from_utf8(STANDARD.decode(data).expect("base64")).expect("PEM"),
        None => {
            let path = cluster["certificate-authority"].as_str().expect("a CA");
            std::fs::read_to_string(path).expect("the CA file")
        }
    };
    (server, ca)
}

/// A kubeconfig of one context: `server`, its CA (PEM) and a bearer `token`.
pub fn token_kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "remote",
        "clusters": [{"name": "remote", "cluster": {
            "server": server, "certificate-authority-data": STANDARD.encode(ca_pem)}}],
        "users": [{"name": "copies", "user": {"token": token}}],
        "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": "copies"}}],
    });
    serde_yaml::to_string(&config).expect("YAML")
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A namespace of the second cluster, deleted with the test.
pub struct RemoteNamespace {
    name: String,
}

impl RemoteNamespace {
    /// Creates the namespace `name` there (the name the copies land in: a Projection's own
    /// namespace's name), with `labels`.
    pub async fn create_named(client: &Client, name: &str, labels: Value) -> Self {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
            .expect("namespace object");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("cannot create namespace {name} in the second cluster: {e}"));
        Self {
            name: name.to_owned(),
        }
    }

    /// Creates `r-<prefix>-<pid>-<n>` there.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("r-{prefix}-{}-{n}", std::process::id());
        Self::create_named(client, &name, json!({})).await
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for RemoteNamespace {
    fn drop(&mut self) {
        let _ = Command::new(control_plane_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(remote_kubeconfig_path())
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// A ServiceAccount `name` of the second cluster (in `home`, which must exist) allowed `rules` in
/// each of `namespaces` (a Role and RoleBinding there) and `cluster_rules` everywhere (a
/// ClusterRole and its binding, named after the account); returns a kubeconfig for it with a token
/// valid for an hour.
pub async fn service_account_kubeconfig(
    client: &Client,
    (home, name): (&str, &str),
    (namespaces, rules): (&[&str], Value),
    cluster_rules: Option<Value>,
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), home);
    let apply = PatchParams::apply(crate::TEST_FIELD_MANAGER).force();
    let account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": home}});
    accounts
        .patch(name, &apply, &Patch::Apply(&account))
        .await
        .expect("the ServiceAccount");
    let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": home}]);
    for namespace in namespaces {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace}, "rules": rules});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subject});
        for object in [role, binding] {
            apply_object(client, &object).await;
        }
    }
    if let Some(rules) = cluster_rules {
        let cluster_name = format!("{home}-{name}");
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_name}, "rules": rules});
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
            "subjects": subject});
        for object in [role, binding] {
            apply_object(client, &object).await;
        }
    }
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).expect("a TokenRequest");
    let token: TokenRequest = wait_for("a token for the ServiceAccount", Duration::from_secs(20), || {
        let accounts = accounts.clone();
        let request = request.clone();
        async move {
            accounts
                .create_subresource("token", name, &PostParams::default(), &request)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let token = token.status.and_then(|s| s.token).unwrap_or_default();
    let (server, ca) = remote_server_and_ca();
    token_kubeconfig(&server, &ca, &token)
}

/// Server-side applies `object` (RBAC objects) in the second cluster.
async fn apply_object(client: &Client, object: &Value) {
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = kube::api::ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<kube::api::DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(crate::TEST_FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot apply {kind} {name} in the second cluster: {e}"));
}
