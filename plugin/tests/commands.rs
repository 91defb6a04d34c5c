//! `kubectl projection` against the local control plane, run as a process as a user or a script
//! would: its stdout in every output format, its exit code, and the objects it leaves. The tests
//! that need a status run a real controller (one at a time, `exclusive()`).

mod common;

use common::{
    Cleanup, Run, apply, cluster_ready, cluster_suspended, controller, controller_binary, plugin, plugin_raw,
    plugin_with, projection_ready, projection_suspended,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use projection_tests::{
    ServiceProcess, TestNamespace, client, exclusive, install_crds, kubeconfig_path, kubectl, kubectl_ok,
    wait_for,
};
use serde_json::{Value, json};
use shared::{
    admission::validation::check_projection,
    api::{
        crd::{Projection, SourceRef},
        keys::REQUESTED_AT,
        source::cluster_scoped_message,
    },
};

fn source_configmap(namespace: &str, name: &str, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {namespace}, annotations: \
         {{projection.sh/projectable: \"true\"}}}}\ndata: {{{data}}}\n"
    )
}

fn projection_yaml(namespace: &str, name: &str, source_ns: &str, extra: &str) -> String {
    format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec: {{source: {{kind: ConfigMap, namespace: {source_ns}, name: settings}}{extra}}}\n"
    )
}

fn cluster_yaml(name: &str, source_ns: &str, destination: &str, extra: &str) -> String {
    format!(
        "apiVersion: projection.sh/v1\nkind: ClusterProjection\nmetadata: {{name: {name}}}\n\
         spec: {{source: {{kind: ConfigMap, namespace: {source_ns}, name: settings}}, destination: {destination}{extra}}}\n"
    )
}

async fn merge_configmap(client: &Client, namespace: &str, name: &str, patch: Value) {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("cannot patch {namespace}/{name}: {e}"));
}

async fn configmap(client: &Client, namespace: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .expect("reading a ConfigMap")
}

/// `yaml` (one of the manifests above) with the label `test: value`: `status -l test=value` then
/// lists only what the test created, whatever else the cluster holds (a demo's CRs, never Ready).
fn labelled(yaml: &str, value: &str) -> String {
    yaml.replacen(
        "metadata: {",
        &format!("metadata: {{labels: {{test: {value}}}, "),
        1,
    )
}

/// The entry of a `status -o json|yaml` list for a CR.
fn status_entry<'a>(list: &'a Value, kind: &str, name: &str) -> &'a Value {
    list.as_array()
        .expect("a list")
        .iter()
        .find(|e| e["kind"] == kind && e["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {list}"))
}

/// One test's world: the exclusive right to run a controller (or to run none), a client, the CRDs,
/// and namespaces of its own, deleted when it is dropped.
struct World {
    client: Client,
    namespaces: Vec<TestNamespace>,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl World {
    async fn new(prefix: &str, suffixes: &[&str]) -> Self {
        let serial = exclusive().await;
        let client = client().await;
        install_crds(&client).await;
        let mut namespaces = Vec::new();
        for suffix in suffixes {
            namespaces.push(TestNamespace::create(&client, &format!("{prefix}-{suffix}")).await);
        }
        Self {
            client,
            namespaces,
            _serial: serial,
        }
    }

    /// The name of the `i`th namespace.
    fn ns(&self, i: usize) -> String {
        self.namespaces[i].name().to_owned()
    }
}

#[tokio::test]
async fn why_sources_status_and_lifecycle_follow_a_copy_made_stale_on_purpose() {
    let world = World::new("plugin-life", &["src", "dst"]).await;
    let (client, src, dst) = (world.client.clone(), world.ns(0), world.ns(1));
    let fan = format!("plugin-life-{}", std::process::id());
    // `status` lists every ClusterProjection of the cluster: its exit code and lines are scoped to
    // this test's CRs by a label.
    let mine = fan.clone();
    let selector = format!("test={mine}");
    let _controller = controller().await;
    let mut cleanup = Cleanup::new();
    cleanup.cluster_projection(&fan);
    cleanup.projections(&dst);
    apply(&source_configmap(&src, "settings", "a: '1'"));
    apply(&labelled(&projection_yaml(&dst, "mirror", &src, ""), &mine));
    apply(&labelled(
        &cluster_yaml(&fan, &src, &format!("{{namespaces: [{dst}], name: fanned}}"), ""),
        &mine,
    ));
    projection_ready(&client, &dst, "mirror", "True", "Projected").await;
    cluster_ready(&client, &fan, "True", "Projected").await;

    // status, in every format: one line each, the CR's outcome and counts.
    let run = plugin(&["status", "-n", &dst, "-l", &selector]).expect(0);
    assert!(run.stdout.starts_with("KIND "), "{}", run.stdout);
    let line = run.line_with(&["Projection", &dst, "mirror"]);
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cells[..8],
        [
            "Projection",
            dst.as_str(),
            "mirror",
            "True",
            "Projected",
            "1",
            "0",
            "false"
        ]
    );
    let line = run.line_with(&["ClusterProjection", &fan]);
    assert!(line.contains(" True ") && line.contains(" Projected "), "{line}");
    let wide = plugin(&["status", "-n", &dst, "-l", &selector, "-o", "wide"]).expect(0);
    assert!(
        wide.stdout
            .lines()
            .next()
            .unwrap_or_default()
            .ends_with("MESSAGE"),
        "{}",
        wide.stdout
    );
    for format in ["json", "yaml"] {
        let run = plugin(&["status", "-n", &dst, "-l", &selector, "-o", format]).expect(0);
        let list = if format == "json" { run.json() } else { run.yaml() };
        let mirror = status_entry(&list, "Projection", "mirror");
        assert_eq!(
            (mirror["ready"].as_str(), mirror["written"].as_i64()),
            (Some("True"), Some(1))
        );
        assert_eq!(mirror["namespace"], dst.as_str());
        let cluster = status_entry(&list, "ClusterProjection", &fan);
        assert_eq!(
            (cluster["written"].as_i64(), cluster["failed"].as_i64()),
            (Some(1), Some(0))
        );
    }
    let all = plugin(&["status", "-A", "-l", &selector]).expect(0);
    all.line_with(&["Projection", &dst, "mirror"]);
    assert_eq!(all.stdout.lines().count(), 3, "{}", all.stdout);
    // Unscoped, it lists what others left too (their outcome decides the exit code): ours among them.
    let everything = plugin(&["status", "-A"]);
    assert!(matches!(everything.code, 0 | 4), "{everything:?}");
    everything.line_with(&["Projection", &dst, "mirror"]);
    everything.line_with(&["ClusterProjection", &fan]);

