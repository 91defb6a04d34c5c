//! GitOps health: what the real kstatus library (Flux's health checks, Helm 4's `--wait`) and Helm
//! 4 itself make of the status the controller writes: Current once the copies are in place,
//! InProgress while a generation is not worked on yet or a failure may still resolve, Failed when
//! only a person can help.

mod common;

use common::*;
use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::api::Api;
use projection_tests::{
    TestNamespace, client, exclusive,
    gitops::{Verdict, argocd_health, argocd_health_script, helm4, helm4_home, kstatus},
    install_crds,
};
use serde_json::{Value, json};
use shared::{
    api::{
        crd::{ClusterProjection, CopyStatus, Projection},
        reason::{Progress, Reason},
    },
    pass::status::{Outcome, next_conditions},
};
use std::time::{Duration, Instant};

/// A Projection at `generation` carrying `status`, as the apiserver returns one.
fn projection_with(generation: i64, status: &CopyStatus) -> Value {
    json!({
        "apiVersion": "projection.sh/v1", "kind": "Projection",
        "metadata": {"name": "p", "namespace": "team-a", "generation": generation},
        "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": "a", "name": "b"}},
        "status": status,
    })
}

/// The status a pass writes when it ends with `reason`, at `generation`.
fn status_after(reason: Reason, generation: i64) -> CopyStatus {
    let outcome = match reason {
        Reason::Projected => Outcome::Projected {
            resolved: String::new(),
            note: String::new(),
        },
        r if r.as_str().starts_with("Source") => Outcome::SourceFailed {
            reason: r,
            message: format!("{r} happened"),
        },
        r => Outcome::DestinationFailed {
            resolved: String::new(),
            reason: r,
            message: format!("{r} happened"),
        },
    };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
    CopyStatus {
        observed_generation: Some(generation),
        conditions: next_conditions(&[], &outcome, Some(generation), &now),
        ..CopyStatus::default()
    }
}

#[test]
fn kstatus_and_the_argocd_script_read_every_reason_as_its_progress_says() {
    // Every reason a pass can end with, on Ready; the settled ones that only appear on events end a
    // pass as Projected. (what, object, kstatus, Argo CD)
    let mut table: Vec<(String, Value, &str, &str)> = Vec::new();
    for reason in Reason::ALL {
        let (status, kstatus, argo) = match reason.progress() {
            Progress::Settled => (status_after(Reason::Projected, 3), "Current", "Healthy"),
            Progress::Reconciling => (status_after(*reason, 3), "InProgress", "Progressing"),
            Progress::Stalled => (status_after(*reason, 3), "Failed", "Degraded"),
        };
        table.push((
            reason.as_str().to_owned(),
            projection_with(3, &status),
            kstatus,
            argo,
        ));
    }
    // A generation the controller has not worked on yet, a CR it never reported on (the schema's
    // default status), and a suspended one.
    table.push((
        "newer generation".into(),
        projection_with(4, &status_after(Reason::Projected, 3)),
        "InProgress",
        "Progressing",
    ));
    let never = CopyStatus {
        observed_generation: Some(0),
        ..CopyStatus::default()
    };
    table.push((
        "never reported".into(),
        projection_with(1, &never),
        "InProgress",
        "Progressing",
    ));
    let mut suspended = projection_with(3, &status_after(Reason::Projected, 3));
    suspended["spec"]["suspend"] = json!(true);
    table.push(("suspended".into(), suspended, "Current", "Suspended"));

    let objects: Vec<Value> = table.iter().map(|(_, o, _, _)| o.clone()).collect();
    let verdicts = kstatus(&objects);
    let script = argocd_health_script();
    let expected: Vec<(&str, &str, &str)> = table.iter().map(|(w, _, k, a)| (w.as_str(), *k, *a)).collect();
    let got: Vec<(&str, String, String)> = table
        .iter()
        .zip(&verdicts)
        .map(|((what, object, _, _), v)| (what.as_str(), v.status.clone(), argocd_health(&script, object).0))
        .collect();
    let got: Vec<(&str, &str, &str)> = got.iter().map(|(w, k, a)| (*w, k.as_str(), a.as_str())).collect();
    assert_eq!(got, expected);
    // A failure's verdict carries its reason's message, which Helm 4 and Argo CD show.
    let conflict = Reason::ALL
        .iter()
        .position(|r| *r == Reason::DestinationConflict)
        .expect("DestinationConflict");
    assert_eq!(verdicts[conflict].message, "DestinationConflict happened");
    assert_eq!(
        argocd_health(&script, &objects[conflict]).1,
        "DestinationConflict: DestinationConflict happened"
    );
}

async fn verdict_of(api: &Api<Projection>, name: &str) -> Verdict {
    let object = api.get(name).await.expect("Projection read");
    kstatus(&[serde_json::to_value(object).expect("JSON")]).remove(0)
}

