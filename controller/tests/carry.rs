//! What a copy carries (SPEC §10, issue 13) against the real control plane, as a user sees it:
//! `spec.keys`, `spec.fields.exclude`, metadata hygiene and `spec.metadata`, and
//! `projection.sh/source-hash` with `status.sourceHash`. Each test runs its own controller process.

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
};
use kube::{Api, ResourceExt};
use projection_tests::{TestNamespace, events_about, wait_for};
use serde_json::{Value, json};
use shared::api::crd::ClusterProjection;

mod common;
use common::*;

const HASH: &str = "projection.sh/source-hash";

/// base64 of a few bytes: the apiserver checks a TLS Secret's keys are present, not their content.
const PEM: &str = "LS0tLS1CRUdJTi0tLS0t";

fn hash_of<K: kube::Resource>(object: &K) -> Option<String> {
    object.annotations().get(HASH).cloned()
}

/// Waits until the Projection reports a source hash and its copy (of kind `K`) carries that hash;
/// returns the hash.
async fn wait_current<K>(env: &Env, projection: &str, copies: &Api<K>, copy: &str) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let projections = env.projections();
    wait_for(
        &format!("{copy} carries the hash {projection} reports"),
        TIMEOUT,
        || async {
            let p = projections.get(projection).await.map_err(|e| e.to_string())?;
            let reported = p.status.and_then(|s| s.copy.source_hash);
            let carried = copies
                .get_opt(copy)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|c| hash_of(&c));
            match (reported, carried) {
                (Some(r), Some(c)) if r == c => Ok(r),
                other => Err(format!("reported, carried: {other:?}")),
            }
        },
    )
    .await
}