    // why: the owner, the source, current, the conditions and events.
    let run = plugin(&["why", "cm/settings", "-n", &dst]).expect(0);
    assert!(
        run.stdout.starts_with(&format!("ConfigMap {dst}/settings\n")),
        "{}",
        run.stdout
    );
    run.line_with(&["Owned by:", &format!("projection mirror -n {dst}")]);
    run.line_with(&["Source:", &format!("ConfigMap {src}/settings")]);
    run.line_with(&["Copy:", "current"]);
    run.line_with(&["Ready:", "True Projected"]);
    run.line_with(&["Ready", "True", "Projected"]);
    run.line_with(&["Normal", "Projected", &format!("to {dst}/settings")]);
    for format in ["json", "yaml"] {
        let run = plugin(&["why", "configmaps/settings", "-n", &dst, "-o", format]).expect(0);
        let report = if format == "json" { run.json() } else { run.yaml() };
        let owner = &report["ownedBy"][0];
        assert_eq!(
            owner["cr"],
            json!({"kind": "Projection", "namespace": dst, "name": "mirror"})
        );
        assert_eq!(owner["copy"]["state"], "current");
        assert_eq!(owner["source"]["namespace"], src.as_str());
        assert!(
            owner["conditions"].as_array().is_some_and(|c| c.len() >= 3),
            "{owner}"
        );
    }
    let run = plugin(&["why", "configmap/fanned", "-n", &dst]).expect(0);
    run.line_with(&["Owned by:", &format!("clusterprojection {fan}")]);

    // sources: every CR reading the object, each copy current.
    let run = plugin(&["sources", "cm/settings", "-n", &src]).expect(0);
    run.line_with(&[
        "Projection",
        &format!("{dst}/mirror"),
        &format!("{dst}/settings"),
        "current",
    ]);
    run.line_with(&["ClusterProjection", &fan, &format!("{dst}/fanned"), "current"]);
    let readers = plugin(&["sources", "cm/settings", "-n", &src, "-o", "json"])
        .expect(0)
        .json();
    assert_eq!(readers["readers"].as_array().map(Vec::len), Some(2), "{readers}");

    // A copy made stale on purpose: the Projection suspended, then its source edited.
    let run = plugin(&["suspend", "projection/mirror", "-n", &dst]).expect(0);
    assert_eq!(run.stdout, "projection.projection.sh/mirror suspended\n");
    let projections: Api<Projection> = Api::namespaced(client.clone(), &dst);
    assert_eq!(
        projections
            .get("mirror")
            .await
            .expect("mirror")
            .spec
            .controls
            .suspend,
        Some(true)
    );
    // The plugin shows what the user chose at once; the controller's Suspended condition follows.
    let list = plugin(&["status", "-n", &dst, "-l", &selector, "-o", "json"]).json();
    assert_eq!(status_entry(&list, "Projection", "mirror")["suspended"], true);
    projection_suspended(&client, &dst, "mirror").await;
    merge_configmap(&client, &src, "settings", json!({"data": {"a": "2"}})).await;
    // The ClusterProjection follows the edit; the suspended Projection does not.
    wait_for("the fanned copy updated", common::TIMEOUT, || async {
        let run = plugin(&["sources", "cm/settings", "-n", &src]);
        let fanned = run
            .stdout
            .lines()
            .any(|l| l.contains(&fan) && l.ends_with("current"));
        let mirror = run
            .stdout
            .lines()
            .any(|l| l.contains("/mirror") && l.ends_with("stale"));
        (fanned && mirror && run.code == 4)
            .then_some(())
            .ok_or(format!("{run:?}"))
    })
    .await;
    let run = plugin(&["why", "cm/settings", "-n", &dst]).expect(4);
    run.line_with(&["Copy:", "stale: the copy carries source-hash"]);
    run.line_with(&["Ready:", "True Projected, suspended"]);
    let copy = plugin(&["why", "cm/settings", "-n", &dst, "-o", "json"])
        .expect(4)
        .json()["ownedBy"][0]["copy"]
        .clone();
    assert_eq!(copy["state"], "stale");
    assert_ne!(copy["copy"], copy["now"]);
    assert_eq!(
        configmap(&client, &dst, "settings")
            .await
            .and_then(|c| c.data)
            .map(|d| d["a"].clone()),
        Some("1".to_owned()),
        "the suspended Projection's copy kept the old content"
    );
    plugin(&["status", "-n", &dst, "-l", &selector])
        .expect(0)
        .line_with(&["mirror", " true "]);

    // resume, then sync --wait: the request is echoed and the copy is current again.
    let run = plugin(&["resume", "proj/mirror", "-n", &dst]).expect(0);
    assert_eq!(run.stdout, "projection.projection.sh/mirror resumed\n");
    let run = plugin(&[
        "sync",
        "projection/mirror",
        "-n",
        &dst,
        "--wait",
        "--timeout",
        "30s",
    ])
    .expect(0);
    run.line_with(&["projection.projection.sh/mirror reconciled: Ready=True Projected"]);
    let mirror = projections.get("mirror").await.expect("mirror");
    let requested = mirror.metadata.annotations.unwrap_or_default()[REQUESTED_AT].clone();
    assert_eq!(
        mirror.status.and_then(|s| s.copy.last_handled_reconcile_at),
        Some(requested)
    );
    plugin(&["why", "cm/settings", "-n", &dst])
        .expect(0)
        .line_with(&["Copy:", "current"]);
}

