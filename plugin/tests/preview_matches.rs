//! `preview` is the controller's own pass with a writer that only describes: for the same manifest,
//! its action in each namespace is what a controller checking authors (`--author-access=enforce`)
//! then does there, across every action of the table in docs/kubectl-plugin.md, with the author
//! checks asked as the CR's recorded author (`--as-author`).

mod common;

use common::{Cleanup, apply, cluster_ready, controller_binary, plugin, plugin_with};
use k8s_openapi::api::{
    core::v1::ConfigMap,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use projection_tests::{ServiceProcess, TestNamespace, client, exclusive, install_crds, wait_for};
use serde_json::{Value, json};
use shared::{
    api::{
        crd::{ClusterProjection, Projection},
        keys::{ADOPT_BY, OWNED_BY_CLUSTER_PROJECTION},
    },
    copy::{adoption::adoption_value, ownership::Owner},
    policy::author::Author,
};
use std::collections::BTreeMap;

/// Grants `user` `verbs` on ConfigMaps in `namespace` (on `names` only, when given).
async fn grant(client: &Client, namespace: &str, user: &str, verbs: &[&str], names: &[&str]) {
    let mut rule = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs});
    if !names.is_empty() {
        rule["resourceNames"] = json!(names);
    }
    let name = format!("preview-{}", verbs.join("-"));
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "rules": [rule]})).expect("a Role"),
        )
        .await
        .expect("creating a Role");
    let binding = json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).expect("a RoleBinding"),
        )
        .await
        .expect("creating a RoleBinding");
}

/// A ClusterProjection of `src/settings` into `namespaces`, recorded as written by `author` (no
/// webhook runs here: the record is the manifest's own).
fn fan(name: &str, src: &str, namespaces: &[&str], author: &str, extra: &str) -> String {
    let annotations = serde_json::to_string(&json!({"projection.sh/author": author})).expect("JSON");
    format!(
        "apiVersion: projection.sh/v1\nkind: ClusterProjection\nmetadata: {{name: {name}, annotations: {annotations}}}\n\
         spec: {{source: {{kind: ConfigMap, namespace: {src}, name: settings}}, \
         destination: {{namespaces: [{}]}}{extra}}}\n",
        namespaces.join(", ")
    )
}

/// The ConfigMap `settings` in `namespace` as it is now.
async fn settings(client: &Client, namespace: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt("settings")
        .await
        .expect("reading a ConfigMap")
}

/// Whether `name` owns `object` (its ownership annotation, the only proof).
fn owned_by(object: &ConfigMap, name: &str) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OWNED_BY_CLUSTER_PROJECTION))
        .is_some_and(|owner| owner == name)
}