/// How many times the controller reported `reason` about `regarding` (a repeated event counts its
/// series).
async fn event_count(env: &Env, namespace: &str, regarding: &str, reason: &str) -> i32 {
    events_about(&env.client, namespace, regarding)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

fn tls_secret(name: &str) -> Value {
    json!({"metadata": {"name": name, "annotations": {
            "projection.sh/projectable": "true",
            "cert-manager.io/certificate-name": name,
            "cert-manager.io/issuer-name": "platform-ca",
            "cert-manager.io/issuer-kind": "ClusterIssuer"},
           "labels": {"controller.cert-manager.io/fao": "true", "app": "web"}},
           "type": "kubernetes.io/tls",
           "data": {"ca.crt": PEM, "tls.crt": PEM, "tls.key": PEM}})
}

/// Creates the opted-in TLS Secret `web-tls` in the source namespace; returns the (pinned) source
/// reference to it that the TLS tests project.
async fn tls_source(env: &Env) -> Value {
    create(&env.api::<Secret>(env.source.name()), tls_secret("web-tls")).await;
    json!({"version": "v1", "kind": "Secret", "namespace": env.source.name(), "name": "web-tls"})
}

#[tokio::test]
async fn only_ca_crt_of_a_tls_secret_travels_as_opaque_when_allowed_and_is_refused_otherwise() {
    let env = env("carry-ca").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    let source = tls_source(&env).await;
    create(
        &env.projections(),
        projection(
            "ca",
            source.clone(),
            json!({"destination": {"name": "web-ca"},
                   "keys": {"include": ["ca.crt"], "allowTypeChange": true}}),
        ),
    )
    .await;
    create(
        &env.projections(),
        projection(
            "strict",
            source,
            json!({"destination": {"name": "web-ca-strict"}, "keys": {"include": ["ca.crt"]}}),
        ),
    )
    .await;

    wait_ready(&env.projections(), "ca").await;
    let copies = env.api::<Secret>(&dst);
    wait_current(&env, "ca", &copies, "web-ca").await;
    let copy = copies.get("web-ca").await.expect("copy");
    assert_eq!(copy.type_.as_deref(), Some("Opaque"));
    let keys: Vec<String> = copy.data.clone().unwrap_or_default().into_keys().collect();
    assert_eq!(keys, ["ca.crt"], "never tls.key, never tls.crt");
    assert!(
        !copy
            .annotations()
            .keys()
            .any(|k| k.starts_with("cert-manager.io/")),
        "cert-manager's annotations stay on the source: {:?}",
        copy.annotations()
    );
    assert_eq!(
        copy.labels().get("controller.cert-manager.io/fao"),
        None,
        "cert-manager's label stays on the source"
    );
    assert_eq!(copy.labels().get("app").map(String::as_str), Some("web"));

    let refused = wait_condition(
        &env.projections(),
        "strict",
        "DestinationWritten",
        "False",
        Some("DestinationInvalid"),
    )
    .await;
    assert_eq!(
        refused["message"],
        "spec.keys: a Secret of type kubernetes.io/tls needs the keys tls.crt and tls.key (missing: \
         tls.crt, tls.key) after spec.keys; set spec.keys.allowTypeChange: true to copy it as type \
         Opaque, or keep those keys"
    );
    assert!(
        copies.get_opt("web-ca-strict").await.expect("read").is_none(),
        "nothing is written for a refused spec"
    );
    let event = projection_tests::wait_for_event(&env.client, &dst, "strict", "DestinationInvalid").await;
    assert!(
        event.starts_with("spec.keys: a Secret of type kubernetes.io/tls"),
        "{event}"
    );
    env.finish().await;
}

#[tokio::test]
async fn narrowing_an_existing_tls_copy_to_ca_crt_recreates_it_as_opaque() {
    let env = env("carry-retype").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    let source = tls_source(&env).await;
    create(&env.projections(), projection("tls", source, json!({}))).await;
    let copies = env.api::<Secret>(&dst);
    wait_current(&env, "tls", &copies, "web-tls").await;
    let first = copies.get("web-tls").await.expect("copy");
    assert_eq!(first.type_.as_deref(), Some("kubernetes.io/tls"));

    // A Secret's type is immutable: the copy is deleted and created again, as type Opaque.
    merge(
        &env.projections(),
        "tls",
        json!({"spec": {"keys": {"include": ["ca.crt"], "allowTypeChange": true}}}),
    )
    .await;
    let copy = wait_object(&copies, "web-tls", "the copy as Opaque", |c| {
        c.type_.as_deref() == Some("Opaque")
    })
    .await;
    assert_ne!(copy.uid(), first.uid(), "recreated");
    let keys: Vec<String> = copy.data.clone().unwrap_or_default().into_keys().collect();
    assert_eq!(keys, ["ca.crt"]);
    let note = projection_tests::wait_for_event(&env.client, &dst, "tls", "DestinationRecreated").await;
    assert!(note.starts_with(&format!("recreated {dst}/web-tls")), "{note}");
    wait_current(&env, "tls", &copies, "web-tls").await;
    env.finish().await;
}

#[tokio::test]
async fn keys_follow_the_include_list_and_renames() {
    let env = env("carry-keys").await;
    let _controller = controller(&[]).await;
    let (_, dst) = env.names();
    env.project_new_configmap(
        "cfg",
        "cfg",
        json!({"a": "1", "b": "2", "c": "3"}),
        json!({"keys": {"include": ["a", "b"], "rename": {"b": "bee"}}}),
    )
    .await;
    let copies = env.api::<ConfigMap>(&dst);
    let first = wait_current(&env, "cfg", &copies, "cfg").await;
    assert_eq!(
        data_of(&copies.get("cfg").await.expect("copy")),
        json!({"a": "1", "bee": "2"})
    );

    // A key removed from the include list disappears from the copy.
    merge(
        &env.projections(),
        "cfg",
        json!({"spec": {"keys": {"include": ["a"]}}}),
    )
    .await;
    let copy = wait_object(&copies, "cfg", "bee gone from the copy", |c| {
        data_of(c) == json!({"a": "1"})
    })
    .await;
    let second = wait_current(&env, "cfg", &copies, "cfg").await;
    assert_ne!(second, first, "another content, another hash");
    assert_eq!(hash_of(&copy).as_deref(), Some(second.as_str()));

    // A source without any selected key is reported, and the copy is left as it was.
    merge(
        &env.projections(),
        "cfg",
        json!({"spec": {"keys": {"include": ["nothing-*"]}}}),
    )
    .await;
    let refused = wait_not_ready(&env.projections(), "cfg", "DestinationInvalid").await;
    assert_eq!(
        refused["message"],
        "spec.keys: the source has none of the selected keys (it has 3); nothing was written (fix \
         spec.keys.include/exclude, or set spec.keys.allowEmpty: true to copy an empty object)"
    );
    assert_eq!(
        data_of(&copies.get("cfg").await.expect("copy")),
        json!({"a": "1"})
    );
    env.finish().await;
}

#[tokio::test]
async fn an_excluded_field_is_absent_from_a_deployment_copy() {
    let env = env("carry-fields").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    create(
        &env.api::<Deployment>(&src),
        json!({"metadata": {"name": "web", "annotations": opted_in()},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"nodeSelector": {"disk": "ssd"},
                                              "containers": [{"name": "web", "image": "local.test/none:1"}]}}}}),
    )
    .await;
    create(
        &env.projections(),
        projection(
            "web",
            json!({"group": "apps", "version": "v1", "kind": "Deployment", "namespace": src, "name": "web"}),
            json!({"fields": {"exclude": ["$.spec.template.spec.nodeSelector"]}}),
        ),
    )
    .await;
    wait_ready(&env.projections(), "web").await;
    let copies = env.api::<Deployment>(&dst);
    wait_current(&env, "web", &copies, "web").await;
    let copy = copies.get("web").await.expect("copy");
    let template = copy
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod template");
    assert_eq!(template.node_selector, None, "the excluded field is not copied");
    assert_eq!(template.containers[0].image.as_deref(), Some("local.test/none:1"));
    env.finish().await;
}