#[tokio::test]
async fn why_names_the_crs_that_would_write_or_left_an_object_no_cr_owns() {
    let world = World::new("plugin-why", &["src", "dst"]).await;
    let (client, src, dst) = (world.client.clone(), world.ns(0), world.ns(1));
    let _controller = controller().await;
    let mut cleanup = Cleanup::new();
    cleanup.projections(&dst);
    apply(&source_configmap(&src, "settings", "a: '1'"));

    // A stranger's object where a Projection wants its copy: a conflict.
    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: taken, namespace: {dst}, labels: \
         {{projection.sh/owned-by-projection-uid: forged}}}}\ndata: {{mine: 'yes'}}\n"
    ));
    apply(&projection_yaml(
        &dst,
        "wants",
        &src,
        ", destination: {name: taken}",
    ));
    projection_ready(&client, &dst, "wants", "False", "DestinationConflict").await;
    let run = plugin(&["why", "cm/taken", "-n", &dst]).expect(5);
    run.line_with(&["Not a copy", "a label alone is never trusted"]);
    run.line_with(&[
        "Conflict:",
        &format!("projection wants -n {dst} would write it"),
        &format!("projection.sh/adopt-by={dst}/wants"),
    ]);
    let report = plugin(&["why", "cm/taken", "-n", &dst, "-o", "json"])
        .expect(5)
        .json();
    assert_eq!(
        report["notOwned"]["wouldWrite"],
        json!([{"kind": "Projection", "namespace": dst, "name": "wants"}])
    );
    assert_eq!(report["notOwned"]["writtenByProjection"], false);
    assert_eq!(report["ownedBy"], json!([]));
    // status says it too: not Ready, with the reason; wide with the message.
    plugin(&["status", "-n", &dst])
        .expect(4)
        .line_with(&["wants", "False", "DestinationConflict", "0", "1"]);
    plugin(&["status", "-n", &dst, "-o", "wide"])
        .expect(4)
        .line_with(&["wants", "exists and is not owned by this Projection"]);

    // A copy orphaned by deletionPolicy: Orphan: released, and the CR that left it is named.
    apply(&projection_yaml(
        &dst,
        "leaver",
        &src,
        ", destination: {name: left}, deletionPolicy: Orphan",
    ));
    projection_ready(&client, &dst, "leaver", "True", "Projected").await;
    plugin(&["why", "cm/left", "-n", &dst]).expect(0);
    kubectl_ok(&["delete", "projection", "leaver", "-n", &dst, "--wait=true"]);
    let run = wait_for("why names the CR that left the copy", common::TIMEOUT, || async {
        let run = plugin(&["why", "cm/left", "-n", &dst]);
        (run.code == 5 && run.stdout.contains("Left by:"))
            .then_some(run)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    run.line_with(&["Left by:", &format!("projection leaver -n {dst}")]);
    run.line_with(&["The controller wrote it once"]);
    assert!(
        configmap(&client, &dst, "left").await.is_some(),
        "the orphaned copy stays"
    );
}

#[tokio::test]
async fn preview_says_what_the_controller_would_do_per_namespace_and_writes_nothing() {
    let world = World::new("plugin-pv", &["src", "a", "b", "c", "e", "held"]).await;
    let client = world.client.clone();
    let [src, a, b, c, e, held] = [0, 1, 2, 3, 4, 5].map(|i| world.ns(i));
    let nope = format!("{held}-absent");
    let fan = format!("plugin-pv-{}", std::process::id());
    let once = format!("plugin-once-{}", std::process::id());
    let _controller = controller().await;
    let mut cleanup = Cleanup::new();
    cleanup.kubectl(&[
        "patch",
        "configmap",
        "hold",
        "-n",
        &held,
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    cleanup.cluster_projection(&fan);
    cleanup.cluster_projection(&once);
    apply(&source_configmap(&src, "settings", "a: '1'"));
    apply(&cluster_yaml(
        &fan,
        &src,
        &format!("{{namespaces: [{a}, {b}]}}"),
        "",
    ));
    cluster_ready(&client, &fan, "True", "Projected").await;
    // b's copy edited by hand while the ClusterProjection is suspended: it would be updated.
    plugin(&["suspend", &format!("clusterprojection/{fan}")]).expect(0);
    cluster_ready(&client, &fan, "True", "Projected").await;
    cluster_suspended(&client, &fan).await;
    let list = plugin(&["status", "-o", "json"]).json();
    assert_eq!(status_entry(&list, "ClusterProjection", &fan)["suspended"], true);
    merge_configmap(&client, &b, "settings", json!({"data": {"a": "by hand"}})).await;
    // A stranger's object in c; a Terminating namespace held by a finalizer.
    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {c}}}\n"
    ));
    apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: hold, namespace: {held}, finalizers: [projection.test/hold]}}\n"
    ));
    kubectl_ok(&["delete", "namespace", &held, "--wait=false"]);
    wait_for("the held namespace Terminating", common::TIMEOUT, || async {
        let out = kubectl_ok(&["get", "namespace", &held, "-o", "jsonpath={.status.phase}"]);
        (out == "Terminating").then_some(()).ok_or(out)
    })
    .await;

    let manifest = cluster_yaml(
        &fan,
        &src,
        &format!("{{namespaces: [{a}, {b}, {c}, {e}, {held}, {nope}]}}"),
        "",
    );
    let dir = std::env::temp_dir().join(format!("plugin-preview-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let file = dir.join("fan.yaml");
    std::fs::write(&file, &manifest).expect("writing the manifest");
    let file = file.to_str().expect("UTF-8").to_owned();
    let run = plugin(&["preview", "-f", &file]).expect(4);
    run.line_with(&[&format!(
        "clusterprojection {fan} (exists) of ConfigMap {src}/settings:"
    )]);
    let row = |run: &Run, ns: &str, action: &str, detail: &str| {
        let line = run.line_with(&[&format!("  {ns} "), &format!(" {action} ")]);
        assert!(line.contains(detail), "{line}");
    };
    row(&run, &a, "unchanged", "current");
    row(&run, &b, "update", "data.a");
    row(
        &run,
        &c,
        "conflict",
        &format!("destination {c}/settings exists and is not owned by this ClusterProjection"),
    );
    row(&run, &e, "create", "<none>");
    row(&run, &held, "skipped", "namespace is terminating");
    row(&run, &nope, "skipped", "namespace does not exist");
    for format in ["json", "yaml"] {
        let run = plugin(&["preview", "-f", &file, "-o", format]).expect(4);
        let previews = if format == "json" { run.json() } else { run.yaml() };
        let actions = common::preview_actions(&previews);
        let mut expected: Vec<(String, String)> = [
            (&a, "unchanged"),
            (&b, "update"),
            (&c, "conflict"),
            (&e, "create"),
            (&held, "skipped"),
            (&nope, "skipped"),
        ]
        .iter()
        .map(|(ns, action)| ((*ns).clone(), (*action).to_owned()))
        .collect();
        expected.sort();
        assert_eq!(actions, expected, "{previews}");
        assert_eq!(previews[0]["exists"], true);
    }
    // Nothing was written.
    assert!(
        configmap(&client, &e, "settings").await.is_none(),
        "preview created a copy"
    );
    let hand = configmap(&client, &b, "settings")
        .await
        .and_then(|c| c.data)
        .unwrap_or_default();
    assert_eq!(hand["a"], "by hand", "preview updated a copy");
    let stranger = configmap(&client, &c, "settings")
        .await
        .expect("the stranger's object");
    let keys = stranger.metadata.annotations.unwrap_or_default();
    assert!(
        !keys.keys().any(|k| k.starts_with("projection.sh/")),
        "preview took the stranger's object: {keys:?}"
    );

    // A selector that matches the source's own namespace skips it.
    let label = format!("plugin-pv-{}", std::process::id());
    kubectl_ok(&["label", "namespace", &src, &e, &format!("{label}=yes")]);
    let selected = cluster_yaml(
        &format!("{fan}-sel"),
        &src,
        &format!("{{namespaceSelector: {{matchLabels: {{{label}: 'yes'}}}}}}"),
        "",
    );
    let run = plugin_with(&["preview", "-f", "-"], Some(&selected), &[]).expect(0);
    row(
        &run,
        &src,
        "skipped",
        "the source's own namespace: the copy would be the source itself",
    );
    row(&run, &e, "create", "<none>");

    // The same manifest suspended: every row skipped, and nothing to act on.
    let suspended = manifest.replace("destination:", "suspend: true, destination:");
    let run = plugin_with(&["preview", "-f", "-"], Some(&suspended), &[]).expect(0);
    row(
        &run,
        &e,
        "skipped",
        "spec.suspend is true: nothing is written or deleted; once resumed: create",
    );
    row(&run, &c, "skipped", "once resumed: conflict");

    // ApplyOnce: a copy created once is left as it is, and once deleted is not created again.
    let once_manifest = cluster_yaml(
        &once,
        &src,
        &format!("{{namespaces: [{a}], name: once}}"),
        ", syncPolicy: ApplyOnce",
    );
    apply(&once_manifest);
    cluster_ready(&client, &once, "True", "Projected").await;
    let run = plugin_with(&["preview", "-f", "-"], Some(&once_manifest), &[]).expect(0);
    row(
        &run,
        &a,
        "skipped",
        "syncPolicy ApplyOnce: created once, left as it is",
    );
    kubectl_ok(&["delete", "configmap", "once", "-n", &a]);
    let run = plugin_with(&["preview", "-f", "-"], Some(&once_manifest), &[]).expect(0);
    row(&run, &a, "skipped", "created once and deleted since");

    // A new Projection, with -f repeated (a file and stdin): created.
    let new = projection_yaml(&e, "fresh", &src, "");
    let run = plugin_with(&["preview", "-f", &file, "-f", "-"], Some(&new), &[]).expect(4);
    run.line_with(&[&format!(
        "projection fresh -n {e} (new) of ConfigMap {src}/settings:"
    )]);
    let fresh = run
        .stdout
        .split("projection fresh")
        .nth(1)
        .expect("the second preview");
    assert!(
        fresh
            .lines()
            .any(|l| l.contains(&format!("  {e} ")) && l.contains(" create")),
        "{fresh}"
    );
    assert!(
        Api::<Projection>::namespaced(client.clone(), &e)
            .get_opt("fresh")
            .await
            .expect("reading")
            .is_none(),
        "preview created the CR"
    );

    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn preview_refuses_what_the_webhook_refuses_with_the_same_message() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "plugin-refuse").await;
    let ns = ns.name().to_owned();
    let spec = json!({"source": {"kind": "Secret", "namespace": ns, "name": "db"},
                      "fields": {"exclude": ["$.data.admin-password"]}});
    let manifest = json!({"apiVersion": "projection.sh/v1", "kind": "Projection",
                          "metadata": {"name": "bad", "namespace": ns}, "spec": spec});
    let run = plugin_with(&["preview", "-f", "-"], Some(&manifest.to_string()), &[]).expect(6);
    let webhook = check_projection(&ns, Some(&spec))
        .expect_err("refused")
        .to_string();
    assert_eq!(
        run.stderr,
        format!("error: Projection bad would be denied: {webhook}\n")
    );
    assert!(webhook.contains("write $.data['admin-password']"), "{webhook}");
    assert!(run.stdout.is_empty(), "{}", run.stdout);

    // A cluster-scoped source kind, refused as the webhook refuses it.
    let source: SourceRef =
        serde_json::from_value(json!({"kind": "Namespace", "namespace": "elsewhere", "name": "x"}))
            .expect("source");
    let manifest = json!({"apiVersion": "projection.sh/v1", "kind": "Projection",
                          "metadata": {"name": "scoped", "namespace": ns}, "spec": {"source": source}});
    let run = plugin_with(&["preview", "-f", "-"], Some(&manifest.to_string()), &[]).expect(6);
    assert!(
        run.stderr.contains(&cluster_scoped_message(&source)),
        "{}",
        run.stderr
    );

    // A kind that grants power, without the platform's leave; and then with it.
    let role = format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: role, namespace: {ns}}}\n\
         spec: {{source: {{group: rbac.authorization.k8s.io, kind: Role, namespace: elsewhere, name: r}}}}\n"
    );
    let run = plugin_with(&["preview", "-f", "-"], Some(&role), &[]).expect(6);
    assert!(run.stderr.contains("--allow-power-kinds"), "{}", run.stderr);
    let run = plugin_with(
        &[
            "preview",
            "-f",
            "-",
            "--allow-power-kinds",
            "Role.rbac.authorization.k8s.io",
        ],
        Some(&role),
        &[],
    )
    .expect(4);
    run.line_with(&["nothing would be written", "not found", "SourceNotFound"]);

    // Not a CR of ours; a file that is not there.
    let run = plugin_with(
        &["preview", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
        &[],
    )
    .expect(6);
    assert!(
        run.stderr
            .contains("is not a projection.sh/v1 Projection or ClusterProjection"),
        "{}",
        run.stderr
    );
    let run = plugin(&["preview", "-f", "/nonexistent/plugin-manifest.yaml"]).expect(3);
    assert!(run.stderr.contains("not found"), "{}", run.stderr);
}