/// Argo CD's health of the Projection `name` as it is now, by the documented script.
async fn argo_of(api: &Api<Projection>, name: &str) -> String {
    let object = api.get(name).await.expect("Projection read");
    argocd_health(
        &argocd_health_script(),
        &serde_json::to_value(object).expect("JSON"),
    )
    .0
}

/// Waits until the controller reported `reason` on `Ready` for the Projection's current
/// generation, then returns kstatus's verdict on it.
async fn verdict_when(api: &Api<Projection>, name: &str, reason: Reason) -> Verdict {
    let ready = if reason == Reason::Projected {
        "True"
    } else {
        "False"
    };
    wait_condition(api, name, "Ready", ready, Some(reason.as_str())).await;
    verdict_of(api, name).await
}

#[tokio::test]
async fn kstatus_follows_real_projections_from_creation_through_failures_and_spec_changes() {
    let env = env("kstatus").await;
    let (src, dst) = env.names();
    let sources: Api<ConfigMap> = env.api(&src);
    let copies: Api<ConfigMap> = env.api(&dst);
    let api = env.projections();
    source_configmap(&sources, "cfg", json!({"k": "v"})).await;

    // Created before any controller runs: the status is the schema's default, not absent.
    env.project_configmap("early", "cfg", json!({})).await;
    let early = verdict_of(&api, "early").await;
    assert_eq!(early.status, "InProgress", "{early:?}");
    assert_eq!(argo_of(&api, "early").await, "Progressing");

    let _controller = controller(&[]).await;
    assert_eq!(
        verdict_when(&api, "early", Reason::Projected).await.status,
        "Current"
    );

    // Failures that may still resolve, and failures that need a person.
    env.project_configmap("missing", "not-there-yet", json!({})).await;
    let missing = verdict_when(&api, "missing", Reason::SourceNotFound).await;
    assert_eq!(missing.status, "InProgress");
    assert_eq!(argo_of(&api, "missing").await, "Progressing");
    assert!(missing.message.contains("not found"), "{missing:?}");

    create(
        &copies,
        json!({"metadata": {"name": "taken"}, "data": {"mine": "yes"}}),
    )
    .await;
    env.project_configmap("conflict", "cfg", json!({"destination": {"name": "taken"}}))
        .await;
    let conflict = verdict_when(&api, "conflict", Reason::DestinationConflict).await;
    assert_eq!(conflict.status, "Failed");
    assert_eq!(argo_of(&api, "conflict").await, "Degraded");
    assert!(conflict.message.contains("not owned"), "{conflict:?}");

    create(
        &sources,
        json!({"metadata": {"name": "vetoed", "annotations": {"projection.sh/projectable": "false"}}}),
    )
    .await;
    env.project_configmap("vetoed", "vetoed", json!({})).await;
    assert_eq!(
        verdict_when(&api, "vetoed", Reason::SourceOptedOut).await.status,
        "Failed"
    );

    env.project_configmap(
        "no-keys",
        "cfg",
        json!({"destination": {"name": "no-keys"}, "keys": {"include": ["absent"]}}),
    )
    .await;
    assert_eq!(
        verdict_when(&api, "no-keys", Reason::DestinationInvalid)
            .await
            .status,
        "Failed"
    );

    env.project_configmap(
        "elsewhere",
        "cfg",
        json!({"destination": {"name": "elsewhere", "kubeConfig": {"secretRef": {"name": "no-such-secret"}}}}),
    )
    .await;
    let elsewhere = verdict_when(&api, "elsewhere", Reason::DestinationClusterInvalid).await;
    assert_eq!(elsewhere.status, "Failed");
    assert!(elsewhere.message.contains("no-such-secret"), "{elsewhere:?}");

    // A source that comes later: InProgress turns Current without anyone touching the CR.
    source_configmap(&sources, "not-there-yet", json!({"k": "late"})).await;
    assert_eq!(
        verdict_when(&api, "missing", Reason::Projected).await.status,
        "Current"
    );

    // A spec change: the answer of the patch itself (new generation, old observedGeneration) reads
    // InProgress, then Current once the controller wrote the new copy.
    let patched = merge(
        &api,
        "early",
        json!({"spec": {"destination": {"name": "renamed"}}}),
    )
    .await;
    let generation = patched.metadata.generation.expect("generation");
    let at_patch = kstatus(&[serde_json::to_value(&patched).expect("JSON")]).remove(0);
    assert_eq!(at_patch.status, "InProgress", "{at_patch:?}");
    assert_eq!(
        verdict_when(&api, "early", Reason::Projected).await.status,
        "Current"
    );
    let early = api.get("early").await.expect("read");
    assert_eq!(
        early.status.as_ref().and_then(|s| s.copy.observed_generation),
        Some(generation)
    );
    assert!(copies.get_opt("renamed").await.expect("read").is_some());
    assert_eq!(argo_of(&api, "early").await, "Healthy");

    // Suspended after it was ready: still Current (nothing is being worked on).
    merge(&api, "early", json!({"spec": {"suspend": true}})).await;
    wait_condition(&api, "early", "Suspended", "True", Some("Suspended")).await;
    assert_eq!(verdict_of(&api, "early").await.status, "Current");
    assert_eq!(argo_of(&api, "early").await, "Suspended");

    env.finish().await;
}