#[tokio::test]
async fn tracking_metadata_of_other_tools_stays_behind_unless_included() {
    let env = env("carry-hygiene").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    create(
        &env.api::<ConfigMap>(&src),
        json!({"metadata": {"name": "cfg",
            "annotations": {"projection.sh/projectable": "true",
                "argocd.argoproj.io/tracking-id": "platform:/ConfigMap:src/cfg",
                "meta.helm.sh/release-name": "platform",
                "meta.helm.sh/release-namespace": src,
                "kustomize.toolkit.fluxcd.io/checksum": "abc",
                "reflector.v1.k8s.emberstack.com/reflection-allowed": "true",
                "team.example.com/owner": "platform"},
            "labels": {"kustomize.toolkit.fluxcd.io/name": "infra",
                "helm.toolkit.fluxcd.io/name": "platform",
                "app": "web"}},
            "data": {"a": "1"}}),
    )
    .await;
    env.project_configmap(
        "cfg",
        "cfg",
        json!({"metadata": {"annotations": {"include": ["argocd.argoproj.io/tracking-id"]}}}),
    )
    .await;
    let copies = env.api::<ConfigMap>(&dst);
    wait_current(&env, "cfg", &copies, "cfg").await;
    let copy = copies.get("cfg").await.expect("copy");
    let mut annotations: Vec<&str> = copy.annotations().keys().map(String::as_str).collect();
    annotations.sort_unstable();
    assert_eq!(
        annotations,
        [
            "argocd.argoproj.io/tracking-id",
            "projection.sh/owned-by-projection",
            HASH,
            "team.example.com/owner",
        ],
        "only the included tool key and the source's own annotation travel"
    );
    let mut labels: Vec<&str> = copy.labels().keys().map(String::as_str).collect();
    labels.sort_unstable();
    assert_eq!(labels, ["app", "projection.sh/owned-by-projection-uid"]);
    env.finish().await;
}