#[tokio::test]
async fn selections_exit_codes_and_kubeconfig_resolution_without_a_controller() {
    // No controller may run: `sync --wait` must time out.
    let world = World::new("plugin-sel", &["src", "ns"]).await;
    let (client, src, ns) = (world.client.clone(), world.ns(0), world.ns(1));
    apply(&projection_yaml(&ns, "one", &src, ""));
    apply(&projection_yaml(&ns, "two", &src, "").replace("name: two,", "name: two, labels: {team: x},"));

    // sync --wait times out (7) with no controller to echo the request.
    let run = plugin(&["sync", "projection/one", "-n", &ns, "--wait", "--timeout", "1s"]).expect(7);
    assert!(run.stderr.contains("timed out after 1s"), "{}", run.stderr);
    let run = plugin(&["sync", "projection/one", "-n", &ns]).expect(0);
    assert!(
        run.stdout
            .starts_with("projection.projection.sh/one reconcile requested at "),
        "{}",
        run.stdout
    );

    // -l and --all.
    let suspended = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            Api::<Projection>::namespaced(client, &ns)
                .get(name)
                .await
                .expect("reading")
                .spec
                .controls
                .suspend
        }
    };
    let run = plugin(&["suspend", "projections", "-l", "team=x", "-n", &ns]).expect(0);
    assert_eq!(run.stdout, "projection.projection.sh/two suspended\n");
    assert_eq!(
        (suspended("one").await, suspended("two").await),
        (None, Some(true))
    );
    let run = plugin(&["suspend", "--all", "-n", &ns]).expect(0);
    assert_eq!(run.stdout.lines().count(), 2, "{}", run.stdout);
    let run = plugin(&["resume", "--all", "-n", &ns]).expect(0);
    assert_eq!(
        run.stdout,
        "projection.projection.sh/one resumed\nprojection.projection.sh/two resumed\n"
    );
    assert_eq!(
        (suspended("one").await, suspended("two").await),
        (Some(false), Some(false))
    );

    // Without a status, nothing is Ready: status needs attention (4).
    let run = plugin(&["status", "-n", &ns, "-o", "wide"]).expect(4);
    run.line_with(&["one", "Unknown", "no status yet"]);
    // Suspended before any reconcile: says so, and a suspension is no failure (0).
    plugin(&["suspend", "projection/two", "-n", &ns]).expect(0);
    let run = plugin(&["status", "-n", &ns, "-l", "team=x", "-o", "wide"]).expect(0);
    let line = run.line_with(&["two"]);
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cells[..8],
        [
            "Projection",
            ns.as_str(),
            "two",
            "Suspended",
            "<none>",
            "0",
            "0",
            "true"
        ],
        "{}",
        run.stdout
    );
    run.line_with(&["two", "suspended before the controller reconciled it"]);
    let entry = plugin(&["status", "-n", &ns, "-l", "team=x", "-o", "json"])
        .expect(0)
        .json()[0]
        .clone();
    assert_eq!(
        (entry["ready"].as_str(), entry["suspended"].as_bool()),
        (Some("Suspended"), Some(true)),
        "{entry}"
    );
    // With the other, never reconciled and not suspended, someone must look (4).
    let run = plugin(&["status", "-n", &ns]).expect(4);
    run.line_with(&["two", "Suspended"]);
    run.line_with(&["one", "Unknown"]);

    // Usage (2), not found (3), errors (1).
    plugin(&["suspend", "-n", &ns]).expect(2);
    plugin(&["suspend", "projection/absent", "-n", &ns]).expect(3);
    plugin(&["why", "settings"]).expect(2);
    plugin(&["bogus"]).expect(2);
    let run = plugin(&["why", "gizmo/x"]).expect(3);
    assert_eq!(
        run.stderr,
        "error: the server doesn't have a resource type \"gizmo\"\n"
    );
    plugin(&["why", "cm/absent", "-n", &ns]).expect(3);
    plugin(&["sources", "cm/absent", "-n", &ns]).expect(3);
    plugin_raw(&["--kubeconfig", "/nonexistent/kubeconfig", "status"], None, &[]).expect(1);

    // kubectl's resolution: --context picks a context, whose namespace is the default; KUBECONFIG
    // is read when --kubeconfig is not given.
    let text = std::fs::read_to_string(kubeconfig_path()).expect("the test kubeconfig");
    let mut config: Value = serde_yaml::from_str(&text).expect("YAML");
    let current = config["current-context"]
        .as_str()
        .expect("a current context")
        .to_owned();
    let mut context = config["contexts"]
        .as_array()
        .and_then(|list| list.iter().find(|c| c["name"] == current.as_str()))
        .cloned()
        .expect("the current context");
    context["name"] = json!("plugin-test");
    context["context"]["namespace"] = json!(ns);
    config["contexts"].as_array_mut().expect("contexts").push(context);
    let path = std::env::temp_dir().join(format!("plugin-kubeconfig-{}", std::process::id()));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("writing");
    let path_text = path.to_str().expect("UTF-8").to_owned();
    let run = plugin_raw(
        &["--kubeconfig", &path_text, "--context", "plugin-test", "status"],
        None,
        &[],
    )
    .expect(4);
    run.line_with(&["Projection", &ns, "one"]);
    let run = plugin_raw(
        &["status", "--context", "plugin-test", "-o", "json"],
        None,
        &[("KUBECONFIG", &path)],
    )
    .expect(4);
    status_entry(&run.json(), "Projection", "two");
    let run = plugin_raw(&["status", "--context", "absent"], None, &[("KUBECONFIG", &path)]).expect(1);
    assert!(
        run.stderr.starts_with("error: invalid kubeconfig"),
        "{}",
        run.stderr
    );
    let _ = std::fs::remove_file(&path);
    // Without a controller the CRs carry no finalizer: they go with their namespace.
    let _ = kubectl(&["delete", "projections", "--all", "-n", &ns, "--wait=false"]);
}