/// Waits until the controller has reported on generation `generation` of `name`, and returns its
/// status.
async fn reported(client: &Client, name: &str, generation: i64) -> Value {
    let api = Api::<ClusterProjection>::all(client.clone());
    wait_for(
        &format!("{name} reported on generation {generation}"),
        common::TIMEOUT,
        || async {
            let cr = serde_json::to_value(api.get(name).await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            let ready = cr["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
                .unwrap_or_default();
            (ready["observedGeneration"] == generation)
                .then(|| cr["status"].clone())
                .ok_or_else(|| format!("{ready}"))
        },
    )
    .await
}

/// What the controller did in a namespace, read from the objects before and after its pass and the
/// failures its status lists, in the words of preview's actions.
fn did(
    namespace: &str,
    before: Option<&ConfigMap>,
    after: Option<&ConfigMap>,
    (fan, status): (&str, &Value),
) -> String {
    let failed = status["failedNamespaces"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["namespace"] == namespace))
        .map(|f| f["reason"].as_str().unwrap_or_default().to_owned());
    let action = match (failed.as_deref(), before, after) {
        (Some("DestinationConflict"), ..) => "conflict",
        (Some("DestinationForbidden"), ..) => "refused",
        (Some(other), ..) => panic!("{namespace} failed with {other}: {status}"),
        (None, None, None) => "skipped",
        (None, Some(_), None) => "remove",
        (None, None, Some(_)) => "create",
        (None, Some(b), Some(a)) if !owned_by(b, fan) && owned_by(a, fan) => "adopt",
        (None, Some(b), Some(a)) if b.metadata.resource_version != a.metadata.resource_version => "update",
        (None, Some(_), Some(_)) => "unchanged",
    };
    action.to_owned()
}

#[tokio::test]
async fn preview_shows_in_each_namespace_what_the_controller_then_does() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let pid = std::process::id();
    let mut namespaces = Vec::new();
    for suffix in [
        "src", "create", "update", "same", "adopt", "conflict", "gone", "denied",
    ] {
        namespaces.push(TestNamespace::create(&client, &format!("plugin-same-{suffix}")).await);
    }
    let ns: Vec<String> = namespaces.iter().map(|n| n.name().to_owned()).collect();
    let [src, create, update, same, adopt, conflict, gone, denied] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| ns[i].as_str());
    let pending = format!("{denied}-absent");
    let name = format!("plugin-same-{pid}");

    // The author may read the source and write ConfigMaps in every target but `denied`.
    let tenant = format!("plugin-tenant-{pid}");
    let author = Author::of(&tenant, &[]).expect("a valid author").record();
    grant(&client, src, &tenant, &["get"], &["settings"]).await;
    for namespace in [create, update, same, adopt, conflict, gone] {
        grant(
            &client,
            namespace,
            &tenant,
            &["get", "create", "patch", "update"],
            &[],
        )
        .await;
    }
    let mut controller = ServiceProcess::start(
        controller_binary(),
        &["--requeue-interval", "5m", "--author-access=enforce"],
    );
    controller.wait_ready().await;
    let mut cleanup = Cleanup::new();
    cleanup.cluster_projection(&name);

    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {src}, annotations: \
         {{projection.sh/projectable: \"true\"}}}}\ndata: {{a: '1'}}\n"
    ));
    apply(&fan(&name, src, &[update, same, gone], &author, ""));
    cluster_ready(&client, &name, "True", "Projected").await;
    // Held while `update`'s copy is edited by hand (it would be repaired at once otherwise).
    plugin(&["suspend", &format!("clusterprojection/{name}")]).expect(0);
    common::cluster_suspended(&client, &name).await;
    let configmaps = |namespace: &str| Api::<ConfigMap>::namespaced(client.clone(), namespace);
    configmaps(update)
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "by hand"}})),
        )
        .await
        .expect("editing a copy");
    // A stranger's object whose owner consents to adoption, and one that does not.
    let uid = Api::<ClusterProjection>::all(client.clone())
        .get(&name)
        .await
        .expect("the ClusterProjection")
        .metadata
        .uid
        .unwrap_or_default();
    let consent = adoption_value(&Owner::ClusterProjection {
        name: name.clone(),
        uid,
        cluster: None,
    });
    let annotations = serde_json::to_string(&json!({ADOPT_BY: consent})).expect("JSON");
    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {adopt}, annotations: {annotations}}}\n"
    ));
    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {conflict}}}\n"
    ));

    // The manifest as it will be applied: `gone` leaves, five namespaces join, and it resumes.
    let targets = [create, update, same, adopt, conflict, denied, pending.as_str()];
    let manifest = fan(&name, src, &targets, &author, ", suspend: false");
    let preview = plugin_with(
        &["preview", "-f", "-", "-o", "json", "--as-author"],
        Some(&manifest),
        &[],
    )
    .expect(4)
    .json();
    let previewed: BTreeMap<String, String> = common::preview_actions(&preview).into_iter().collect();
    let every: std::collections::BTreeSet<&str> = previewed.values().map(String::as_str).collect();
    assert_eq!(
        every,
        [
            "adopt",
            "conflict",
            "create",
            "refused",
            "remove",
            "skipped",
            "unchanged",
            "update"
        ]
        .into(),
        "every action of the table: {preview}"
    );

    let mut before = BTreeMap::new();
    for namespace in targets.iter().chain([&gone]) {
        before.insert(namespace.to_string(), settings(&client, namespace).await);
    }
    apply(&manifest);
    let generation = Api::<ClusterProjection>::all(client.clone())
        .get(&name)
        .await
        .expect("the ClusterProjection")
        .metadata
        .generation
        .unwrap_or_default();
    let status = reported(&client, &name, generation).await;
    let mut done = BTreeMap::new();
    for (namespace, was) in &before {
        let now = settings(&client, namespace).await;
        let action = did(namespace, was.as_ref(), now.as_ref(), (&name, &status));
        done.insert(namespace.clone(), action);
    }
    assert_eq!(previewed, done, "preview {preview}\nstatus {status}");

    // A pass that stops says so in both, with the same reason: an author who may not read the
    // source (asked as that author).
    let stranger = format!("plugin-stranger-{pid}");
    let record = Author::of(&stranger, &[]).expect("a valid author").record();
    let annotations = serde_json::to_string(&json!({"projection.sh/author": record})).expect("JSON");
    let mirror = format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: mirror, namespace: {create}, \
         annotations: {annotations}}}\nspec: {{source: {{kind: ConfigMap, namespace: {src}, name: settings}}}}\n"
    );
    cleanup.projections(create);
    let preview = plugin_with(
        &["preview", "-f", "-", "-o", "json", "--as-author"],
        Some(&mirror),
        &[],
    )
    .expect(4)
    .json();
    assert_eq!(preview[0]["stopped"]["reason"], "SourceForbidden", "{preview}");
    apply(&mirror);
    common::projection_ready(&client, create, "mirror", "False", "SourceForbidden").await;
    let message = serde_json::to_value(
        Api::<Projection>::namespaced(client.clone(), create)
            .get("mirror")
            .await
            .expect("the Projection"),
    )
    .expect("JSON")["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default()["message"]
        .clone();
    assert_eq!(
        preview[0]["stopped"]["message"], message,
        "the controller's own words"
    );
    // Dropped in reverse: the CRs first while the controller removes their copies, then the
    // controller, then the namespaces.
}