#[tokio::test]
async fn the_hash_changes_exactly_when_the_content_does_with_one_write_per_change() {
    let env = env("carry-hash").await;
    let controller = controller(&[]).await;
    let (src, dst) = env.names();
    let sources = env.api::<ConfigMap>(&src);
    env.project_new_configmap("cfg", "cfg", json!({"a": "1"}), json!({}))
        .await;
    let copies = env.api::<ConfigMap>(&dst);
    let first = wait_current(&env, "cfg", &copies, "cfg").await;
    assert_eq!(first.len(), 64);
    let rv = copies.get("cfg").await.expect("copy").resource_version();
    let name = format!("{dst}/cfg");

    // A metadata-only edit that the copy does not carry: reconciled, no write, same hash.
    let edit = merge(
        &sources,
        "cfg",
        json!({"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": "platform:/ConfigMap:x/cfg"}}}),
    );
    change_and_wait_reconciled(&controller, &name, edit).await;
    let copy = copies.get("cfg").await.expect("copy");
    assert_eq!(
        copy.resource_version(),
        rv,
        "no write for what the copy does not carry"
    );
    assert_eq!(hash_of(&copy).as_deref(), Some(first.as_str()));
    assert_eq!(event_count(&env, &dst, "cfg", "Updated").await, 0);

    // A real change: a new hash, reported and carried, in exactly one write.
    merge(&sources, "cfg", json!({"data": {"a": "2"}})).await;
    let copy = wait_object(&copies, "cfg", "the edit on the copy", |c| data_of(c)["a"] == "2").await;
    let second = wait_current(&env, "cfg", &copies, "cfg").await;
    assert_ne!(second, first);
    assert_eq!(hash_of(&copy).as_deref(), Some(second.as_str()));
    let rv = copy.resource_version();
    wait_for("one Updated event", TIMEOUT, || async {
        match event_count(&env, &dst, "cfg", "Updated").await {
            1 => Ok(()),
            n => Err(format!("{n} Updated events")),
        }
    })
    .await;
    // Another untracked edit afterwards: still the one write.
    let edit = merge(
        &sources,
        "cfg",
        json!({"metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}}),
    );
    change_and_wait_reconciled(&controller, &name, edit).await;
    assert_eq!(copies.get("cfg").await.expect("copy").resource_version(), rv);
    assert_eq!(event_count(&env, &dst, "cfg", "Updated").await, 1);
    env.finish().await;
}

#[tokio::test]
async fn a_cluster_projection_reports_the_one_hash_all_its_copies_carry() {
    let env = env("carry-cp").await;
    let _controller = controller(&[]).await;
    let (src, dst) = env.names();
    let other = TestNamespace::create(&env.client, "carry-cp-b").await;
    let source = tls_source(&env).await;
    let name = format!("{src}-ca");
    let cps: Api<ClusterProjection> = Api::all(env.client.clone());
    create_cluster_projection(
        &cps,
        &name,
        json!({"source": source,
               "destination": {"name": "platform-ca", "namespaces": [dst, other.name()]},
               "keys": {"include": ["ca.crt"], "rename": {"ca.crt": "root.pem"}, "allowTypeChange": true}}),
    )
    .await;
    let hash = wait_for("the ClusterProjection's hash", TIMEOUT, || async {
        let cp = cps.get(&name).await.map_err(|e| e.to_string())?;
        let status = cp.status.unwrap_or_default();
        match status.copy.source_hash {
            Some(h) if status.counts.namespaces_written == 2 => Ok(h),
            other => Err(format!("{other:?}, written {}", status.counts.namespaces_written)),
        }
    })
    .await;
    for namespace in [dst.as_str(), other.name()] {
        let copy = env
            .api::<Secret>(namespace)
            .get("platform-ca")
            .await
            .expect("copy");
        assert_eq!(hash_of(&copy).as_deref(), Some(hash.as_str()), "{namespace}");
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        let keys: Vec<String> = copy.data.clone().unwrap_or_default().into_keys().collect();
        assert_eq!(keys, ["root.pem"], "{namespace}");
    }
    delete(&cps, &name).await;
    wait_absent(&cps, &name, "the ClusterProjection gone").await;
    env.finish().await;
}