#[test]
fn completion_scripts_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let run = plugin_raw(&["completion", shell], None, &[]).expect(0);
        for word in [
            "kubectl-projection",
            "why",
            "sources",
            "preview",
            "status",
            "suspend",
            "resume",
            "sync",
        ] {
            assert!(run.stdout.contains(word), "{shell}: no {word} in\n{}", run.stdout);
        }
    }
    plugin_raw(&["completion", "powershell"], None, &[]).expect(2);
}

#[tokio::test]
async fn kubectl_runs_the_plugin_and_completes_it_through_kubectl_complete_projection() {
    let client = client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "plugin-complete").await;
    let ns = namespace.name().to_owned();
    for name in ["completed-one", "completed-two", "other"] {
        apply(&projection_yaml(&ns, name, &ns, ""));
    }
    // The plugin and its completion link on the PATH, as `cargo install` and the docs' `ln -s` leave
    // them; the control plane's own kubectl finds both.
    let dir = std::env::temp_dir().join(format!("plugin-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    for name in ["kubectl-projection", "kubectl_complete-projection"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(common::binary(), &link).expect("a link");
    }
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(projection_tests::control_plane_bin().join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", kubeconfig_path())
            .output()
            .expect("kubectl runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, stdout) = kubectl(&["__complete", "projection", "s"]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "sources\nstatus\nsuspend\nsync\n:4\n")
    );
    let (_, stdout) = kubectl(&["__complete", "projection", "sync", "--w"]);
    assert_eq!(stdout, "--wait\n:4\n");
    // Names only the cluster and the kubeconfig know: namespaces, contexts, CRs.
    let (_, stdout) = kubectl(&["__complete", "projection", "status", "-n", "kube-s"]);
    assert_eq!(stdout, "kube-system\n:4\n");
    let (_, stdout) = kubectl(&["__complete", "projection", "status", "--context", ""]);
    let contexts: Vec<&str> = stdout.lines().collect();
    assert!(contexts.len() >= 2 && contexts.last() == Some(&":4"), "{stdout}");
    let (_, stdout) = kubectl(&["__complete", "projection", "-n", &ns, "suspend", "proj/comp"]);
    assert_eq!(stdout, "proj/completed-one\nproj/completed-two\n:4\n");
    let (code, stdout) = kubectl(&["projection", "completion", "bash"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("kubectl-projection"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tenant points Projections at the same name in three namespaces it may not read: nothing there,
/// a Secret whose owner did not opt in, and one opted in. What `status` prints of the three (names
/// of the CR and the namespace aside) is the same, byte for byte: the plugin shows the controller's
/// status, which reveals nothing to an author who may not read the source. (`sources` and `why`
/// read the source with the caller's own credentials: the apiserver answers a tenant 403 whether
/// it exists or not.)
#[tokio::test]
async fn status_tells_nothing_about_a_source_the_author_may_not_read() {
    use k8s_openapi::api::{
        core::v1::Secret,
        rbac::v1::{Role, RoleBinding},
    };
    use kube::api::PostParams;
    use shared::policy::author::{AUTHOR, Author};

    let world = World::new("plugin-oracle", &["dst", "missing", "plain", "shared"]).await;
    let client = world.client.clone();
    let dst = world.ns(0);
    let probes = [
        ("missing", world.ns(1)),
        ("plain", world.ns(2)),
        ("shared", world.ns(3)),
    ];
    let mut controller = ServiceProcess::start(controller_binary(), &["--requeue-interval", "5m"]);
    controller.wait_ready().await;
    let mut cleanup = Cleanup::new();
    cleanup.projections(&dst);
    for (probe, namespace) in &probes[1..] {
        let annotations = if *probe == "shared" {
            json!({"projection.sh/projectable": "true"})
        } else {
            json!({})
        };
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "db", "annotations": annotations},
                                               "stringData": {"password": "p"}}))
                .expect("secret"),
            )
            .await
            .expect("source secret");
    }
    // The tenant manages Projections in its own namespace and may read nothing else.
    let tenant = format!("tenant-{dst}");
    let rule = json!({"apiGroups": ["projection.sh"], "resources": ["projections"], "verbs": ["*"]});
    Api::<Role>::namespaced(client.clone(), &dst)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tenant"}, "rules": [rule]})).expect("role"),
        )
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(client.clone(), &dst)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tenant"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenant}]}))
            .expect("binding"),
        )
        .await
        .expect("binding");
    // The apiserver's authorizer learns of the binding from a watch of its own, a moment later.
    projection_tests::wait_for(
        "the tenant's Role to be in force",
        std::time::Duration::from_secs(20),
        || async {
            projection_tests::chart::can(
                &tenant,
                &[],
                "create",
                "projection.sh",
                "projections",
                Some(&dst),
                None,
            )
            .then_some(())
            .ok_or(format!("{tenant} may not create Projections in {dst} yet"))
        },
    )
    .await;
    let mut config = projection_tests::test_config().await.expect("kubeconfig");
    config.auth_info.impersonate = Some(tenant.clone());
    let as_tenant: Api<Projection> =
        Api::namespaced(Client::try_from(config).expect("impersonating client"), &dst);
    let record = Author::of(&tenant, &["system:authenticated".to_owned()])
        .expect("recordable")
        .record();
    for (probe, namespace) in &probes {
        let cr = json!({"apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": format!("probe-{probe}"), "annotations": {AUTHOR: record}},
            "spec": {"source": {"version": "v1", "kind": "Secret", "namespace": namespace, "name": "db"}}});
        as_tenant
            .create(
                &PostParams::default(),
                &serde_json::from_value(cr).expect("projection"),
            )
            .await
            .expect("the tenant's Projection");
    }
    for (probe, _) in &probes {
        projection_ready(
            &client,
            &dst,
            &format!("probe-{probe}"),
            "False",
            "SourceForbidden",
        )
        .await;
    }

    let status = plugin(&["status", "-n", &dst, "-o", "json"]).json();
    let mut seen = Vec::new();
    for (probe, namespace) in &probes {
        let name = format!("probe-{probe}");
        let mut entry = status_entry(&status, "Projection", &name).clone();
        // When each condition last changed depends on when each probe was reconciled (a second
        // apart on a loaded cluster), not on its source.
        entry["lastChange"] = Value::Null;
        let normalize = |v: &Value| {
            v.to_string()
                .replace(namespace.as_str(), "NS")
                .replace(&name, "CR")
        };
        seen.push((name.clone(), normalize(&entry)));
    }
    for (name, entry) in &seen[1..] {
        assert_eq!(
            entry, &seen[0].1,
            "{name} tells its source apart from {}",
            seen[0].0
        );
    }
}

