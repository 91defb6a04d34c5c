//! The controller running as a ServiceAccount, as the chart runs it: the chart's ClusterRole with
//! `supportedKinds` narrowed to some core kinds, its Lease Role, and a kubeconfig with a token.

use super::{Env, create};
use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use projection_tests::{
    ClusterScopedGuard, ServiceProcess, TestNamespace, kubeconfig_path, kubectl_ok, testenv_dir,
};
use serde_json::{Value, json};
use std::path::PathBuf;

/// The chart's controller ClusterRole (`charts/projection/templates/controller-rbac.yaml`) with
/// `supportedKinds` = `kinds` of the core group.
pub fn controller_rules(kinds: &[&str]) -> Value {
    json!([
        {"apiGroups": [""], "resources": kinds,
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["projection.sh"], "resources": ["projections", "clusterprojections"],
         "verbs": ["get", "list", "watch", "update", "patch"]},
        {"apiGroups": ["projection.sh"], "resources": ["projections/status", "clusterprojections/status"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": ["projection.sh"],
         "resources": ["projections/finalizers", "clusterprojections/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"],
         "verbs": ["get", "list", "watch"]},
    ])
}

/// The chart's controller ClusterRole with `controller.writeCopiesAs: author` (the default on
/// Kubernetes v1.36): no `create` or `update` on `kinds`, only the constrained impersonation verbs
/// for them, and the start-up probe's.
pub fn controller_rules_writing_as_author(kinds: &[&str]) -> Value {
    let mut rules = controller_rules(kinds);
    let list = rules.as_array_mut().expect("a list of rules");
    list[0] = json!({"apiGroups": [""], "resources": kinds,
                     "verbs": ["get", "list", "watch", "patch", "delete"]});
    list.extend([
        json!({"apiGroups": [""], "resources": kinds,
               "verbs": ["impersonate-on:user-info:create", "impersonate-on:user-info:patch",
                         "impersonate-on:serviceaccount:create", "impersonate-on:serviceaccount:patch"]}),
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["users", "groups"],
               "verbs": ["impersonate:user-info"]}),
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["serviceaccounts"],
               "verbs": ["impersonate:serviceaccount"]}),
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"],
               "verbs": ["impersonate-on:user-info:create"]}),
    ]);
    rules
}

/// A kubeconfig for the local cluster that authenticates with `token`.
fn kubeconfig_with_token(token: &str, file: &str) -> PathBuf {
    let admin = kube::config::Kubeconfig::read_from(kubeconfig_path()).expect("admin kubeconfig");
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("a cluster in the admin kubeconfig");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
            "certificate-authority": cluster.certificate_authority,
        }}],
        "users": [{"name": "controller", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "controller"}}],
        "current-context": "local",
    });
    let path = testenv_dir().join(file);
    std::fs::write(&path, serde_json::to_string_pretty(&config).expect("json")).expect("kubeconfig written");
    path
}

/// The ServiceAccount `projection-controller` in a namespace of its own, bound to the chart's roles.
pub struct ControllerAccount {
    /// The controller's namespace (its ServiceAccount and Lease).
    pub home: TestNamespace,
    /// Name of its ClusterRole and ClusterRoleBinding.
    pub role_name: String,
    /// A kubeconfig authenticating as the ServiceAccount.
    pub kubeconfig: PathBuf,
    client: Client,
    _guards: [ClusterScopedGuard; 2],
}

impl ControllerAccount {
    /// Creates the account with `supportedKinds` = `kinds`.
    pub async fn create(env: &Env, name: &str, kinds: &[&str]) -> Self {
        Self::create_with_rules(env, name, controller_rules(kinds)).await
    }

    /// Creates the account with `rules` as its ClusterRole.
    pub async fn create_with_rules(env: &Env, name: &str, rules: Value) -> Self {
        let home = TestNamespace::create(&env.client, name).await;
        let namespace = home.name().to_owned();
        create(
            &env.api::<ServiceAccount>(&namespace),
            json!({"metadata": {"name": "projection-controller"}}),
        )
        .await;
        let role_name = format!("projection-controller-{namespace}");
        let guards = [
            ClusterScopedGuard::new("clusterrolebindings", &role_name),
            ClusterScopedGuard::new("clusterroles", &role_name),
        ];
        let subject =
            json!([{"kind": "ServiceAccount", "name": "projection-controller", "namespace": namespace}]);
        create(
            &Api::<ClusterRole>::all(env.client.clone()),
            json!({"metadata": {"name": role_name}, "rules": rules}),
        )
        .await;
        create(
            &Api::<ClusterRoleBinding>::all(env.client.clone()),
            json!({"metadata": {"name": role_name}, "subjects": subject,
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name}}),
        )
        .await;
        create(
            &env.api::<Role>(&namespace),
            json!({"metadata": {"name": "leader-election"}, "rules": [{"apiGroups": ["coordination.k8s.io"],
                   "resources": ["leases"], "verbs": ["get", "create", "update", "patch"]}]}),
        )
        .await;
        create(
            &env.api::<RoleBinding>(&namespace),
            json!({"metadata": {"name": "leader-election"}, "subjects": subject,
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"}}),
        )
        .await;
        let token = kubectl_ok(&[
            "create",
            "token",
            "projection-controller",
            "-n",
            &namespace,
            "--duration=1h",
        ]);
        let kubeconfig = kubeconfig_with_token(token.trim(), &format!("{namespace}.kubeconfig"));
        Self {
            home,
            role_name,
            kubeconfig,
            client: env.client.clone(),
            _guards: guards,
        }
    }

    /// A controller authenticated as the ServiceAccount, leader-elected in its namespace (as the
    /// chart runs it), with `args`; ready.
    pub async fn start_controller(&self, args: &[&str]) -> ServiceProcess {
        let mut all = args.to_vec();
        all.extend([
            "--leader-elect=true",
            "--leader-election-namespace",
            self.namespace(),
        ]);
        let mut controller = ServiceProcess::start_as(super::binary(), &all, &self.kubeconfig, &[]);
        controller.wait_ready().await;
        controller
    }

    /// The namespace of the ServiceAccount.
    pub fn namespace(&self) -> &str {
        self.home.name()
    }

    /// The Kubernetes user name of the ServiceAccount.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:projection-controller", self.namespace())
    }

    /// `kubectl auth can-i VERB RESOURCE --all-namespaces` as the ServiceAccount: `yes` or `no`.
    pub fn can_i(&self, verb: &str, resource: &str) -> String {
        // It answers "no" with exit status 1.
        let answer = projection_tests::kubectl(&[
            "auth",
            "can-i",
            verb,
            resource,
            "--all-namespaces",
            &format!("--as={}", self.user()),
        ]);
        String::from_utf8_lossy(&answer.stdout).trim().to_owned()
    }

    /// Replaces `supportedKinds` with `kinds`.
    pub async fn grant(&self, kinds: &[&str]) {
        self.set_rules(controller_rules(kinds)).await;
    }

    /// Replaces the ClusterRole's rules with `rules`.
    pub async fn set_rules(&self, rules: Value) {
        Api::<ClusterRole>::all(self.client.clone())
            .patch(
                &self.role_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": rules})),
            )
            .await
            .expect("ClusterRole patched");
    }
}