#[tokio::test]
async fn kstatus_fails_a_cluster_projection_in_conflict() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let src = TestNamespace::create(&client, "kstatus-cp-src").await;
    let dst = TestNamespace::create(&client, "kstatus-cp-dst").await;
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), src.name());
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), dst.name());
    source_configmap(&sources, "ca", json!({"ca.crt": "x"})).await;
    create(&copies, json!({"metadata": {"name": "kstatus-ca"}})).await;
    let _controller = controller(&[]).await;
    let cps: Api<ClusterProjection> = Api::all(client.clone());
    let name = format!("kstatus-{}", dst.name());
    create_cluster_projection(
        &cps,
        &name,
        spec_of(
            cm_source(src.name(), "ca"),
            json!({"destination": {"name": "kstatus-ca", "namespaces": [dst.name()]}}),
        ),
    )
    .await;
    let verdict = projection_tests::wait_for("kstatus Failed for the ClusterProjection", TIMEOUT, || async {
        let object = cps.get(&name).await.map_err(|e| e.to_string())?;
        let v = kstatus(&[serde_json::to_value(object).expect("JSON")]).remove(0);
        if v.status == "Failed" {
            Ok(v)
        } else {
            Err(format!("{v:?}"))
        }
    })
    .await;
    assert!(verdict.message.contains(dst.name()), "{verdict:?}");
    delete(&cps, &name).await;
    wait_absent(&cps, &name, "ClusterProjection deleted").await;
}

/// A chart of one opted-in ConfigMap and a Projection of it under `.Values.copyName`.
fn write_chart(dir: &std::path::Path) {
    let templates = dir.join("templates");
    std::fs::create_dir_all(&templates).expect("chart folder");
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: settings\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(dir.join("values.yaml"), "copyName: settings-copy\nvalue: one\n").expect("values");
    std::fs::write(
        templates.join("settings.yaml"),
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  annotations: {projection.sh/projectable: "true"}
data:
  value: {{ .Values.value | quote }}
---
apiVersion: projection.sh/v1
kind: Projection
metadata:
  name: settings
spec:
  source: {version: v1, kind: ConfigMap, namespace: {{ .Release.Namespace }}, name: settings}
  destination: {name: {{ .Values.copyName }}}
"#,
    )
    .expect("template");
}

#[tokio::test]
async fn helm4_wait_waits_for_the_copy_fails_at_once_on_a_stalled_projection_and_waits_for_a_new_generation()
{
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "helm4").await;
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let projections: Api<Projection> = Api::namespaced(client.clone(), ns.name());
    let home = helm4_home("wait");
    let chart = home.join("chart");
    write_chart(&chart);
    let chart = chart.to_str().expect("UTF-8 path").to_owned();
    let _controller = controller(&[]).await;
    let helm = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-n", ns.name(), "--wait=watcher", "--timeout", "120s"]);
        helm4(&home, &all)
    };

    // Install: helm returns once the copy is there, not before.
    let out = helm(&["install", "settings", &chart]);
    assert!(
        out.status.success(),
        "helm4 install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = copies.get_opt("settings-copy").await.expect("read");
    assert_eq!(
        copy.and_then(|c| c.data)
            .and_then(|d| d.get("value").cloned())
            .as_deref(),
        Some("one"),
        "the copy exists when helm --wait returns"
    );

    // An upgrade that changes the Projection's spec waits for the new generation's copy.
    let out = helm(&[
        "upgrade",
        "settings",
        &chart,
        "--set",
        "copyName=renamed-copy",
        "--set",
        "value=two",
    ]);
    assert!(
        out.status.success(),
        "helm4 upgrade: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = projections.get("settings").await.expect("read");
    assert_eq!(
        p.status.as_ref().and_then(|s| s.copy.observed_generation),
        p.metadata.generation,
        "helm returned after the controller worked on the new generation"
    );
    let copy = copies.get_opt("renamed-copy").await.expect("read");
    assert_eq!(
        copy.and_then(|c| c.data)
            .and_then(|d| d.get("value").cloned())
            .as_deref(),
        Some("two")
    );

    // A stranger holds the copy's name: Stalled, and helm fails at once with the reason's message
    // rather than at its timeout.
    create(
        &copies,
        json!({"metadata": {"name": "held"}, "data": {"mine": "yes"}}),
    )
    .await;
    let started = Instant::now();
    let out = helm(&["upgrade", "settings", &chart, "--set", "copyName=held"]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "helm4 upgrade into a conflict succeeded");
    assert!(
        stderr.contains("status: Failed") && stderr.contains("not owned"),
        "helm4 names the failure: {stderr}"
    );
    assert!(
        took < Duration::from_secs(60),
        "failed after {took:?}, not at once"
    );

    let out = helm(&["uninstall", "settings"]);
    assert!(
        out.status.success(),
        "helm4 uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&home);
}