/// `check` finds each controller Deployment by the chart's labels and its flags, and tells who
/// writes its copies from its flags, the cluster's version (v1.36 here) and its ServiceAccount's
/// RBAC: the author where the impersonation verbs are granted, the controller under `trusted`, and
/// a controller that will not start where `author` is asked for without them (exit code 4).
#[tokio::test]
async fn check_tells_who_writes_each_controllers_copies() {
    use projection_tests::ClusterScopedGuard;
    let client = client().await;
    let home = TestNamespace::create(&client, "plugin-check").await;
    let ns = home.name().to_owned();
    let role = format!("plugin-check-{ns}");
    let _guards = [
        ClusterScopedGuard::new("clusterrolebindings", &role),
        ClusterScopedGuard::new("clusterroles", &role),
    ];
    let deployment = |name: &str, account: &str, args: &[&str]| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": ns,
                            "labels": {"app.kubernetes.io/component": "controller"}},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"serviceAccountName": account, "containers": [
                                         {"name": "controller", "image": "projection-check:none", "args": args}]}}}})
    };
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "impersonates", "namespace": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "plain", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["users", "groups"],
                    "verbs": ["impersonate:user-info"]},
                   {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"],
                    "verbs": ["impersonate-on:user-info:create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "impersonates", "namespace": ns}]},
        deployment("as-author", "impersonates", &["--author-access=enforce", "--write-copies-as=auto"]),
        deployment("refused", "plain", &["--author-access=enforce", "--write-copies-as=author"]),
        deployment("trusted", "plain", &["--author-access=trusted"]),
    ]});
    apply(&objects.to_string());
    let run = plugin(&["check", "-o", "json"]);
    assert_eq!(run.code, 4, "{run:?}");
    let lines: Vec<Value> = serde_json::from_str(&run.stdout).expect("JSON");
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l["namespace"] == ns.as_str() && l["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {lines:?}"))
            .clone()
    };
    assert_eq!(line("as-author")["copiesWrittenBy"], "author");
    assert_eq!(line("as-author")["ready"], "0/0");
    assert_eq!(line("trusted")["copiesWrittenBy"], "controller");
    let refused = line("refused");
    assert_eq!(refused["copiesWrittenBy"], "");
    let note = refused["note"].as_str().unwrap_or_default();
    assert!(note.contains("does not start"), "{note}");
    let table = plugin(&["check", "-o", "wide"]);
    assert!(
        table
            .stdout
            .lines()
            .next()
            .is_some_and(|h| h.contains("COPIES WRITTEN BY") && h.contains("NOTE")),
        "{table:?}"
    );
}

