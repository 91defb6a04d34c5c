//! Helpers shared by the controller's integration tests: a controller process per test, object
//! creation and patching, and waits on conditions and objects.
#![allow(dead_code)]

pub mod account;

use k8s_openapi::{
    api::{
        core::v1::ConfigMap,
        rbac::v1::{Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use projection_tests::{
    ServiceProcess, TestNamespace, client, exclusive, install_crds, wait_crd_established, wait_for,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use shared::{
    api::crd::{ClusterProjection, Projection},
    policy::author::Author,
};
use std::{fmt::Debug, path::Path, time::Duration};

pub const TIMEOUT: Duration = Duration::from_secs(20);

pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_projection-controller"))
}

/// Stops `process` with SIGTERM and asserts it exits cleanly within the wait `terminate` allows.
pub fn stop_cleanly(process: &mut ServiceProcess) {
    let status = process.terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "clean exit on SIGTERM: {status:?} (log {})",
        process.log.display()
    );
}

/// A controller with a long retry cap, so anything that recovers within a test's timeout was woken
/// by a watch, not by a timer. The suites that test reconciling, not tenancy, write their CRs as
/// the admin without the webhook (so without an author record): their controller trusts its own
/// access (`--author-access=trusted`, the Go operator's behaviour) unless `extra` says otherwise;
/// the `tenancy` suite runs the default, `enforce`.
pub async fn controller(extra: &[&str]) -> ServiceProcess {
    let mut args = vec!["--requeue-interval", "5m"];
    if !extra.iter().any(|a| a.starts_with("--author-access")) {
        args.push("--author-access=trusted");
    }
    args.extend_from_slice(extra);
    let mut process = ServiceProcess::start(binary(), &args);
    process.wait_ready().await;
    process
}

/// One test's world: a source and a destination namespace, the CRDs, and the exclusive right to run
/// a controller.
pub struct Env {
    pub client: Client,
    pub source: TestNamespace,
    pub dest: TestNamespace,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

pub async fn env(name: &str) -> Env {
    let serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let source = TestNamespace::create(&client, &format!("{name}-src")).await;
    let dest = TestNamespace::create(&client, &format!("{name}-dst")).await;
    Env {
        client,
        source,
        dest,
        _serial: serial,
    }
}

impl Env {
    /// The source and destination namespaces' names.
    pub fn names(&self) -> (String, String) {
        (self.source.name().to_owned(), self.dest.name().to_owned())
    }

    /// Deletes the test's Projections while the controller still runs (so their finalizers
    /// complete). Takes `&self`: the namespaces and the exclusive right to run a controller go only
    /// when the `Env` is dropped, after the test's controller (declared later) has stopped.
    pub async fn finish(&self) {
        for namespace in [self.dest.name(), self.source.name()] {
            let api: Api<Projection> = self.api(namespace);
            let _ = api
                .delete_collection(&DeleteParams::default(), &Default::default())
                .await;
            wait_for(
                &format!("Projections in {namespace} deleted"),
                TIMEOUT,
                || async {
                    match api.list(&Default::default()).await {
                        Ok(list) if list.items.is_empty() => Ok(()),
                        Ok(list) => Err(format!("{} left", list.items.len())),
                        Err(e) => Err(e.to_string()),
                    }
                },
            )
            .await;
        }
    }

    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub fn projections(&self) -> Api<Projection> {
        self.api(self.dest.name())
    }

    /// Creates the Projection `name` (in the destination namespace) of the source namespace's
    /// ConfigMap `source`, with the spec fields `extra`: most tests project a ConfigMap this way.
    pub async fn project_configmap(&self, name: &str, source: &str, extra: Value) -> Projection {
        create(
            &self.projections(),
            projection(name, cm_source(self.source.name(), source), extra),
        )
        .await
    }

    /// Creates the opted-in ConfigMap `source` with `data` in the source namespace and the
    /// Projection `name` of it: the opening most tests share.
    pub async fn project_new_configmap(&self, name: &str, source: &str, data: Value, extra: Value) {
        source_configmap(&self.api(self.source.name()), source, data).await;
        self.project_configmap(name, source, extra).await;
    }
}

pub async fn create<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + Debug,
{
    let object: K = serde_json::from_value(value).expect("valid object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create failed: {e}"))
}

/// Deletes `name`, panicking with the apiserver's answer if it refuses: the deletions a test makes,
/// which must go through.
pub async fn delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name} failed: {e}"));
}

