//! `kubectl projection` and copies in another cluster: `why` run against the cluster the copy is in
//! names the cluster its CR lives in, and with `--source-context` reads the CR, its source and its
//! events there, after checking that context is the cluster the copy names; `sources` in the CR's
//! cluster says where the copies are; `preview` reads the other cluster through the CR's kubeconfig
//! Secret, as the controller does.

mod common;

use common::{Run, controller, plugin_raw};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use projection_tests::{
    TestNamespace, client, exclusive, install_crds, kubeconfig_path,
    remote::{RemoteNamespace, remote_client, remote_kubeconfig_path, service_account_kubeconfig},
    wait_for,
};
use serde_json::{Value, json};
use shared::api::crd::Projection;
use std::time::Duration;

/// One kubeconfig holding both clusters as the admin, as contexts `here` (the CRs' cluster) and
/// `there` (the other one): what a user with both in `$KUBECONFIG` has.
fn both_clusters(path: &std::path::Path) {
    let read = |file: &std::path::Path| -> Value {
        serde_yaml::from_str(&std::fs::read_to_string(file).expect("a kubeconfig")).expect("YAML")
    };
    let mut merged = json!({"apiVersion": "v1", "kind": "Config", "current-context": "there",
                            "clusters": [], "users": [], "contexts": []});
    for (name, file) in [("here", kubeconfig_path()), ("there", remote_kubeconfig_path())] {
        let config = read(&file);
        let mut cluster = config["clusters"][0].clone();
        cluster["name"] = json!(name);
        let mut user = config["users"][0].clone();
        user["name"] = json!(name);
        for (list, entry) in [("clusters", cluster), ("users", user)] {
            merged[list].as_array_mut().expect("a list").push(entry);
        }
        merged["contexts"]
            .as_array_mut()
            .expect("a list")
            .push(json!({"name": name, "context": {"cluster": name, "user": name}}));
    }
    std::fs::write(path, serde_yaml::to_string(&merged).expect("YAML")).expect("written");
}