/// A tenant who may manage Projections and read ConfigMaps in one namespace only, acting through
/// `--as` (the apiserver then authorizes every request as that ServiceAccount): every listing
/// works, what the tenant may not list is skipped with one line saying so, and the output formats
/// a script uses work as kubectl's do.
#[tokio::test]
async fn a_namespace_tenant_uses_status_and_sources_with_as_name_and_jsonpath() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "plugin-tenant").await;
    let ns = ns.name().to_owned();
    apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: tenant, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: tenant, namespace: {ns}}}\n\
         rules:\n- {{apiGroups: [projection.sh], resources: [projections], verbs: ['*']}}\n\
         - {{apiGroups: [''], resources: [configmaps], verbs: [get, list, watch]}}\n\
         - {{apiGroups: [events.k8s.io], resources: [events], verbs: [get, list, watch]}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}}\n\
         subjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]\n"
    ));
    apply(&source_configmap(&ns, "settings", "k: v"));
    apply(&projection_yaml(
        &ns,
        "copy",
        &ns,
        ", destination: {name: settings-copy}",
    ));
    let user = format!("system:serviceaccount:{ns}:tenant");
    let tenant = |args: &[&str]| {
        let mut all = vec!["--as", user.as_str(), "-n", ns.as_str()];
        all.extend_from_slice(args);
        plugin(&all)
    };

    // status: the namespace's Projections; ClusterProjections skipped in one line, not exit 1.
    let run = tenant(&["status"]);
    assert!(matches!(run.code, 0 | 4), "{run:?}");
    assert!(run.stdout.contains("copy"), "{run:?}");
    assert!(
        run.stderr.contains("you may not list ClusterProjections"),
        "{run:?}"
    );
    // -A: all namespaces may not be listed either; the namespace stands in.
    let run = tenant(&["status", "-A"]);
    assert!(matches!(run.code, 0 | 4), "{run:?}");
    assert!(
        run.stderr
            .contains("you may not list Projections in all namespaces"),
        "{run:?}"
    );
    assert!(run.stdout.contains("copy"), "{run:?}");
    // The formats scripts use.
    let run = tenant(&["status", "-o", "name"]);
    assert_eq!(run.stdout, "projection.projection.sh/copy\n", "{run:?}");
    let run = tenant(&["status", "-o", "jsonpath={[*].name}"]);
    assert_eq!(run.stdout, "copy", "{run:?}");
    // sources: which CRs read the tenant's ConfigMap, as far as the tenant may see.
    let run = tenant(&["sources", "configmap/settings"]);
    assert!(run.code != 1, "{run:?}");
    assert!(run.stdout.contains("copy"), "{run:?}");

    // Wrong use names the flag, exit 2; the kubeconfig's own identity is the admin's.
    let run = plugin(&["--as-group", "team", "status", "-n", &ns]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--as-group needs --as"), "{run:?}");
    let run = plugin(&["status", "-n", &ns, "-o", "jsonpath={range [*]}{.name}{end}"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("not supported"), "{run:?}");
    let run = plugin(&["status", "-n", &ns, "--request-timeout", "soon"]);
    assert_eq!(run.code, 2, "{run:?}");
    let run = plugin(&["status", "-n", &ns, "--request-timeout", "20"]);
    assert!(matches!(run.code, 0 | 4), "{run:?}");
    assert!(
        !run.stderr.contains("may not list"),
        "the admin lists everything: {run:?}"
    );
}

/// The commands that read or change one CR, run as a ServiceAccount bound to `edit` in its own
/// namespace (and to Projections there, as the chart's aggregated roles grant): `why`, `preview`,
/// `suspend`/`resume`/`sync --wait` do what they do for an admin; `check api` checks what a tenant
/// may (the CRDs, the dry runs) and says on stderr what it skipped; `check`, which reads the
/// controllers' Deployments, says why it cannot and points at `check api`.
#[tokio::test]
async fn a_namespace_tenant_runs_why_preview_the_lifecycle_and_check_api() {
    let world = World::new("plugin-tenant-life", &["own"]).await;
    let (client, ns) = (world.client.clone(), world.ns(0));
    let _controller = controller().await;
    let mut cleanup = Cleanup::new();
    cleanup.projections(&ns);
    apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: tenant, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant-edit, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}\n\
         subjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: tenant-projections, namespace: {ns}}}\n\
         rules:\n- {{apiGroups: [projection.sh], resources: [projections], verbs: ['*']}}\n\
         - {{apiGroups: [events.k8s.io], resources: [events], verbs: [get, list, watch]}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant-projections, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-projections}}\n\
         subjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]\n"
    ));
    apply(&source_configmap(&ns, "settings", "k: v"));
    let manifest = projection_yaml(&ns, "copy", &ns, ", destination: {name: settings-copy}");
    apply(&manifest);
    projection_ready(&client, &ns, "copy", "True", "Projected").await;
    let user = format!("system:serviceaccount:{ns}:tenant");
    let tenant = |args: &[&str]| {
        let mut all = vec!["--as", user.as_str(), "-n", ns.as_str()];
        all.extend_from_slice(args);
        plugin(&all)
    };

    // why: the copy's owner and state; the source is no copy, and the CR reading it is named.
    let run = tenant(&["why", "cm/settings-copy"]).expect(0);
    run.line_with(&["Owned by:", &format!("projection copy -n {ns}")]);
    run.line_with(&["Copy:", "current"]);
    let run = tenant(&["why", "cm/settings"]);
    assert_eq!(run.code, 5, "the source is owned by no CR: {run:?}");

    // preview, asked as the tenant (the default author checks): the copy as it is.
    let run = plugin_with(
        &["--as", &user, "-n", &ns, "preview", "-f", "-"],
        Some(&manifest),
        &[],
    )
    .expect(0);
    run.line_with(&[&ns, "unchanged"]);

    // The lifecycle of the tenant's own CR.
    let run = tenant(&["suspend", "proj/copy"]).expect(0);
    assert_eq!(run.stdout, "projection.projection.sh/copy suspended\n");
    projection_suspended(&client, &ns, "copy").await;
    tenant(&["resume", "proj/copy"]).expect(0);
    tenant(&["sync", "proj/copy", "--wait", "--timeout", "30s"])
        .expect(0)
        .line_with(&["projection.projection.sh/copy reconciled: Ready=True Projected"]);

    // check api: the CRDs and the webhook's dry runs are a tenant's to check (no webhook runs in
    // this suite: exit 4 for that, not 1); the controllers' Deployments and Lease are skipped.
    let run = tenant(&["check", "api", "-o", "json"]);
    assert_eq!(run.code, 4, "{run:?}");
    assert!(
        run.stderr.contains(
            "you may not list Deployments in all namespaces; the projection controllers are not checked"
        ),
        "{run:?}"
    );
    let report = run.json();
    let checks: Vec<&str> = report
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|v| v["check"].as_str())
        .collect();
    assert_eq!(
        checks,
        ["crds", "webhook admits", "webhook refuses"],
        "{report:#}"
    );
    assert_eq!(report[0]["ok"], true, "{report:#}");
    // check reads what only the platform team may: a clear error naming what to run instead.
    let run = tenant(&["check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("which you may not list") && run.stderr.contains("check api"),
        "{run:?}"
    );
}