pub async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name} failed: {e}"))
}

pub fn opted_in() -> Value {
    json!({"projection.sh/projectable": "true"})
}

/// Creates the ConfigMap `name` opted in to projection, with `data` (`Value::Null` for none): the
/// source most tests project.
pub async fn source_configmap(api: &Api<ConfigMap>, name: &str, data: Value) -> ConfigMap {
    create(
        api,
        json!({"metadata": {"name": name, "annotations": opted_in()}, "data": data}),
    )
    .await
}

/// Creates the ClusterProjection `name` with `spec`, so tests write only the spec and not the
/// object around it.
pub async fn create_cluster_projection(
    api: &Api<ClusterProjection>,
    name: &str,
    spec: Value,
) -> ClusterProjection {
    create(
        api,
        json!({"apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
               "metadata": {"name": name}, "spec": spec}),
    )
    .await
}

/// The spec `{"source": source}` with the fields of `extra` added: a Projection's or a
/// ClusterProjection's, as tests write them.
pub fn spec_of(source: Value, extra: Value) -> Value {
    let mut spec = json!({"source": source});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    spec
}

pub fn projection(name: &str, source: Value, extra: Value) -> Value {
    let spec = spec_of(source, extra);
    json!({"apiVersion": "projection.sh/v1", "kind": "Projection", "metadata": {"name": name}, "spec": spec})
}

pub fn cm_source(namespace: &str, name: &str) -> Value {
    json!({"version": "v1", "kind": "ConfigMap", "namespace": namespace, "name": name})
}

/// The condition `type_` among `conditions` (of either kind's status), if it is there.
pub fn condition<'a>(
    conditions: &'a [shared::api::crd::Condition],
    type_: &str,
) -> Option<&'a shared::api::crd::Condition> {
    conditions.iter().find(|c| c.r#type == type_)
}