#[tokio::test]
async fn why_follows_a_copy_in_another_cluster_back_to_its_cr() {
    let _serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let src = TestNamespace::create(&client, "plugin-remote-src").await;
    let dst = TestNamespace::create(&client, "plugin-remote-dst").await;
    let remote = remote_client().await;
    let there = RemoteNamespace::create_named(&remote, dst.name(), json!({})).await;
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"],
                        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]);
    let kubeconfig =
        service_account_kubeconfig(&remote, (there.name(), "copies"), (&[dst.name()], rules), None).await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "other-cluster"}, "stringData": {"value": kubeconfig}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), dst.name())
        .patch(
            "other-cluster",
            &PatchParams::apply("projection-tests"),
            &Patch::Apply(&secret),
        )
        .await
        .expect("the Secret");
    let _controller = controller().await;
    let source: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings", "annotations": {"projection.sh/projectable": "true"}},
        "data": {"level": "1"}
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), src.name())
        .create(&PostParams::default(), &source)
        .await
        .expect("the source");
    let projection: Projection = serde_json::from_value(json!({
        "metadata": {"name": "mirror"},
        "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": src.name(), "name": "settings"},
                 "destination": {"kubeConfig": {"secretRef": {"name": "other-cluster"}}}}
    }))
    .expect("a Projection");
    Api::<Projection>::namespaced(client.clone(), dst.name())
        .create(&PostParams::default(), &projection)
        .await
        .expect("the Projection");
    let copies: Api<ConfigMap> = Api::namespaced(remote.clone(), dst.name());
    wait_for("the copy over there", Duration::from_secs(30), || async {
        match copies.get_opt("settings").await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let merged = tempfile_path("both-clusters.kubeconfig");
    both_clusters(&merged);
    let why = |extra: &[&str]| -> Run {
        let mut args = vec![
            "--kubeconfig",
            merged.to_str().expect("UTF-8"),
            "--context",
            "there",
            "why",
            "cm/settings",
            "-n",
            dst.name(),
        ];
        args.extend_from_slice(extra);
        plugin_raw(&args, None, &[])
    };
    // Without the context of the CR's cluster: a usage error saying which flag names it.
    let run = why(&[]).expect(2);
    assert!(
        run.stderr.contains("written from another cluster") && run.stderr.contains("--source-context"),
        "{run:?}"
    );
    // The wrong cluster is refused.
    let run = why(&["--source-context", "there"]).expect(2);
    assert!(run.stderr.contains("name the context of that cluster"), "{run:?}");
    // The right one: the CR, its source, and the copy current.
    let run = why(&["--source-context", "here"]).expect(0);
    run.line_with(&["Written from another cluster", "read through context here"]);
    run.line_with(&["Owned by:", &format!("projection mirror -n {}", dst.name())]);
    run.line_with(&["Source:", &format!("ConfigMap {}/settings", src.name())]);
    run.line_with(&["Copy:", "current"]);
    let report = why(&["--source-context", "here", "-o", "json"]).expect(0).json();
    assert_eq!(report["writtenFrom"]["context"], "here");
    assert_eq!(report["ownedBy"][0]["copy"]["state"], "current");

    // sources, in the CR's cluster: the reader, and where its copies are, not read here.
    let sources = |output: &str| -> Run {
        let args = [
            "--kubeconfig",
            merged.to_str().expect("UTF-8"),
            "--context",
            "here",
            "sources",
            "cm/settings",
            "-n",
            src.name(),
            "-o",
            output,
        ];
        plugin_raw(&args, None, &[])
    };
    sources("table")
        .expect(0)
        .line_with(&["mirror", "in the cluster of Secret other-cluster key value"]);
    let report = sources("json").expect(0).json();
    assert_eq!(
        report["readers"][0]["cluster"],
        "the cluster of Secret other-cluster key value"
    );

    // preview reads the other cluster as the controller does, through the CR's kubeconfig Secret:
    // the existing CR's copy there is current; another CR aiming at it would meet a copy it does
    // not own; a Secret that does not exist stops the pass with the controller's reason.
    let preview = |name: &str, secret: &str| -> Run {
        let manifest = serde_json::to_string(&json!({
            "apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": name, "namespace": dst.name()},
            "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": src.name(), "name": "settings"},
                     "destination": {"kubeConfig": {"secretRef": {"name": secret}}}}
        }))
        .expect("JSON");
        let args = [
            "--kubeconfig",
            merged.to_str().expect("UTF-8"),
            "--context",
            "here",
            "preview",
            "--author-access",
            "trusted",
            "-f",
            "-",
            "-o",
            "json",
        ];
        plugin_raw(&args, Some(&manifest), &[])
    };
    let report = preview("mirror", "other-cluster").expect(0).json();
    assert_eq!(
        common::preview_actions(&report),
        [(dst.name().to_owned(), "unchanged".to_owned())],
        "{report:#}"
    );
    let report = preview("other", "other-cluster").expect(4).json();
    assert_eq!(
        common::preview_actions(&report),
        [(dst.name().to_owned(), "conflict".to_owned())],
        "{report:#}"
    );
    let report = preview("lost", "no-such-secret").expect(4).json();
    assert_eq!(
        report[0]["stopped"]["reason"], "DestinationClusterInvalid",
        "{report:#}"
    );
    assert!(
        report[0]["stopped"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-secret"),
        "{report:#}"
    );

    // check api: the other cluster the CR writes into answers (the rest of this suite's cluster
    // has no webhook or controller Deployment, so the whole check exits 4).
    let args = [
        "--kubeconfig",
        merged.to_str().expect("UTF-8"),
        "--context",
        "here",
        "check",
        "api",
        "-n",
        dst.name(),
        "-o",
        "json",
    ];
    let report = plugin_raw(&args, None, &[]).expect(4).json();
    let there = report
        .as_array()
        .expect("a list")
        .iter()
        .find(|v| v["check"] == format!("cluster of {}/other-cluster", dst.name()))
        .cloned()
        .unwrap_or_else(|| panic!("no other cluster in {report:#}"));
    assert_eq!(there["ok"], true, "{there}");
    assert!(
        there["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("answers (Kubernetes v1."),
        "{there}"
    );

    Api::<Projection>::namespaced(client.clone(), dst.name())
        .delete("mirror", &Default::default())
        .await
        .expect("deleted");
    wait_for("the copy over there removed", Duration::from_secs(30), || async {
        match copies.get_opt("settings").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let _ = std::fs::remove_file(&merged);
}

/// A path under the target folder for a file of this test.
fn tempfile_path(name: &str) -> std::path::PathBuf {
    let dir = projection_tests::repo_root().join("target/plugin-tests");
    std::fs::create_dir_all(&dir).expect("the folder");
    dir.join(format!("{}-{name}", std::process::id()))
}