/// `check api` on a cluster with the CRDs but no webhook configuration and no controller
/// Deployment (this suite runs controllers as processes): the CRDs pass, the rest fails with what
/// is missing, exit 4; nothing is written by its dry runs.
#[tokio::test]
async fn check_api_names_what_an_installation_lacks() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "plugin-check-api").await;
    let run = plugin(&["check", "api", "-n", ns.name(), "-o", "json"]);
    assert_eq!(run.code, 4, "{run:?}");
    let report = run.json();
    let verdict = |check: &str| {
        report
            .as_array()
            .expect("a list")
            .iter()
            .find(|v| v["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} in {report:#}"))
    };
    assert_eq!(verdict("crds")["ok"], true, "{report:#}");
    let admits = verdict("webhook admits");
    assert_eq!(admits["ok"], false);
    assert!(
        admits["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("without the webhook"),
        "{admits}"
    );
    assert_eq!(verdict("webhook refuses")["ok"], false);
    assert_eq!(verdict("leader")["ok"], false);
    let left: kube::api::ObjectList<Projection> = kube::Api::namespaced(client.clone(), ns.name())
        .list(&Default::default())
        .await
        .expect("list");
    assert!(left.items.is_empty(), "dry runs only");
    // --wait gives up with exit 7.
    let run = plugin(&["check", "api", "-n", ns.name(), "--wait", "3s"]);
    assert_eq!(run.code, 7, "{run:?}");
    assert!(run.stdout.contains("failing"), "{run:?}");
}