/// The message of the condition `type_` among `conditions`; empty when there is none.
pub fn condition_message(conditions: &[shared::api::crd::Condition], type_: &str) -> String {
    condition(conditions, type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Waits until the Projection's condition `type_` has `status` (and, if given, `reason`) for its
/// current generation; returns the condition.
pub async fn wait_condition(
    api: &Api<Projection>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> Value {
    wait_for(
        &format!("{name} {type_}={status} {reason:?}"),
        TIMEOUT,
        || async {
            let p = api.get(name).await.map_err(|e| e.to_string())?;
            let generation = p.metadata.generation;
            let conditions = p
                .status
                .as_ref()
                .map(|s| s.copy.conditions.clone())
                .unwrap_or_default();
            let found = condition(&conditions, type_).cloned();
            match found {
                Some(c)
                    if c.status == status
                        && reason.is_none_or(|r| c.reason == r)
                        && c.observed_generation == generation =>
                {
                    Ok(serde_json::to_value(c).unwrap_or_default())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Waits until the Projection's `Ready` is `False` for `reason`, the way most failures show;
/// returns the condition.
pub async fn wait_not_ready(api: &Api<Projection>, name: &str, reason: &str) -> Value {
    wait_condition(api, name, "Ready", "False", Some(reason)).await
}

pub async fn wait_ready(api: &Api<Projection>, name: &str) {
    wait_condition(api, name, "Ready", "True", Some("Projected")).await;
}

/// Waits until `get` yields an object for which `check` holds.
pub async fn wait_object<K, F>(api: &Api<K>, name: &str, what: &str, check: F) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
    F: Fn(&K) -> bool,
{
    wait_for(what, TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(Some(o)) if check(&o) => Ok(o),
            Ok(Some(o)) => Err(format!("{o:?}")),
            Ok(None) => Err("absent".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

pub async fn wait_absent<K>(api: &Api<K>, name: &str, what: &str)
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    wait_for(what, TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(o)) if o.meta().deletion_timestamp.is_some() => Ok(()),
            Ok(Some(_)) => Err("still present".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

pub fn data_of(cm: &ConfigMap) -> Value {
    serde_json::to_value(cm.data.clone().unwrap_or_default()).unwrap_or_default()
}

/// A ValidatingAdmissionPolicy and its binding, limited to one namespace, that deny what
/// `expression` refuses (for `operations` on `resource` of `group`); both are deleted on drop.
/// Lets a test make the apiserver refuse a write without running a webhook.
pub struct DenyPolicy {
    _guards: [projection_tests::ClusterScopedGuard; 2],
}

impl DenyPolicy {
    /// Creates the policy; returns once it is in force, which `probe` (a dry-run write it must
    /// refuse) tells.
    pub async fn create<F, Fut>(
        client: &Client,
        name: &str,
        rule: (&str, &str, &[&str]),
        namespace: &str,
        expression: &str,
        message: &str,
        probe: F,
    ) -> Self
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), kube::Error>>,
    {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let (group, resource, operations) = rule;
        let guards = [
            projection_tests::ClusterScopedGuard::new("validatingadmissionpolicybindings", name),
            projection_tests::ClusterScopedGuard::new("validatingadmissionpolicies", name),
        ];
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
        create(
            &policies,
            json!({"metadata": {"name": name}, "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                    "operations": operations, "resources": [resource]}]},
                "validations": [{"expression": expression, "message": message}]}}),
        )
        .await;
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
        create(
            &bindings,
            json!({"metadata": {"name": name}, "spec": {"policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels":
                    {"kubernetes.io/metadata.name": namespace}}}}}),
        )
        .await;
        wait_for(&format!("policy {name} in force"), TIMEOUT, || async {
            match probe().await {
                Err(kube::Error::Api(s)) if s.message.contains(message) => Ok(()),
                other => Err(format!("probe: {other:?}")),
            }
        })
        .await;
        Self { _guards: guards }
    }
}

/// When the controller last published the event with `reason` about `regarding` (its series' last
/// observation when it repeated).
pub async fn event_time(
    client: &Client,
    namespace: &str,
    regarding: &str,
    reason: &str,
) -> k8s_openapi::jiff::Timestamp {
    projection_tests::events_about(client, namespace, regarding)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| {
            let first = e.event_time.map(|t| t.0);
            let last = e.series.map(|s| s.last_observed_time.0);
            first.max(last)
        })
        .max()
        .unwrap_or_else(|| panic!("no {reason} event about {namespace}/{regarding}"))
}

/// Waits until the controller has logged a reconcile of `name` (`namespace/name` for a Projection)
/// that ended after `at`. The "reconciled" line is written right after the reconcile counted itself
/// in `projection_reconcile_total`, so from then on that count includes it: a settled baseline
/// when `at` is the time of an event the reconcile published.
pub async fn wait_reconciled_after(
    controller: &ServiceProcess,
    name: &str,
    at: k8s_openapi::jiff::Timestamp,
) {
    wait_for(
        &format!("a reconcile of {name} logged after {at}"),
        TIMEOUT,
        || async {
            let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
            let last = log
                .lines()
                // Not by the parsed `message`: the line carries the outcome's message under the
                // same key, and the parser keeps the last.
                .filter(|l| l.contains(r#""message":"reconciled""#))
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["fields"]["name"] == name)
                .filter_map(|v| {
                    v["timestamp"]
                        .as_str()?
                        .parse::<k8s_openapi::jiff::Timestamp>()
                        .ok()
                })
                .max();
            match last {
                Some(t) if t > at => Ok(()),
                other => Err(format!("last logged: {other:?}")),
            }
        },
    )
    .await;
}

/// Makes `change` (an edit, a deletion) and waits until the controller has reconciled `name` after
/// it began: how a test knows the change was looked at, also when nothing should come of it.
pub async fn change_and_wait_reconciled<T>(
    controller: &ServiceProcess,
    name: &str,
    change: impl std::future::Future<Output = T>,
) -> T {
    let started = k8s_openapi::jiff::Timestamp::now();
    let outcome = change.await;
    wait_reconciled_after(controller, name, started).await;
    outcome
}

/// A barrier on the controller's watch of ConfigMaps: edits the source of a probe (a CR of the
/// other kind, so the counters under test stay untouched) and waits for its copy to follow. The
/// watch delivers events in order, so once the copy follows, every event before the edit (the
/// ones our own writes caused included) has been routed, and anything it woke is under way.
pub async fn watch_barrier(
    probe_source: &Api<ConfigMap>,
    probe_copy: &Api<ConfigMap>,
    name: &str,
    round: u32,
) {
    let round = round.to_string();
    merge(probe_source, name, json!({"data": {"barrier": round}})).await;
    wait_object(probe_copy, name, "the probe's copy after the barrier edit", |c| {
        data_of(c)["barrier"] == round.as_str()
    })
    .await;
}

/// The `retry_in` of every failed reconcile of `name` (`<namespace>/<name>`) the controller logged,
/// in order.
pub fn retries_of(controller: &ServiceProcess, name: &str) -> Vec<String> {
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("reconcile failed") && l.contains(&format!("\"name\":\"{name}\"")))
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            v["fields"]["retry_in"].as_str().map(str::to_owned)
        })
        .collect()
}

/// Waits until the controller has logged a failed reconcile of `name` retried in `delay` (e.g.
/// `2s`): the backoff has grown that far.
pub async fn wait_retry_delay(controller: &ServiceProcess, name: &str, delay: &str) {
    wait_for(
        &format!("the retry delay grown to {delay}"),
        Duration::from_secs(30),
        || async {
            let retries = retries_of(controller, name);
            retries
                .iter()
                .any(|r| r == delay)
                .then_some(())
                .ok_or_else(|| format!("retry_in so far: {retries:?}"))
        },
    )
    .await;
}

/// How many of the lines `process` logged say `message` about the source kind `kind` (as the
/// controller names it: `/PodTemplate`, `apps/Deployment`).
pub fn lines_about_kind(process: &ServiceProcess, message: &str, kind: &str) -> usize {
    std::fs::read_to_string(&process.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == message && l["fields"]["kind"] == kind)
        .count()
}

/// The lines the controller logged at WARN or ERROR that mention `needle`.
pub fn loud_lines_about(controller: &ServiceProcess, needle: &str) -> usize {
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains(needle))
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .is_ok_and(|v| matches!(v["level"].as_str(), Some("WARN" | "ERROR")))
        })
        .count()
}

/// Installs a namespaced `Widget` CRD of `group` serving `versions` (the first stored), and waits
/// until it is established; returns its name. `widgets` reads and writes its objects.
pub async fn install_widget_crd(client: &Client, group: &str, versions: &[&str]) -> String {
    let plural = "widgets";
    let name = format!("{plural}.{group}");
    let versions: Vec<Value> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"name": v, "served": true, "storage": i == 0, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}))
        .collect();
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": plural, "singular": "widget", "kind": "Widget"},
                 "versions": versions}}))
    .expect("crd");
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("projection-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("CRD applied");
    wait_crd_established(client, &name).await;
    name
}

/// The `Widget`s of `group`/`version` in `namespace`.
pub fn widgets(client: &Client, group: &str, version: &str, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The record the webhook writes for `user`: impersonated users get `system:authenticated` too.
pub fn record(user: &str, groups: &[&str]) -> String {
    let mut all: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
    all.push("system:authenticated".to_owned());
    Author::of(user, &all).expect("recordable").record()
}

/// Grants `user` the `verbs` on `resources` (core group unless `group`) in `namespace`, optionally
/// on `names` only.
pub async fn grant(client: &Client, namespace: &str, user: &str, rule: Value) {
    let name = format!("grant-{}", rand_suffix(user, &rule));
    let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
    create(&roles, json!({"metadata": {"name": name}, "rules": [rule]})).await;
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    create(
        &bindings,
        json!({"metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    )
    .await;
    // The apiserver's authorizer learns of a binding from a watch of its own, a moment after it is
    // created: the test acts as `user` once the authorizer answers by it (the rule's first verb,
    // group and resource, and its first resource name if any).
    let first = |field: &str| rule[field][0].as_str().map(str::to_owned);
    let verb = first("verbs")
        .filter(|v| v != "*")
        .unwrap_or_else(|| "get".to_owned());
    let (group, resource) = (
        first("apiGroups").unwrap_or_default(),
        first("resources").unwrap_or_default(),
    );
    let object = first("resourceNames");
    wait_for("the grant to be in force", TIMEOUT, || {
        let (verb, group, resource, object) = (&verb, &group, &resource, object.as_deref());
        async move {
            projection_tests::chart::can(user, &[], verb, group, resource, Some(namespace), object)
                .then_some(())
                .ok_or(format!("{user} may not {verb} {resource} in {namespace} yet"))
        }
    })
    .await;
}

/// An RBAC rule: `verb` on `resource` of `group`.
pub fn rule(group: &str, resource: &str, verb: &str) -> Value {
    json!({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
}

pub fn rand_suffix(user: &str, rule: &Value) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (user, rule.to_string()).hash(&mut h);
    format!("{:x}", h.finish())
}
