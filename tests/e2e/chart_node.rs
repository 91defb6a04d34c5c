//! The chart on the local node, as a user runs it: `helm install --wait` in every certificate mode
//! with the images built here and the real cert-manager, then what users do and what disrupts a
//! cluster (a bad spec, Projections, a deleted leader, evictions, an upgrade, an uninstall).
//!
//! Every release here registers webhooks that fail closed for all Projection writes and a
//! controller acting on the whole cluster, so these tests run one at a time (`exclusive`).

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use projection_tests::{
    ClusterScopedGuard, TestNamespace,
    chart::{Release, Rendered, exists, helm_ok, self_signed, write_tls_secret},
    client, control_plane_bin, events_about, exclusive, install_crds, kubectl, kubectl_ok, kubectl_stdin,
    node::{
        GUARD_RULE_COMMENT, NODE_IP, NODE_NAME, POD_BRIDGE, POD_CIDR, container_pid, deployment_available,
        in_network_of, node_with_cert_manager, pod_name, pods, served_certificate,
    },
    testenv_dir, wait_crd_established, wait_for, wait_for_event,
};
use serde_json::{Value, json};
use shared::{
    api::crd::Projection,
    shard::{
        Ring,
        membership::{MEMBER_LABEL, MemberLease},
    },
};
use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The controller's lease in the failover test: another replica must lead within it.
const LEASE: Duration = Duration::from_secs(6);

fn apply(yaml: &str) -> std::process::Output {
    kubectl_stdin(&["apply", "-f", "-"], yaml)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The names of the pods of `release`'s `component` that are not being deleted.
fn live_pods(release: &Release, component: &str) -> Vec<String> {
    pods(&release.namespace, &selector(&release.name, component))
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(pod_name)
        .collect()
}

fn selector(release: &str, component: &str) -> String {
    format!("app.kubernetes.io/instance={release},app.kubernetes.io/component={component}")
}

/// The caBundles of both webhook configurations named `name`, decoded (PEM).
fn decoded_ca_bundles(name: &str) -> Vec<String> {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    webhook_ca_bundles(name)
        .iter()
        .map(|b| String::from_utf8(STANDARD.decode(b).unwrap_or_default()).unwrap_or_default())
        .collect()
}

/// Waits until the webhook `name` has set the caBundle of both its configurations.
async fn wait_ca_bundles_set(name: &str) {
    wait_for("the webhook to set both caBundles", TIMEOUT, || async {
        let bundles = webhook_ca_bundles(name);
        if bundles.iter().all(|b| !b.is_empty()) {
            Ok(())
        } else {
            Err(format!("{bundles:?}"))
        }
    })
    .await;
}

fn webhook_ca_bundles(name: &str) -> Vec<String> {
    ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"]
        .iter()
        .map(|kind| {
            kubectl_ok(&[
                "get",
                kind,
                name,
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ])
        })
        .collect()
}

/// A field of a Secret, decoded.
fn secret_field(namespace: &str, name: &str, field: &str) -> String {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    let encoded = kubectl_ok(&[
        "get",
        "secret",
        name,
        "-n",
        namespace,
        "-o",
        &format!("jsonpath={{.data.{}}}", field.replace('.', "\\.")),
    ]);
    String::from_utf8(STANDARD.decode(encoded.trim()).expect("base64")).expect("PEM is text")
}

/// Both Deployments are Available, and their pods run on the node from the images built here.
fn assert_running_from_local_images(release: &Release) {
    for component in ["controller", "webhook"] {
        let name = format!("{}-{component}", release.name);
        assert_eq!(
            deployment_available(&release.namespace, &name),
            "True",
            "{name} is not Available"
        );
        for pod in pods(&release.namespace, &selector(&release.name, component)) {
            assert_eq!(pod["spec"]["nodeName"], NODE_NAME, "{}", pod_name(&pod));
            assert_eq!(pod["status"]["phase"], "Running", "{}", pod_name(&pod));
            let image = pod["status"]["containerStatuses"][0]["image"]
                .as_str()
                .unwrap_or_default();
            assert_eq!(image, format!("local.test/projection-{component}:dev"));
        }
    }
}

/// What the runtime enforces: the container process runs as 65532, its root filesystem is mounted
/// read-only (the images have no shell, so this is read from the host, not with kubectl exec).
fn assert_hardened_at_runtime(release: &Release) {
    for component in ["controller", "webhook"] {
        for pod in pods(&release.namespace, &selector(&release.name, component)) {
            let pid = container_pid(&pod);
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default();
            assert_eq!(
                uid.split_whitespace().skip(1).collect::<Vec<_>>(),
                ["65532"; 4],
                "{}: {uid}",
                pod_name(&pod)
            );
            let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
            let root_options = mounts
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.get(4) == Some(&"/"))
                .map(|f| f[5].to_owned())
                .unwrap_or_default();
            assert!(
                root_options.split(',').any(|o| o == "ro"),
                "{}: root mounted {root_options}",
                pod_name(&pod)
            );
            // A write to the root filesystem fails for the container's process.
            let probe = format!("/proc/{pid}/root/written-by-test");
            let write = std::fs::write(&probe, "x");
            let _ = std::fs::remove_file(&probe);
            assert!(
                write.is_err(),
                "{}: the root filesystem took a write",
                pod_name(&pod)
            );
        }
    }
}

/// A bad spec, refused by the webhook pods (not by the CRD schema): the source names a
/// cluster-scoped kind. The apiserver calls the webhook through its Service at the pods' IPs.
fn assert_webhook_refuses_bad_spec(namespace: &str) {
    let out = apply(&format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: bad, namespace: {namespace}}}\n\
         spec:\n  source: {{version: v1, kind: Namespace, namespace: default, name: default}}\n"
    ));
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("denied the request") && err.contains("cluster-scoped"),
        "the webhook did not refuse a cluster-scoped source: exit {}: {err}",
        out.status
    );
}

/// `helm uninstall` leaves the CRDs and what the docs say stays (`kept`), nothing else of the
/// release; its pods are gone.
async fn assert_uninstall_leaves_only(release: Release, rendered: &Rendered, kept: &[(&str, &str)]) {
    let (name, namespace) = (release.name.clone(), release.namespace.clone());
    release.uninstall();
    for object in &rendered.0 {
        let kind = object["kind"].as_str().expect("kind");
        let object_name = object["metadata"]["name"].as_str().expect("name");
        let object_namespace = object["metadata"]["namespace"].as_str();
        assert!(
            !exists(kind, object_name, object_namespace),
            "{kind} {object_name} is left after uninstall"
        );
    }
    wait_for("the release's pods to go", TIMEOUT, || async {
        let left: Vec<String> = pods(&namespace, &format!("app.kubernetes.io/instance={name}"))
            .iter()
            .map(pod_name)
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    for (kind, kept_name) in kept {
        assert!(
            exists(kind, kept_name, Some(&namespace)),
            "{kind} {kept_name} should stay"
        );
    }
    for crd in ["projections.projection.sh", "clusterprojections.projection.sh"] {
        assert!(
            exists("crd", crd, None),
            "{crd} stays (the tests' releases leave the CRDs alone)"
        );
    }
}

/// What every release test starts with: the node with cert-manager, the test alone on it
/// (`exclusive`), a client, our CRDs, and the release's namespace named after `prefix`.
async fn on_the_node(prefix: &str) -> (tokio::sync::MutexGuard<'static, ()>, kube::Client, TestNamespace) {
    node_with_cert_manager();
    let serial = exclusive().await;
    let client = client().await;
    install_crds(&client).await;
    let system = TestNamespace::create(&client, prefix).await;
    (serial, client, system)
}

#[tokio::test]
async fn pods_have_no_route_off_the_machine() {
    node_with_cert_manager();
    let pod = pods("cert-manager", "app.kubernetes.io/component=webhook")
        .into_iter()
        .next()
        .expect("cert-manager's webhook runs on the node");
    let pid = container_pid(&pod);
    // Only the node's range: no default route (routing lookups only; nothing is sent).
    let routes = in_network_of(pid, &["ip", "-4", "route"]);
    assert!(
        !routes.contains("default"),
        "a pod has a default route:\n{routes}"
    );
    assert!(routes.contains("198.18.0.0/15 via 198.18.0.1"), "{routes}");
    let lookup = in_network_of(pid, &["ip", "route", "get", "192.0.2.1"]);
    assert!(lookup.contains("Network is unreachable"), "{lookup}");
    // The second guard: pod traffic leaving by any other interface than the pod bridge is dropped.
    let rule = std::process::Command::new("iptables")
        .args(["-C", "FORWARD", "-s", POD_CIDR, "!", "-o", POD_BRIDGE])
        .args(["-m", "comment", "--comment", GUARD_RULE_COMMENT, "-j", "DROP"])
        .status()
        .expect("iptables runs");
    assert!(rule.success(), "the FORWARD guard rule is missing");
    // The pod's resolver is the node IP, where nothing listens (never the host's resolver).
    let resolv = std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf")).expect("resolv.conf");
    let servers: Vec<&str> = resolv.lines().filter(|l| l.starts_with("nameserver")).collect();
    assert_eq!(servers, [format!("nameserver {NODE_IP}")], "{resolv}");
}

#[tokio::test]
async fn self_managed_install_serves_users_and_survives_disruptions() {
    let (_serial, client, system) = on_the_node("node-sm").await;
    let values = vec![
        ("controller.replicas", json!(2)),
        (
            "controller.leaderElection.leaseDuration",
            json!(format!("{}s", LEASE.as_secs())),
        ),
    ];
    let release = Release::install_and_wait("projection-sm", system.name(), &values);
    let rendered = release.render(&values).expect("renders");
    assert_running_from_local_images(&release);
    assert_hardened_at_runtime(&release);
    wait_ca_bundles_set("projection-sm-webhook").await;

    let team = TestNamespace::create(&client, "node-sm-team").await;
    assert_webhook_refuses_bad_spec(team.name());
    helm_test_passes(&release);
    plugin_check_api_passes(team.name());
    let source = TestNamespace::create(&client, "node-sm-source").await;
    projections_are_mirrored_with_events(&client, &source, &team).await;
    leader_pod_deleted_another_replica_takes_over(&release, source.name(), team.name()).await;
    pdb_allows_one_webhook_eviction_and_refuses_the_second(&release);
    upgrade_rolls_the_webhook_without_failed_admission(&release, &values, team.name());
    sharding_by_one_value_splits_the_crs_between_the_pods(
        &client,
        &release,
        &values,
        source.name(),
        team.name(),
    )
    .await;

    for ns in [team, source] {
        ns.delete_and_wait(&client).await;
    }
    // The self-managed webhook's Secret is not a chart object (docs/getting-started.md).
    assert_uninstall_leaves_only(release, &rendered, &[("secret", "projection-sm-webhook-tls")]).await;
    system.delete_and_wait(&client).await;
}

/// `kubectl projection check api`, as a user runs it after an install: the CRDs served, the webhook
/// admitting (recording the author) and refusing by dry runs in `namespace`, a leader renewing its
/// Lease, the author access mode; exit 0.
fn plugin_check_api_passes(namespace: &str) {
    let plugin = projection_tests::workspace_binary("plugin", "kubectl-projection");
    let out = std::process::Command::new(plugin)
        .args(["check", "api", "-n", namespace, "-o", "json", "--wait", "60s"])
        .env("KUBECONFIG", projection_tests::kubeconfig_path())
        .output()
        .expect("the plugin runs");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check api printed no JSON ({e}): {}", stderr(&out)));
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{}", stderr(&out));
    let checks: Vec<&str> = report
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|v| v["check"].as_str())
        .collect();
    for check in [
        "crds",
        "webhook admits",
        "webhook refuses",
        "leader",
        "author access",
    ] {
        assert!(checks.contains(&check), "{check} missing: {report:#}");
    }
}

/// `helm test`: the chart's test pod (the webhook image, `projection-webhook test`) sees its dry-run
/// Projection refused by the webhook and the controller ready; its hook objects go once it passed.
fn helm_test_passes(release: &Release) {
    let out = helm_ok(&[
        "test",
        &release.name,
        "--namespace",
        &release.namespace,
        "--timeout",
        "2m",
    ]);
    assert!(out.contains("Phase:          Succeeded"), "helm test:\n{out}");
    let test_pod = format!("{}-test", release.name);
    assert!(
        !exists("pod", &test_pod, Some(&release.namespace)),
        "the test pod is deleted once it passed"
    );
}

/// A Projection and a ClusterProjection, mirrored by the controller pod: Ready, and their events
/// shown by `kubectl describe`.
async fn projections_are_mirrored_with_events(
    client: &kube::Client,
    source: &TestNamespace,
    team: &TestNamespace,
) {
    let (src, dst) = (source.name(), team.name());
    kubectl_ok(&[
        "-n",
        src,
        "create",
        "configmap",
        "app-settings",
        "--from-literal=color=blue",
    ]);
    kubectl_ok(&[
        "-n",
        src,
        "annotate",
        "configmap",
        "app-settings",
        "projection.sh/projectable=true",
    ]);
    let out = apply(&format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: app-settings, namespace: {dst}}}\n\
         spec:\n  source: {{kind: ConfigMap, namespace: {src}, name: app-settings}}\n"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    kubectl_ok(&[
        "-n",
        dst,
        "wait",
        "--for=condition=Ready",
        "projection/app-settings",
        "--timeout=60s",
    ]);
    wait_for_copy_color(dst, "blue").await;
    wait_for_event(client, dst, "app-settings", "Projected").await;
    let described = kubectl_ok(&["-n", dst, "describe", "projection", "app-settings"]);
    assert!(
        described.contains("Projected") && described.contains("Ready"),
        "kubectl describe shows no condition or event:\n{described}"
    );

    let name = format!("node-{}", std::process::id());
    let _guard = ClusterScopedGuard::new("clusterprojection", &name);
    let out = apply(&format!(
        "apiVersion: projection.sh/v1\nkind: ClusterProjection\nmetadata: {{name: {name}}}\nspec:\n  \
         source: {{kind: ConfigMap, namespace: {src}, name: app-settings}}\n  \
         destination: {{namespaces: [{dst}], name: fanned-out}}\n"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("clusterprojection/{name}"),
        "--timeout=60s",
    ]);
    assert!(exists("configmap", "fanned-out", Some(dst)));
    let described = wait_for(
        "the ClusterProjection's event in kubectl describe",
        TIMEOUT,
        || async {
            let text = kubectl_ok(&["describe", "clusterprojection", &name]);
            if text.contains("Events:") && !text.contains("Events:  <none>") {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    assert!(described.contains("Ready"), "{described}");
    kubectl_ok(&[
        "delete",
        "clusterprojection",
        &name,
        "--wait=true",
        "--timeout=60s",
    ]);
    assert!(
        !exists("configmap", "fanned-out", Some(dst)),
        "the fan-out copy is removed"
    );
}

/// Sets `data.color` of the source `app-settings` in `namespace`.
fn set_source_color(namespace: &str, color: &str) {
    let patch = json!({"data": {"color": color}}).to_string();
    kubectl_ok(&[
        "-n",
        namespace,
        "patch",
        "configmap",
        "app-settings",
        "-p",
        &patch,
    ]);
}

/// Waits until the copy `app-settings` in `namespace` has `data.color` = `color`.
async fn wait_for_copy_color(namespace: &str, color: &str) {
    wait_for(
        &format!("the copy of app-settings with color {color}"),
        TIMEOUT,
        || async {
            let out = kubectl(&[
                "-n",
                namespace,
                "get",
                "configmap",
                "app-settings",
                "-o",
                "jsonpath={.data.color}",
            ]);
            let seen = String::from_utf8_lossy(&out.stdout);
            if seen == color {
                Ok(())
            } else {
                Err(format!("color {seen:?}: {}", stderr(&out)))
            }
        },
    )
    .await;
}

fn lease_holder(namespace: &str) -> String {
    let out = kubectl(&[
        "-n",
        namespace,
        "get",
        "lease",
        "projection-controller-leader",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two controller replicas: the leader's pod is deleted, and another replica leads within the
/// lease and mirrors the next edit. The standby and the ReplicaSet's replacement pod race for the
/// released Lease; either may win, never the deleted pod.
async fn leader_pod_deleted_another_replica_takes_over(release: &Release, source: &str, team: &str) {
    let system = &release.namespace;
    let controllers: Vec<String> = pods(system, &selector(&release.name, "controller"))
        .iter()
        .map(pod_name)
        .collect();
    assert_eq!(controllers.len(), 2, "{controllers:?}");
    let holder = lease_holder(system);
    let leader = controllers
        .iter()
        .find(|p| holder.starts_with(p.as_str()))
        .unwrap_or_else(|| panic!("the Lease holder {holder:?} is none of {controllers:?}"))
        .clone();
    let deleted = Instant::now();
    kubectl_ok(&["-n", system, "delete", "pod", &leader, "--wait=false"]);
    let new_holder = wait_for("another replica to take the Lease", LEASE * 4, || async {
        let holder = lease_holder(system);
        if !holder.is_empty() && !holder.starts_with(&leader) {
            Ok(holder)
        } else {
            Err(holder)
        }
    })
    .await;
    let took = deleted.elapsed();
    // Deleting the pod shuts the controller down cleanly, which releases the Lease: another replica
    // leads within the Lease's duration (a crash would leave it to expire first).
    assert!(
        took < LEASE,
        "{new_holder} led {took:?} after the leader's pod was deleted"
    );
    let running = live_pods(release, "controller");
    assert!(
        running.iter().any(|p| new_holder.starts_with(p.as_str())),
        "the Lease holder {new_holder} is none of the running controllers {running:?}"
    );
    set_source_color(source, "green");
    wait_for_copy_color(team, "green").await;
}

/// The PodDisruptionBudget (minAvailable 1 of 2 webhook pods): the first eviction is allowed, the
/// second, right after, is refused.
fn pdb_allows_one_webhook_eviction_and_refuses_the_second(release: &Release) {
    let system = &release.namespace;
    let webhooks: Vec<String> = pods(system, &selector(&release.name, "webhook"))
        .iter()
        .map(pod_name)
        .collect();
    assert_eq!(webhooks.len(), 2, "{webhooks:?}");
    let evict = |pod: &str| {
        let eviction = json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": system},
        });
        kubectl_stdin(
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{system}/pods/{pod}/eviction"),
                "-f",
                "-",
            ],
            &eviction.to_string(),
        )
    };
    // The budget's status is computed by the disruption controller: wait until it allows one.
    let allowed = || {
        kubectl_ok(&[
            "-n",
            system,
            "get",
            "pdb",
            &format!("{}-webhook", release.name),
            "-o",
            "jsonpath={.status.disruptionsAllowed}",
        ])
    };
    let start = Instant::now();
    while allowed() != "1" {
        assert!(
            start.elapsed() < TIMEOUT,
            "the PDB never allowed a disruption: {}",
            allowed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = evict(&webhooks[0]);
    assert!(
        first.status.success(),
        "the first eviction was refused: {}",
        stderr(&first)
    );
    let second = evict(&webhooks[1]);
    assert!(!second.status.success(), "the second eviction was allowed");
    assert!(
        stderr(&second).contains("disruption budget"),
        "refused for another reason: {}",
        stderr(&second)
    );
}

/// `helm upgrade` of a webhook value rolls the webhook pods while a loop of applies runs: none of
/// them is refused or fails.
fn upgrade_rolls_the_webhook_without_failed_admission(
    release: &Release,
    values: &[(&str, Value)],
    namespace: &str,
) {
    let system = &release.namespace;
    kubectl_ok(&[
        "-n",
        system,
        "rollout",
        "status",
        &format!("deployment/{}-webhook", release.name),
        "--timeout=120s",
    ]);
    let before = live_pods(release, "webhook");
    let stop = Arc::new(AtomicBool::new(false));
    let applier = {
        let (stop, namespace) = (stop.clone(), namespace.to_owned());
        std::thread::spawn(move || {
            let (mut applied, mut failures) = (0, Vec::new());
            // Bounded: the upgrade's own timeout ends long before 2000 applies.
            for i in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let out = apply(&format!(
                    "apiVersion: projection.sh/v1\nkind: Projection\nmetadata:\n  name: during-upgrade\n  \
                     namespace: {namespace}\n  annotations: {{attempt: \"{i}\"}}\nspec:\n  \
                     source: {{kind: ConfigMap, namespace: default, name: not-there}}\n"
                ));
                applied += 1;
                if !out.status.success() {
                    failures.push(stderr(&out));
                }
            }
            (applied, failures)
        })
    };
    // And as fast as the apiserver takes them: server-side dry runs pass through admission too, so a
    // pod that stops serving before its endpoint is gone shows up here within a few milliseconds.
    let dry_runs = {
        let (stop, namespace) = (stop.clone(), namespace.to_owned());
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the dry runs")
                .block_on(dry_run_creates(namespace, stop))
        })
    };
    let mut upgraded = values.to_vec();
    upgraded.push(("webhook.logLevel", json!("debug")));
    release.upgrade_and_wait(&upgraded);
    stop.store(true, Ordering::Relaxed);
    let (applied, failures) = applier.join().expect("the apply loop ends");
    let (dry_run, dry_run_failures) = dry_runs.join().expect("the dry-run loops end");
    eprintln!("during the rollout: {applied} applies, {dry_run} dry-run creates");
    assert!(
        dry_run >= 50,
        "only {dry_run} dry-run creates ran during the rollout"
    );
    assert!(
        dry_run_failures.is_empty(),
        "{} of {dry_run} dry-run creates failed during the rollout, e.g.:\n{}",
        dry_run_failures.len(),
        dry_run_failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let after = live_pods(release, "webhook");
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "the webhook did not roll: {before:?} → {after:?}"
    );
    assert!(applied >= 5, "only {applied} applies ran during the rollout");
    assert!(
        failures.is_empty(),
        "{} of {applied} applies failed during the rollout:\n{}",
        failures.len(),
        failures.join("\n")
    );
    kubectl_ok(&[
        "-n",
        namespace,
        "delete",
        "projection",
        "during-upgrade",
        "--wait=true",
        "--timeout=60s",
    ]);
}

/// The CRs of the sharding step: `shard-<i>` in the team's namespace, copies of the same name.
const SHARDED_CRS: usize = 12;
const SHARDED_LABEL: &str = "chart-test=sharded";

/// Sharding turned on by one value on the running release (`controller.sharding.enabled`, three
/// pods): each pod holds a member Lease and acknowledges the ring of those Leases; every CR is
/// reconciled by the pod that ring gives it (its events name that pod alone, and `kubectl
/// projection status` shows it as OWNER). Then a pod is deleted as a drain does: an edit made right
/// after reaches every copy, and once the ReplicaSet's replacement joined, each CR that changed
/// hands says so in an `OwnerChanged` event from its new pod, and no other CR does. Then a pod is
/// cut off from the apiserver, a pod's controller is killed hard, and a fourth pod joins (each
/// below).
async fn sharding_by_one_value_splits_the_crs_between_the_pods(
    client: &kube::Client,
    release: &Release,
    values: &[(&str, Value)],
    source: &str,
    team: &str,
) {
    let mut sharded: Vec<(&str, Value)> = values
        .iter()
        .filter(|(key, _)| *key != "controller.replicas")
        .cloned()
        .collect();
    sharded.push(("controller.replicas", json!(3)));
    sharded.push(("controller.sharding.enabled", json!(true)));
    let began = Instant::now();
    release.upgrade_and_wait(&sharded);
    let first = wait_ring_of_the_pods(client, release).await;
    assert_eq!(first.members().len(), 3, "{:?}", first.members());

    let mut manifests = String::new();
    for i in 0..SHARDED_CRS {
        manifests.push_str(&format!(
            "---\napiVersion: projection.sh/v1\nkind: Projection\nmetadata:\n  name: shard-{i}\n  \
             namespace: {team}\n  labels: {{chart-test: sharded}}\nspec:\n  \
             source: {{kind: ConfigMap, namespace: {source}, name: app-settings}}\n  \
             destination: {{name: shard-{i}}}\n"
        ));
    }
    let out = apply(&manifests);
    assert!(out.status.success(), "{}", stderr(&out));
    kubectl_ok(&[
        "-n",
        team,
        "wait",
        "--for=condition=Ready",
        "projection",
        "-l",
        SHARDED_LABEL,
        "--timeout=60s",
    ]);
    let uids = sharded_uids(client, team).await;
    let owners = owners_in(&first, &uids);
    wait_for(
        "each CR's events to name the pod the ring gives it",
        TIMEOUT,
        || async {
            let mut wrong = Vec::new();
            for (i, owner) in owners.iter().enumerate() {
                let reporters: BTreeSet<String> = events_about(client, team, &format!("shard-{i}"))
                    .await
                    .into_iter()
                    .filter_map(|e| e.reporting_instance)
                    .collect();
                if reporters != BTreeSet::from([owner.clone()]) {
                    wrong.push(format!("shard-{i}: {reporters:?}, not {owner}"));
                }
            }
            wrong.is_empty().then_some(()).ok_or(wrong.join("; "))
        },
    )
    .await;
    let reconciling: BTreeSet<&String> = owners.iter().collect();
    assert!(
        reconciling.len() > 1,
        "one pod reconciles all {SHARDED_CRS} CRs: {owners:?}"
    );
    assert_eq!(
        status_owners(team, &release.namespace),
        owners,
        "kubectl projection status"
    );

    // A drain's eviction of the pod with the most CRs, and an edit right after.
    let victim = (*reconciling
        .iter()
        .max_by_key(|pod| owners.iter().filter(|o| *o == **pod).count())
        .expect("an owner"))
    .clone();
    let deleted = Instant::now();
    let timeline = MemberTimeline::start(&release.namespace, deleted);
    kubectl_ok(&["-n", &release.namespace, "delete", "pod", &victim, "--wait=false"]);
    set_source_color(source, "yellow");
    wait_sharded_copies(client, team, "yellow").await;
    let took = deleted.elapsed();
    let timeline = timeline.finish();
    eprintln!("the edit reached every copy {took:?} after {victim} was deleted; the members:\n{timeline}");
    // The deleted pod gives its Lease up as it stops, so the others need not wait for it to expire;
    // its replacement may join meanwhile and move CRs a second time.
    assert!(
        took < LEASE * 2 + Duration::from_secs(2),
        "the edit took {took:?} to reach every copy after a pod was deleted; the members:\n{timeline}"
    );

    let last = wait_ring_of_the_pods(client, release).await;
    assert!(!last.members().contains(&victim), "{victim} is still a member");
    assert_eq!(status_owners(team, &release.namespace), owners_in(&last, &uids));
    let mut moved = 0;
    for (i, uid) in uids.iter().enumerate() {
        let name = format!("shard-{i}");
        let now = last.owner_of(uid).expect("an owner");
        if now != owners[i] && !reconciling.contains(&now.to_owned()) {
            // Moved to the replacement. It names whom it took the CR from when the others' Leases
            // said so as it joined (docs/scale-out.md); between one survivor acknowledging the
            // ring without the deleted pod and the last one doing so, they cannot: no move named.
            // So no event is required here, but any it tells names a pod that had the CR.
            moved += 1;
            let told = format!("reconciled by replica {now} now, taken over from ");
            let notes = owner_changed_notes(client, team, &name).await;
            eprintln!(
                "{name} moved from {} to the replacement {now}: {notes:?}",
                owners[i]
            );
            for note in notes {
                if let Some(rest) = note.strip_prefix(&told) {
                    assert!(
                        rest.starts_with(&format!("{victim} "))
                            || reconciling.iter().any(|pod| rest.starts_with(&format!("{pod} "))),
                        "{name}: {note}; it was {victim}'s"
                    );
                }
            }
        } else if now != owners[i] {
            moved += 1;
            let told = format!("reconciled by replica {now} now, taken over from ");
            wait_for(
                &format!("{name}'s OwnerChanged event from {now}"),
                TIMEOUT,
                || async {
                    let notes = owner_changed_notes(client, team, &name).await;
                    notes
                        .iter()
                        .any(|n| n.starts_with(&told))
                        .then_some(())
                        .ok_or(format!("{notes:?}"))
                },
            )
            .await;
        } else {
            let changed = owner_changed_notes(client, team, &name).await;
            assert!(changed.is_empty(), "{name} stayed with {now}: {changed:?}");
        }
    }
    assert!(moved > 0, "no CR changed hands: the deleted pod owned some");

    let step = Sharded {
        client,
        release,
        source,
        team,
        uids: &uids,
    };
    a_pod_cut_off_hands_its_crs_over_and_takes_them_back(&step).await;
    a_pod_killed_hard_loses_no_edit(&step).await;
    let mut four = sharded.clone();
    four.retain(|(key, _)| *key != "controller.replicas");
    four.push(("controller.replicas", json!(4)));
    a_fourth_pod_takes_only_what_its_ring_moves(&step, &four).await;

    kubectl_ok(&[
        "-n",
        team,
        "delete",
        "projection",
        "-l",
        SHARDED_LABEL,
        "--wait=true",
        "--timeout=60s",
    ]);
    for i in 0..SHARDED_CRS {
        assert!(
            !exists("configmap", &format!("shard-{i}"), Some(team)),
            "shard-{i}'s copy is left after its Projection was deleted"
        );
    }
    eprintln!("the sharding step took {:?}", began.elapsed());
}

/// Waits until every copy of the sharding step's Projections has `data.color` = `color`.
async fn wait_sharded_copies(client: &kube::Client, team: &str, color: &str) {
    wait_for(
        &format!("every sharded copy to have color {color}"),
        TIMEOUT,
        || async {
            let stale = sharded_copies_not(client, team, color).await;
            stale.is_empty().then_some(()).ok_or(format!("stale: {stale:?}"))
        },
    )
    .await;
}

/// The copies of the sharding step's Projections whose `data.color` is not `color`, with theirs:
/// one list of the namespace's ConfigMaps (twelve `kubectl get`s took seconds on a loaded machine,
/// and that time counted in the takeovers' bounds).
async fn sharded_copies_not(client: &kube::Client, team: &str, color: &str) -> Vec<String> {
    let listed = match Api::<ConfigMap>::namespaced(client.clone(), team)
        .list(&ListParams::default())
        .await
    {
        Ok(listed) => listed,
        Err(e) => return vec![format!("the copies could not be listed: {e}")],
    };
    (0..SHARDED_CRS)
        .map(|i| format!("shard-{i}"))
        .filter_map(|name| {
            let seen = listed
                .items
                .iter()
                .find(|copy| copy.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|copy| copy.data.as_ref()?.get("color").cloned());
            (seen.as_deref() != Some(color)).then(|| format!("{name}: {seen:?}"))
        })
        .collect()
}

/// The pod `owners` names most often (the one with the most CRs).
fn with_most_crs(owners: &[String]) -> String {
    let pods: BTreeSet<&String> = owners.iter().collect();
    pods.into_iter()
        .max_by_key(|pod| owners.iter().filter(|o| o == pod).count())
        .expect("an owner")
        .clone()
}

/// The running controller pod `name` of the release, as `kubectl get -o json` shows it.
fn controller_pod(release: &Release, name: &str) -> Value {
    pods(&release.namespace, &selector(&release.name, "controller"))
        .into_iter()
        .find(|pod| pod_name(pod) == name)
        .unwrap_or_else(|| panic!("no controller pod {name}"))
}

/// The `OwnerChanged` notes of each of the sharding step's Projections, in order.
async fn owner_changes_of_all(client: &kube::Client, team: &str) -> Vec<BTreeSet<String>> {
    let mut all = Vec::new();
    for i in 0..SHARDED_CRS {
        all.push(
            owner_changed_notes(client, team, &format!("shard-{i}"))
                .await
                .into_iter()
                .collect(),
        );
    }
    all
}

/// Each CR's `OwnerChanged` notes once no more come: the same in two reads a second apart. A move's
/// note is published as its pass ends, which can be after the copies show the pass's write, so the
/// notes of one step are all in before the next step's begin.
async fn owner_changes_settled(client: &kube::Client, team: &str) -> Vec<BTreeSet<String>> {
    let mut last = owner_changes_of_all(client, team).await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = owner_changes_of_all(client, team).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("OwnerChanged notes kept coming for 30 s: {last:?}");
}

/// Waits until each CR that `moves` gives a (from, to) has one `OwnerChanged` note more than
/// `before`, from `to` naming `from`, and asserts that the others have none more.
async fn wait_told_moves(
    client: &kube::Client,
    team: &str,
    before: &[BTreeSet<String>],
    moves: &[Option<(String, String)>],
) {
    for (i, moved) in moves.iter().enumerate() {
        let name = format!("shard-{i}");
        let new_notes = || async {
            let now: BTreeSet<String> = owner_changed_notes(client, team, &name)
                .await
                .into_iter()
                .collect();
            now.difference(&before[i]).cloned().collect::<Vec<_>>()
        };
        match moved {
            Some((from, to)) => {
                let told = format!("reconciled by replica {to} now, taken over from {from} ");
                wait_for(
                    &format!("{name}'s OwnerChanged event from {to}"),
                    TIMEOUT,
                    || async {
                        let notes = new_notes().await;
                        match notes.as_slice() {
                            [one] if one.starts_with(&told) => Ok(()),
                            [] => Err("none yet".to_owned()),
                            more => panic!("{name}: {more:?}, not one note starting {told:?}"),
                        }
                    },
                )
                .await;
            }
            None => {
                let notes = new_notes().await;
                assert!(notes.is_empty(), "{name} did not change hands: {notes:?}");
            }
        }
    }
}

/// Packets between a pod and the apiserver (the `kubernetes` Service) dropped in the pod's network
/// namespace, as a partition would; its probes, from the node, still pass. Dropped, the path comes
/// back with the connections it held.
struct CutOff {
    pid: u32,
    rules: [[String; 10]; 2],
}

impl CutOff {
    fn new(pid: u32) -> Self {
        let out = kubectl(&[
            "-n",
            "default",
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]);
        let apiserver = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            !apiserver.is_empty(),
            "the kubernetes Service's IP: {}",
            stderr(&out)
        );
        let rule = |chain: &str, peer: &str, port: &str| {
            [
                chain, "-p", "tcp", peer, &apiserver, port, "443", "-j", "DROP", "-w",
            ]
            .map(str::to_owned)
        };
        let cut = Self {
            pid,
            rules: [rule("OUTPUT", "-d", "--dport"), rule("INPUT", "-s", "--sport")],
        };
        for rule in &cut.rules {
            cut.iptables("-I", rule);
        }
        cut
    }

    fn iptables(&self, action: &str, rule: &[String; 10]) {
        let mut command = vec!["iptables", action];
        command.extend(rule.iter().map(String::as_str));
        let out = in_network_of(self.pid, &command);
        assert!(
            out.trim().is_empty(),
            "iptables {action} {rule:?} in the pod's network: {out}"
        );
    }
}

impl Drop for CutOff {
    fn drop(&mut self) {
        for rule in &self.rules {
            self.iptables("-D", rule);
        }
    }
}

/// What the sharding step's disruptions act on: the release, the source, and the team's
/// Projections (`shard-<i>`, with their uids).
#[derive(Clone, Copy)]
struct Sharded<'a> {
    client: &'a kube::Client,
    release: &'a Release,
    source: &'a str,
    team: &'a str,
    uids: &'a [String],
}

/// The pod a disruption hits: the one with the most CRs once the pods agree on their ring.
struct Victim {
    ring: Ring,
    /// The owner of each CR in that ring.
    owners: Vec<String>,
    victim: String,
    /// The ring of the others.
    without: Ring,
    /// Each CR's `OwnerChanged` notes before the disruption.
    before: Vec<BTreeSet<String>>,
}

impl Victim {
    async fn pick(step: &Sharded<'_>) -> Self {
        let ring = wait_ring_of_the_pods(step.client, step.release).await;
        let owners = owners_in(&ring, step.uids);
        let victim = with_most_crs(&owners);
        let without = Ring::new(ring.members().iter().filter(|m| **m != victim));
        let before = owner_changes_settled(step.client, step.team).await;
        Self {
            ring,
            owners,
            victim,
            without,
            before,
        }
    }
}

/// The pod with the most CRs is cut off from the apiserver: an edit made right after reaches every
/// copy once its Lease expired, each of its CRs taken over by the pod the ring of the others gives
/// it (one `OwnerChanged` each). The path restored, it renews, and takes its CRs back once every pod
/// acknowledged the ring of three (telling each move back at most once); no copy reverted
/// meanwhile, and the next edit reaches every copy.
async fn a_pod_cut_off_hands_its_crs_over_and_takes_them_back(step: &Sharded<'_>) {
    let Sharded {
        client,
        release,
        source,
        team,
        uids,
    } = *step;
    let hit = Victim::pick(step).await;
    let (ring, owners, victim, without) = (&hit.ring, &hit.owners, &hit.victim, &hit.without);
    let cut = CutOff::new(container_pid(&controller_pod(release, victim)));
    let began = Instant::now();
    let timeline = MemberTimeline::start(&release.namespace, began);
    set_source_color(source, "orange");
    wait_sharded_copies(client, team, "orange").await;
    let took = began.elapsed();
    let timeline = timeline.finish();
    eprintln!(
        "an edit made right after {victim} was cut off reached every copy in {took:?}; the members:\n{timeline}"
    );
    // Its Lease runs out 4 to 6 s after the cut (renewed every third of it), then the others
    // settle and take over: 5.2 s in a run on 2026-11-29; the bound leaves room for a loaded machine.
    assert!(
        took < LEASE * 2 + Duration::from_secs(2),
        "the edit took {took:?} to reach every copy after {victim} was cut off (Lease {LEASE:?}); the members:\n{timeline}"
    );
    let moves: Vec<Option<(String, String)>> = uids
        .iter()
        .zip(owners)
        .map(|(uid, owner)| {
            (owner == victim).then(|| {
                (
                    victim.clone(),
                    without.owner_of(uid).expect("an owner").to_owned(),
                )
            })
        })
        .collect();
    wait_told_moves(client, team, &hit.before, &moves).await;

    let during = owner_changes_of_all(client, team).await;
    drop(cut);
    let back = wait_ring_of_the_pods(client, release).await;
    assert_eq!(back.version(), ring.version(), "the same three pods");
    let reverted = sharded_copies_not(client, team, "orange").await;
    assert!(
        reverted.is_empty(),
        "copies changed once {victim} came back: {reverted:?}"
    );
    set_source_color(source, "blue");
    wait_sharded_copies(client, team, "blue").await;
    // Its CRs' way back is told when it read the others' Leases (the ring without it) before its
    // own renewal landed, and not when the renewal came first.
    let back_home: Vec<Vec<String>> = uids
        .iter()
        .zip(owners)
        .map(|(uid, owner)| match owner == victim {
            true => vec![told(victim, without.owner_of(uid).expect("an owner"))],
            false => Vec::new(),
        })
        .collect();
    let after = owner_changes_settled(client, team).await;
    assert_told_at_most(&during, &after, &back_home, &format!("{victim} came back"));
}

/// The start of the `OwnerChanged` note of a CR that `to` took over from `from`.
fn told(to: &str, from: &str) -> String {
    format!("reconciled by replica {to} now, taken over from {from} ")
}

/// Asserts that each CR's `OwnerChanged` notes from `before` to `after` start each with another of
/// the notes `allowed` for it (none where it allows none).
fn assert_told_at_most(
    before: &[BTreeSet<String>],
    after: &[BTreeSet<String>],
    allowed: &[Vec<String>],
    when: &str,
) {
    for (i, allowed) in allowed.iter().enumerate() {
        let new_notes: Vec<&String> = after[i].difference(&before[i]).collect();
        let mut unused = allowed.clone();
        for note in &new_notes {
            let used = unused.iter().position(|start| note.starts_with(start.as_str()));
            assert!(
                used.map(|at| unused.remove(at)).is_some(),
                "shard-{i} after {when}: {new_notes:?}, of which only {allowed:?} may be"
            );
        }
    }
}

/// The container of the pod with the most CRs is killed (SIGKILL: no Lease given up, nothing
/// drained): an edit made right after reaches every copy, whether the kubelet's restart of the
/// container (same pod, same member) or the others' takeover once its Lease expired comes first.
/// The container restarted, the ring is the three pods' again; no CR of another pod changed hands,
/// and one of the killed pod's at most to the pod the ring of the others gives it and back.
async fn a_pod_killed_hard_loses_no_edit(step: &Sharded<'_>) {
    let Sharded {
        client,
        release,
        source,
        team,
        uids,
    } = *step;
    let hit = Victim::pick(step).await;
    let (ring, owners, victim, without) = (&hit.ring, &hit.owners, &hit.victim, &hit.without);
    let restarts = |pod: &Value| {
        pod["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0)
    };
    let pod = controller_pod(release, victim);
    let restarted = restarts(&pod);
    let pid = container_pid(&pod);
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success(), "kill -KILL {pid} ({victim}'s controller)");
    let began = Instant::now();
    let timeline = MemberTimeline::start(&release.namespace, began);
    set_source_color(source, "purple");
    wait_sharded_copies(client, team, "purple").await;
    let took = began.elapsed();
    let timeline = timeline.finish();
    eprintln!(
        "an edit made right after {victim}'s controller was killed reached every copy in {took:?}; the members:\n{timeline}"
    );
    assert!(
        took < LEASE * 2 + Duration::from_secs(2),
        "the edit took {took:?} to reach every copy after {victim}'s controller was killed; the members:\n{timeline}"
    );
    wait_for(&format!("{victim}'s container to restart"), TIMEOUT, || async {
        let now = restarts(&controller_pod(release, victim));
        (now > restarted)
            .then_some(())
            .ok_or(format!("restartCount {now}"))
    })
    .await;
    let back = wait_ring_of_the_pods(client, release).await;
    assert_eq!(back.version(), ring.version(), "the same three pods");
    // Where its Lease expired before the restarted container renewed it, its CRs went to the
    // others and came back, each way told at most once.
    let there_and_back: Vec<Vec<String>> = uids
        .iter()
        .zip(owners)
        .map(|(uid, owner)| {
            let other = without.owner_of(uid).expect("an owner");
            match owner == victim {
                true => vec![told(other, victim), told(victim, other)],
                false => Vec::new(),
            }
        })
        .collect();
    let after = owner_changes_settled(client, team).await;
    assert_told_at_most(
        &hit.before,
        &after,
        &there_and_back,
        &format!("{victim}'s controller was killed"),
    );
}

/// A fourth pod joins (`controller.replicas` 3 → 4): only the CRs the new ring gives it move (the
/// ranges it takes are at most 35 % of the hash space), each saying so once from it; the others
/// stay where they were, `kubectl projection status` shows the new owners, and an edit reaches
/// every copy.
async fn a_fourth_pod_takes_only_what_its_ring_moves(step: &Sharded<'_>, values: &[(&str, Value)]) {
    let Sharded {
        client,
        release,
        source,
        team,
        uids,
    } = *step;
    let three = wait_ring_of_the_pods(client, release).await;
    let before = owner_changes_settled(client, team).await;
    release.upgrade_and_wait(values);
    let four = wait_ring_of_the_pods(client, release).await;
    let newcomer = four
        .members()
        .iter()
        .find(|m| !three.members().contains(m))
        .unwrap_or_else(|| {
            panic!(
                "no new member in {:?} (was {:?})",
                four.members(),
                three.members()
            )
        })
        .clone();
    assert_eq!(four.members().len(), 4, "{:?}", four.members());
    let taken: f64 = four.ranges_of(&newcomer).iter().map(|r| r.share()).sum();
    assert!(
        taken <= 0.35,
        "{newcomer} takes {:.1} % of the hash space",
        taken * 100.0
    );
    let (was, is) = (owners_in(&three, uids), owners_in(&four, uids));
    let moves: Vec<Option<(String, String)>> = was
        .iter()
        .zip(&is)
        .map(|(was, is)| {
            (was != is).then(|| {
                assert_eq!(*is, newcomer, "a CR moved between two pods that stayed");
                (was.clone(), is.clone())
            })
        })
        .collect();
    wait_told_moves(client, team, &before, &moves).await;
    assert_eq!(
        status_owners(team, &release.namespace),
        is,
        "kubectl projection status"
    );
    set_source_color(source, "white");
    wait_sharded_copies(client, team, "white").await;
    eprintln!(
        "{newcomer} joined: {} of {SHARDED_CRS} CRs moved to it ({:.1} % of the hash space)",
        moves.iter().flatten().count(),
        taken * 100.0
    );
}

/// The notes of the `OwnerChanged` events about the Projection `name` in `namespace`.
async fn owner_changed_notes(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    events_about(client, namespace, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("OwnerChanged"))
        .filter_map(|e| e.note)
        .collect()
}

/// The uids of the sharding step's Projections in `namespace`, `shard-<i>` at index i (one list).
async fn sharded_uids(client: &kube::Client, namespace: &str) -> Vec<String> {
    let listed = Api::<Projection>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(SHARDED_LABEL))
        .await
        .expect("the sharding step's Projections");
    (0..SHARDED_CRS)
        .map(|i| {
            let name = format!("shard-{i}");
            listed
                .items
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|p| p.metadata.uid.clone())
                .unwrap_or_else(|| panic!("{name} is not listed"))
        })
        .collect()
}

/// The member `ring` gives each of `uids`, in order.
fn owners_in(ring: &Ring, uids: &[String]) -> Vec<String> {
    uids.iter()
        .map(|uid| {
            ring.owner_of(uid)
                .expect("a ring of members owns every uid")
                .to_owned()
        })
        .collect()
}

/// The OWNER `kubectl projection status -o json` gives the sharding step's Projections, in order.
fn status_owners(namespace: &str, controller_namespace: &str) -> Vec<String> {
    let plugin = projection_tests::workspace_binary("plugin", "kubectl-projection");
    let out = std::process::Command::new(plugin)
        .args(["status", "-n", namespace, "-l", SHARDED_LABEL, "-o", "json"])
        .args(["--controller-namespace", controller_namespace])
        .env("KUBECONFIG", projection_tests::kubeconfig_path())
        .output()
        .expect("the plugin runs");
    assert_eq!(out.status.code(), Some(0), "status: {}", stderr(&out));
    let lines: Vec<Value> = serde_json::from_slice(&out.stdout).expect("status prints a JSON list");
    (0..SHARDED_CRS)
        .map(|i| {
            let name = format!("shard-{i}");
            let line = lines
                .iter()
                .find(|l| l["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{name} missing from status: {lines:?}"));
            line["owner"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Waits until the member Leases in the release's namespace are held by exactly its live controller
/// pods and all acknowledge the ring of those pods; returns that ring.
async fn wait_ring_of_the_pods(client: &kube::Client, release: &Release) -> Ring {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &release.namespace);
    wait_for(
        "the controller pods to acknowledge their ring",
        TIMEOUT,
        || async {
            let pods: BTreeSet<String> = live_pods(release, "controller").into_iter().collect();
            let ring = Ring::new(pods.iter().cloned());
            let version = ring.version();
            let members = leases
                .list(&ListParams::default().labels(&format!("{MEMBER_LABEL}=true")))
                .await
                .map_err(|e| e.to_string())?;
            let said: BTreeSet<(String, Option<String>)> = members
                .items
                .iter()
                .filter_map(MemberLease::of)
                .map(|member| (member.identity, member.acknowledged))
                .collect();
            let holders: BTreeSet<String> = said.iter().map(|(holder, _)| holder.clone()).collect();
            (holders == pods
                && said
                    .iter()
                    .all(|(_, ack)| ack.as_deref() == Some(version.as_str())))
            .then_some(ring)
            .ok_or(format!(
                "pods {pods:?}; the Leases say {said:?}, not all {version}"
            ))
        },
    )
    .await
}

/// The member Leases of a release as they change while a disruption plays out, read every 200 ms
/// from `since` until [`MemberTimeline::finish`] (or two minutes, whichever comes first): what a
/// takeover's bound prints, so that a slow one says where its time went (a Lease given up or left
/// to expire, a replacement joining, a ring acknowledged late). On a thread and a runtime of its
/// own: the test's runtime is held by each `kubectl` it runs.
struct MemberTimeline {
    stop: Arc<AtomicBool>,
    reads: std::thread::JoinHandle<Vec<String>>,
}

impl MemberTimeline {
    fn start(namespace: &str, since: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let namespace = namespace.to_owned();
        let reads = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the member timeline")
                .block_on(member_changes(namespace, since, stopped))
        });
        Self { stop, reads }
    }

    /// What changed, one line each, with the seconds since the start.
    fn finish(self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        self.reads.join().unwrap_or_default().join("\n")
    }
}

/// The reads of [`MemberTimeline`]: a line for each member Lease that appears, acknowledges a
/// ring, or goes (deleted while valid: given up; or after it expired).
async fn member_changes(namespace: String, since: Instant, stop: Arc<AtomicBool>) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(client().await, &namespace);
    let members = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
    let mut seen: std::collections::BTreeMap<String, MemberLease> = Default::default();
    let mut told = Vec::new();
    while !stop.load(Ordering::Relaxed) && since.elapsed() < Duration::from_secs(120) {
        if let Ok(list) = leases.list(&members).await {
            let at = since.elapsed().as_secs_f64();
            let now: std::collections::BTreeMap<String, MemberLease> = list
                .items
                .iter()
                .filter_map(MemberLease::of)
                .map(|member| (member.identity.clone(), member))
                .collect();
            for (identity, member) in &now {
                let ack = member.acknowledged.as_deref().unwrap_or("none");
                match seen.get(identity) {
                    None => told.push(format!("{at:6.2}s {identity} member, ring {ack}")),
                    Some(before) if before.acknowledged != member.acknowledged => {
                        told.push(format!("{at:6.2}s {identity} acknowledged ring {ack}"));
                    }
                    Some(_) => {}
                }
            }
            for (identity, member) in &seen {
                if !now.contains_key(identity) {
                    let state = if member.is_live(std::time::SystemTime::now()) {
                        "deleted before it expired"
                    } else {
                        "gone after it expired"
                    };
                    told.push(format!("{at:6.2}s {identity} Lease {state}"));
                }
            }
            seen = now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    told
}

/// Four loops of server-side dry-run creates of a Projection until `stop`, bounded; returns how
/// many were sent and the errors.
async fn dry_run_creates(namespace: String, stop: Arc<AtomicBool>) -> (usize, Vec<String>) {
    let projections: Api<Projection> = Api::namespaced(client().await, &namespace);
    let loops = (0..4).map(|lane| {
        let (projections, stop) = (projections.clone(), stop.clone());
        async move {
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let (mut sent, mut failures) = (0, Vec::new());
            for i in 0..20_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let projection: Projection = serde_json::from_value(json!({
                    "apiVersion": "projection.sh/v1", "kind": "Projection",
                    "metadata": {"name": format!("dry-run-{lane}-{i}")},
                    "spec": {"source": {"kind": "ConfigMap", "namespace": "default", "name": "not-there"}},
                }))
                .expect("a Projection");
                sent += 1;
                if let Err(e) = projections.create(&dry_run, &projection).await {
                    failures.push(e.to_string());
                }
            }
            (sent, failures)
        }
    });
    futures::future::join_all(loops).await.into_iter().fold(
        (0, Vec::new()),
        |(sent, mut failures), (n, more)| {
            failures.extend(more);
            (sent + n, failures)
        },
    )
}

/// cert-manager mode with the chart's self-signed Issuer: cert-manager issues the Certificate,
/// cainjector fills both caBundles, and a renewed certificate is served by the running webhook
/// pods without a restart.
#[tokio::test]
async fn cert_manager_issues_injects_and_renews_the_webhook_certificate() {
    let (_serial, client, system) = on_the_node("node-cm").await;
    let values = vec![("webhook.certificate.mode", json!("cert-manager"))];
    let release = Release::install_and_wait("projection-cm", system.name(), &values);
    let rendered = release.render(&values).expect("renders");
    assert_running_from_local_images(&release);
    let ns = system.name();
    let secret = "projection-cm-webhook-tls";
    kubectl_ok(&[
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        "certificate/projection-cm-webhook",
        "--timeout=60s",
    ]);
    let issuer = kubectl_ok(&[
        "-n",
        ns,
        "get",
        "secret",
        secret,
        "-o",
        "jsonpath={.metadata.annotations.cert-manager\\.io/issuer-name}",
    ]);
    assert_eq!(
        issuer, "projection-cm-webhook-selfsigned",
        "issued by cert-manager through the chart's Issuer"
    );
    // cainjector keeps the CA it injected before next to the new one (so a rotation never leaves
    // the apiserver without the CA of a certificate still served): the bundle holds the Secret's CA.
    let ca_injected = |ca: String| async move {
        let bundles = decoded_ca_bundles("projection-cm-webhook");
        if bundles.iter().all(|b| b.contains(ca.trim())) {
            Ok(())
        } else {
            Err("the caBundles lack the Secret's ca.crt".to_owned())
        }
    };
    let ca = secret_field(ns, secret, "ca.crt");
    wait_for("cainjector to inject the Secret's CA", TIMEOUT, || {
        ca_injected(ca.clone())
    })
    .await;
    let team = TestNamespace::create(&client, "node-cm-team").await;
    assert_webhook_refuses_bad_spec(team.name());

    // Renewal: the Secret is deleted, cert-manager issues a new certificate, the kubelet updates
    // the mounted files, and the running webhook pods serve it (no restart).
    let webhooks = pods(ns, &selector(&release.name, "webhook"));
    let old = secret_field(ns, secret, "tls.crt");
    kubectl_ok(&["-n", ns, "delete", "secret", secret]);
    let renewed = wait_for("cert-manager to issue a new certificate", TIMEOUT, || async {
        let out = kubectl(&["-n", ns, "get", "secret", secret, "-o", "name"]);
        if !out.status.success() {
            return Err("no Secret yet".to_owned());
        }
        let cert = secret_field(ns, secret, "tls.crt");
        if cert != old && !cert.is_empty() {
            Ok(cert)
        } else {
            Err("the old certificate".to_owned())
        }
    })
    .await;
    let server_name = format!("projection-cm-webhook.{ns}.svc");
    for pod in &webhooks {
        let ip = pod["status"]["podIP"].as_str().expect("pod IP").to_owned();
        wait_for(
            &format!("{} to serve the renewed certificate", pod_name(pod)),
            Duration::from_secs(120),
            || async {
                let served = served_certificate(&ip, 9443, &server_name);
                if served.trim() == renewed.trim() {
                    Ok(())
                } else {
                    Err(format!("serving {served}"))
                }
            },
        )
        .await;
    }
    let restarts: Vec<Value> = pods(ns, &selector(&release.name, "webhook"))
        .iter()
        .map(|p| p["status"]["containerStatuses"][0]["restartCount"].clone())
        .collect();
    assert_eq!(restarts, [json!(0), json!(0)], "the webhook pods restarted");
    let names: Vec<String> = pods(ns, &selector(&release.name, "webhook"))
        .iter()
        .map(pod_name)
        .collect();
    assert_eq!(
        names,
        webhooks.iter().map(pod_name).collect::<Vec<_>>(),
        "the same pods serve"
    );
    let ca = secret_field(ns, secret, "ca.crt");
    wait_for("cainjector to inject the renewed CA", TIMEOUT, || {
        ca_injected(ca.clone())
    })
    .await;
    assert_webhook_refuses_bad_spec(team.name());

    team.delete_and_wait(&client).await;
    // cert-manager keeps the Secret it issued when the Certificate goes (docs/getting-started.md).
    assert_uninstall_leaves_only(release, &rendered, &[("secret", secret)]).await;
    system.delete_and_wait(&client).await;
}

/// cert-manager mode with the user's own CA Issuer (`issuerRef`): the webhook serves a certificate
/// signed by that CA, which cainjector puts in the caBundles.
#[tokio::test]
async fn cert_manager_mode_with_a_user_issuer() {
    let (_serial, client, system) = on_the_node("node-issuer").await;
    let ns = system.name();
    // The user's CA: a self-signed root Certificate and a CA Issuer over its Secret.
    let out = apply(&format!(
        "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {{name: root, namespace: {ns}}}\nspec: {{selfSigned: {{}}}}\n\
         ---\napiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {{name: team-ca, namespace: {ns}}}\n\
         spec: {{isCA: true, commonName: team-ca, secretName: team-ca, issuerRef: {{name: root, kind: Issuer}}}}\n\
         ---\napiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {{name: team-ca, namespace: {ns}}}\n\
         spec: {{ca: {{secretName: team-ca}}}}\n"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    kubectl_ok(&[
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        "issuer/team-ca",
        "--timeout=60s",
    ]);
    let values = vec![
        ("webhook.certificate.mode", json!("cert-manager")),
        ("webhook.certificate.certManager.issuerRef.name", json!("team-ca")),
    ];
    let release = Release::install_and_wait("projection-issuer", ns, &values);
    let rendered = release.render(&values).expect("renders");
    assert!(
        !rendered.has("Issuer", "projection-issuer-webhook-selfsigned"),
        "no Issuer of the chart's own"
    );
    kubectl_ok(&[
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        "certificate/projection-issuer-webhook",
        "--timeout=60s",
    ]);
    let team_ca = secret_field(ns, "team-ca", "tls.crt");
    let served_ca = secret_field(ns, "projection-issuer-webhook-tls", "ca.crt");
    assert_eq!(
        served_ca.trim(),
        team_ca.trim(),
        "the webhook's certificate is signed by the user's CA"
    );
    wait_for("cainjector to inject the user's CA", TIMEOUT, || async {
        use base64::{Engine as _, engine::general_purpose::STANDARD};
        let bundles = webhook_ca_bundles("projection-issuer-webhook");
        if bundles
            .iter()
            .all(|b| STANDARD.decode(b).is_ok_and(|pem| pem == served_ca.as_bytes()))
        {
            Ok(())
        } else {
            Err(format!("{} caBundles, not the user's CA yet", bundles.len()))
        }
    })
    .await;
    let team = TestNamespace::create(&client, "node-issuer-team").await;
    assert_webhook_refuses_bad_spec(team.name());
    team.delete_and_wait(&client).await;
    assert_uninstall_leaves_only(
        release,
        &rendered,
        &[("secret", "projection-issuer-webhook-tls"), ("issuer", "team-ca")],
    )
    .await;
    system.delete_and_wait(&client).await;
}

/// Provided mode: the user's Secret and CA; the optional ServiceMonitors and NetworkPolicies too,
/// so the apiserver (and prometheus-operator's CRD) validate them.
#[tokio::test]
async fn provided_certificate_install_with_the_optional_objects() {
    let (_serial, client, system) = on_the_node("node-provided").await;
    install_service_monitor_crd(&client).await;
    let ns = system.name();
    let dns = vec![format!("projection-provided-webhook.{ns}.svc")];
    let (cert, key) = self_signed(&testenv_dir().join(format!("provided-{ns}")), &dns);
    write_tls_secret(ns, "my-webhook-tls", &cert, &key, &cert);
    let values = vec![
        ("webhook.certificate.mode", json!("provided")),
        ("webhook.certificate.provided.secretName", json!("my-webhook-tls")),
        ("webhook.certificate.provided.caBundle", json!(cert)),
        ("metrics.serviceMonitor.enabled", json!(true)),
        ("networkPolicy.enabled", json!(true)),
    ];
    let release = Release::install_and_wait("projection-provided", ns, &values);
    let rendered = release.render(&values).expect("renders");
    // `helm test`'s objects are hooks: created by `helm test` only, not by the install.
    let installed = rendered
        .0
        .iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].as_str() != Some("test"));
    for object in installed {
        let kind = object["kind"].as_str().expect("kind");
        let name = object["metadata"]["name"].as_str().expect("name");
        assert!(
            exists(kind, name, object["metadata"]["namespace"].as_str()),
            "{kind} {name} was not created"
        );
    }
    assert_running_from_local_images(&release);
    for pod in pods(ns, &selector(&release.name, "webhook")) {
        let ip = pod["status"]["podIP"].as_str().expect("pod IP");
        assert_eq!(
            served_certificate(ip, 9443, &dns[0]).trim(),
            cert.trim(),
            "the user's certificate is served"
        );
    }
    let team = TestNamespace::create(&client, "node-provided-team").await;
    assert_webhook_refuses_bad_spec(team.name());
    let notes = helm_ok(&["get", "notes", &release.name, "-n", ns]);
    assert!(
        notes.contains("apiVersion: projection.sh/v1"),
        "NOTES show a first Projection:\n{notes}"
    );
    team.delete_and_wait(&client).await;
    // Not ours: the user's Secret survives the uninstall.
    assert_uninstall_leaves_only(release, &rendered, &[("secret", "my-webhook-tls")]).await;
    system.delete_and_wait(&client).await;
}

/// prometheus-operator's ServiceMonitor CRD (from its Go module, cached by
/// `tests/control-plane/build.sh`), so the apiserver validates the chart's ServiceMonitors.
async fn install_service_monitor_crd(client: &kube::Client) {
    // The trailing slash makes kubectl follow the link to the folder (the cache keeps the files).
    let dir = format!(
        "{}/",
        control_plane_bin().join("prometheus-operator-crds").display()
    );
    kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", &dir]);
    wait_crd_established(client, "servicemonitors.monitoring.coreos.com").await;
}

/// The condition `Ready` of Projection `name` in `namespace`, as `reason: message`.
fn ready_of(namespace: &str, name: &str) -> String {
    kubectl_ok(&[
        "-n",
        namespace,
        "get",
        "projection",
        name,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}: {.status.conditions[?(@.type==\"Ready\")].message}",
    ])
}

/// Tenancy without the webhook: installed with `failurePolicy: Ignore` and the webhook scaled to
/// zero, a tenant (`kubectl --as`) who may not read a Secret gets no copy of it, whatever it writes;
/// the admission policy refuses a record naming someone else; and the copies are written as their
/// author, so an admission policy keyed on the user refuses the tenant's copy and not another's.
#[tokio::test]
async fn the_controller_holds_tenancy_with_the_webhook_bypassed() {
    let (_serial, client, system) = on_the_node("node-bypass").await;
    let values = vec![("webhook.failurePolicy", json!("Ignore"))];
    let release = Release::install_and_wait("projection-bypass", system.name(), &values);
    kubectl_ok(&[
        "-n",
        &release.namespace,
        "scale",
        "deployment",
        "projection-bypass-webhook",
        "--replicas=0",
    ]);
    wait_for("the webhook pods gone", TIMEOUT, || async {
        let left = pods(&release.namespace, &selector(&release.name, "webhook"));
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.len()))
        }
    })
    .await;

    let source = TestNamespace::create(&client, "node-bypass-src").await;
    let team = TestNamespace::create(&client, "node-bypass-team").await;
    let (src, dst) = (source.name(), team.name());
    let user = format!("mallory-{dst}");
    kubectl_ok(&[
        "-n",
        src,
        "create",
        "secret",
        "generic",
        "db-password",
        "--from-literal=password=hunter2",
    ]);
    kubectl_ok(&[
        "-n",
        src,
        "annotate",
        "secret",
        "db-password",
        "projection.sh/projectable=true",
    ]);
    // The tenant manages Projections and Secrets in its own namespace, and nothing in the source's.
    kubectl_ok(&[
        "-n",
        dst,
        "create",
        "role",
        "tenant",
        "--verb=*",
        "--resource=projections.projection.sh,secrets",
    ]);
    kubectl_ok(&[
        "-n",
        dst,
        "create",
        "rolebinding",
        "tenant",
        "--role=tenant",
        &format!("--user={user}"),
    ]);
    let as_user = format!("--as={user}");
    let manifest = format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: db-password, namespace: {dst}}}\n\
         spec:\n  source: {{version: v1, kind: Secret, namespace: {src}, name: db-password}}\n"
    );
    let created = kubectl_stdin(&[&as_user, "apply", "-f", "-"], &manifest);
    assert!(
        created.status.success(),
        "admitted with the webhook bypassed: {}",
        stderr(&created)
    );

    let no_copy = || {
        let out = kubectl(&[
            "-n",
            dst,
            "get",
            "secret",
            "db-password",
            "--ignore-not-found",
            "-o",
            "name",
        ]);
        assert!(
            String::from_utf8_lossy(&out.stdout).trim().is_empty(),
            "a copy was made"
        );
    };
    wait_for("no author recorded", TIMEOUT, || async {
        let ready = ready_of(dst, "db-password");
        if ready.starts_with("SourceForbidden: no author is recorded") {
            Ok(())
        } else {
            Err(ready)
        }
    })
    .await;
    no_copy();

    // Recording someone else is refused by the apiserver itself.
    let admin = r#"projection.sh/author={"username":"projection-testenv-admin","groups":["system:masters","system:authenticated"]}"#;
    let forged = kubectl(&[
        &as_user,
        "-n",
        dst,
        "annotate",
        "projection",
        "db-password",
        admin,
    ]);
    assert!(!forged.status.success(), "a forged author was admitted");
    assert!(
        stderr(&forged).contains("must record the user who writes the spec"),
        "{}",
        stderr(&forged)
    );

    // Recording itself is admitted, and the controller asks whether it may read the source.
    let own = format!(r#"projection.sh/author={{"username":"{user}","groups":["system:authenticated"]}}"#);
    kubectl_ok(&[&as_user, "-n", dst, "annotate", "projection", "db-password", &own]);
    wait_for("the author's access denied", TIMEOUT, || async {
        let ready = ready_of(dst, "db-password");
        if ready.starts_with(&format!(
            "SourceForbidden: the author {user} may not get secrets {src}/db-password"
        )) {
            Ok(())
        } else {
            Err(ready)
        }
    })
    .await;
    no_copy();

    // Copies are written as their author (the chart's default on v1.36): a ValidatingAdmissionPolicy
    // that refuses Secrets written by the tenant in its namespace refuses the tenant's copy once the
    // tenant may read the source, while the same copy for another tenant it allows is written.
    let policy = format!("refuse-{dst}");
    let _policy = [
        ClusterScopedGuard::new("validatingadmissionpolicies", &policy),
        ClusterScopedGuard::new("validatingadmissionpolicybindings", &policy),
    ];
    let refusal = format!("{user} may not write Secrets in {dst}");
    let applied = apply(&format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n\
         metadata: {{name: {policy}}}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    \
         resourceRules: [{{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [secrets]}}]\n  \
         validations:\n  - expression: \"request.userInfo.username != '{user}'\"\n    message: \"{refusal}\"\n\
         ---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\n\
         metadata: {{name: {policy}}}\nspec:\n  policyName: {policy}\n  validationActions: [Deny]\n  \
         matchResources: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {dst}}}}}}}\n"
    ));
    assert!(applied.status.success(), "{}", stderr(&applied));
    wait_for("the policy refusing the tenant's own write", TIMEOUT, || async {
        let out = kubectl(&[
            &as_user,
            "-n",
            dst,
            "create",
            "secret",
            "generic",
            "by-hand",
            "--from-literal=k=v",
        ]);
        if stderr(&out).contains(&refusal) {
            Ok(())
        } else {
            let _ = kubectl(&["-n", dst, "delete", "secret", "by-hand", "--ignore-not-found"]);
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                stderr(&out)
            ))
        }
    })
    .await;
    let other = format!("trent-{dst}");
    kubectl_ok(&[
        "-n",
        dst,
        "create",
        "rolebinding",
        "tenant-other",
        "--role=tenant",
        &format!("--user={other}"),
    ]);
    kubectl_ok(&[
        "-n",
        src,
        "create",
        "role",
        "read-db",
        "--verb=get",
        "--resource=secrets",
        "--resource-name=db-password",
    ]);
    kubectl_ok(&[
        "-n",
        src,
        "create",
        "rolebinding",
        "read-db",
        "--role=read-db",
        &format!("--user={user}"),
        &format!("--user={other}"),
    ]);
    let as_other = format!("--as={other}");
    let record = format!(r#"{{"username":"{other}","groups":["system:authenticated"]}}"#);
    let theirs = format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata:\n  name: for-other\n  namespace: {dst}\n  \
         annotations: {{projection.sh/author: '{record}'}}\n\
         spec:\n  source: {{version: v1, kind: Secret, namespace: {src}, name: db-password}}\n  \
         destination: {{name: db-password-other}}\n"
    );
    let created = kubectl_stdin(&[&as_other, "apply", "-f", "-"], &theirs);
    assert!(created.status.success(), "{}", stderr(&created));
    wait_for("the other tenant's copy written", TIMEOUT, || async {
        let ready = ready_of(dst, "for-other");
        ready.starts_with("Projected").then_some(()).ok_or(ready)
    })
    .await;
    kubectl_ok(&["-n", dst, "get", "secret", "db-password-other"]);
    wait_for("the tenant's copy refused by the policy", TIMEOUT, || async {
        let ready = ready_of(dst, "db-password");
        if ready.starts_with("DestinationCreateFailed") && ready.contains(&refusal) {
            Ok(())
        } else {
            Err(ready)
        }
    })
    .await;
    no_copy();

    for name in ["db-password", "for-other"] {
        kubectl_ok(&[
            "-n",
            dst,
            "delete",
            "projection",
            name,
            "--wait=true",
            "--timeout=60s",
        ]);
    }
    for ns in [team, source] {
        ns.delete_and_wait(&client).await;
    }
    release.uninstall();
    system.delete_and_wait(&client).await;
}

/// The memory of a container as its cgroup on the node accounts it: the limit in force, the
/// highest usage so far, and how often the limit was hit (cgroup v1: `failcnt`; v2: the `max`
/// events).
#[derive(Debug)]
struct CgroupMemory {
    limit: u64,
    peak: u64,
    limit_hit: u64,
}

fn cgroup_memory(pid: u32) -> CgroupMemory {
    let read = |path: String| {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .to_owned()
    };
    let cgroups = read(format!("/proc/{pid}/cgroup"));
    if let Some(v1) = cgroups
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, path)| path.to_owned()))
    {
        let dir = format!("/sys/fs/cgroup/memory{v1}");
        let number = |file: &str| read(format!("{dir}/{file}")).parse::<u64>().expect(file);
        return CgroupMemory {
            limit: number("memory.limit_in_bytes"),
            peak: number("memory.max_usage_in_bytes"),
            limit_hit: number("memory.failcnt"),
        };
    }
    let v2 = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no memory cgroup in {cgroups}"));
    let dir = format!("/sys/fs/cgroup{v2}");
    let events = read(format!("{dir}/memory.events"));
    CgroupMemory {
        limit: read(format!("{dir}/memory.max")).parse().expect("memory.max"),
        peak: read(format!("{dir}/memory.peak")).parse().expect("memory.peak"),
        limit_hit: events
            .lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.parse().ok())
            .expect("memory.events max"),
    }
}

/// The peak resident set size (`VmHWM`) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM in /proc/PID/status")
        * 1024
}

/// A pod of the sandbox image alone, whose network namespace an attack runs in: traffic from it
/// comes from a pod IP, as from any other workload of the cluster.
fn attacker_pod(namespace: &str, name: &str) -> Value {
    let out = apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  \
         terminationGracePeriodSeconds: 0\n  containers:\n  - \
         {{name: idle, image: local.test/pause:local, imagePullPolicy: Never}}\n"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    kubectl_ok(&[
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "--timeout=60s",
    ]);
    serde_json::from_str(&kubectl_ok(&["-n", namespace, "get", "pod", name, "-o", "json"])).expect("pod JSON")
}

/// Issue 30's exhaustion attack against the chart's webhook pod on the node, from three other
/// pods (so the share of one address does not hide it): 4 MiB reviews of one long string and of
/// dense JSON (16 HTTP/2 connections × 8 streams each), and 100 stalled connections, for 25 s.
/// Meanwhile `kubectl apply` keeps writing Projections through the apiserver, which calls the pod
/// (one replica, so every admission goes to the attacked pod): every write gets the webhook's
/// answer (a bad spec refused by it, a good one admitted with the author the mutating webhook
/// records). The pod stays under its 256 MiB limit, by its own peak RSS and by its memory cgroup
/// on the node, and is neither OOM-killed nor restarted.
#[tokio::test]
async fn webhook_pod_under_attack_stays_under_its_memory_limit_and_answers_the_apiserver() {
    const ATTACK: Duration = Duration::from_secs(25);
    const MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
    let _cores = projection_tests::cores_alone().await;
    let (_serial, client, system) = on_the_node("node-exhaust").await;
    // The default install, without `webhook.clientAuth`: nobody is asked for a client certificate,
    // so the attackers' reviews reach the handler (with it, a pod without the apiserver's
    // certificate gets no further than the handshake).
    let values = vec![
        ("webhook.replicas", json!(1)),
        ("webhook.podDisruptionBudget.enabled", json!(false)),
    ];
    let release = Release::install_and_wait("projection-ex", system.name(), &values);
    let name = format!("{}-webhook", release.name);
    wait_ca_bundles_set(&name).await;
    let ca_file = testenv_dir().join(format!("exhaust-{}.crt", system.name()));
    std::fs::write(&ca_file, &decoded_ca_bundles(&name)[0]).expect("write the webhook's CA");
    let webhook = pods(&release.namespace, &selector(&release.name, "webhook"));
    assert_eq!(webhook.len(), 1, "one webhook pod");
    let webhook = &webhook[0];
    let (pod, ip, pid) = (
        pod_name(webhook),
        webhook["status"]["podIP"].as_str().expect("pod IP").to_owned(),
        container_pid(webhook),
    );
    let before = cgroup_memory(pid);
    assert_eq!(
        before.limit, MEMORY_LIMIT,
        "the chart's memory limit is in force for {pod}"
    );
    let rss_before = peak_rss(pid);

    let team = TestNamespace::create(&client, "node-exhaust-team").await;
    let attackers = TestNamespace::create(&client, "node-exhaust-attackers").await;
    let address = format!("{ip}:9443");
    let server_name = format!("{name}.{}.svc", release.namespace);
    let lanes: [(&str, &[&str]); 3] = [
        ("strings", &["--silent", "0", "--half-headers", "0"]),
        ("dense", &["--silent", "0", "--half-headers", "0", "--dense"]),
        ("stalled", &["--connections", "0"]),
    ];
    let mut attacks = Vec::new();
    for (lane, flags) in lanes {
        let attacker = attacker_pod(attackers.name(), &format!("attacker-{lane}"));
        assert_ne!(attacker["status"]["podIP"], json!(null));
        let mut command = std::process::Command::new("nsenter");
        command
            .args(["-t", &container_pid(&attacker).to_string(), "-n"])
            .arg(env!("CARGO_BIN_EXE_webhook-exhaust"))
            .args(["--address", &address, "--server-name", &server_name])
            .arg("--ca-file")
            .arg(&ca_file)
            .args([
                "--duration",
                &format!("{}s", ATTACK.as_secs()),
                "--probe-every",
                "1s",
            ])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        attacks.push((lane, command.spawn().expect("nsenter runs the attack")));
    }

    // The apiserver's writes during the attack, each through the webhook pod (failurePolicy Fail:
    // a review that gets no answer fails the write). Bounded in count and by the attack's end.
    let started = Instant::now();
    let (mut refused, mut admitted, mut failures, mut slowest) = (0, 0, Vec::new(), Duration::ZERO);
    let ns = team.name();
    for i in 0..200 {
        if started.elapsed() >= ATTACK {
            break;
        }
        let t = Instant::now();
        let bad = apply(&format!(
            "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: bad, namespace: {ns}}}\n\
             spec:\n  source: {{version: v1, kind: Namespace, namespace: default, name: default}}\n"
        ));
        let err = stderr(&bad);
        if !bad.status.success() && err.contains("denied the request") && err.contains("cluster-scoped") {
            refused += 1;
        } else {
            failures.push(format!("bad spec {i}: exit {}: {err}", bad.status));
        }
        let good = apply(&format!(
            "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: during-attack-{i}, namespace: {ns}}}\n\
             spec:\n  source: {{kind: ConfigMap, namespace: default, name: not-there}}\n"
        ));
        let author = kubectl(&[
            "-n",
            ns,
            "get",
            "projection",
            &format!("during-attack-{i}"),
            "-o",
            "jsonpath={.metadata.annotations.projection\\.sh/author}",
        ]);
        let author = String::from_utf8_lossy(&author.stdout).into_owned();
        if good.status.success() && author.contains("projection-testenv-admin") {
            admitted += 1;
        } else {
            failures.push(format!(
                "good spec {i}: exit {}, author {author:?}: {}",
                good.status,
                stderr(&good)
            ));
        }
        slowest = slowest.max(t.elapsed());
    }
    let outcomes = attack_summaries(attacks);
    let after = cgroup_memory(pid);
    let rss_peak = peak_rss(pid);
    let mib = |b: u64| b / (1024 * 1024);
    eprintln!(
        "webhook pod {pod} ({ip}) under attack for {ATTACK:?}: peak RSS {} MiB (before {} MiB), cgroup peak \
         {} MiB of a {} MiB limit, limit hit {} times; during it {refused} bad specs refused and {admitted} \
         Projections admitted by the webhook, {} failed, slowest pair of writes {slowest:?}; attacks: {outcomes:?}",
        mib(rss_peak),
        mib(rss_before),
        mib(after.peak),
        mib(after.limit),
        after.limit_hit,
        failures.len(),
    );
    for (lane, summary) in &outcomes[..2] {
        let answered: u64 = summary["large_answered"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        assert!(
            answered > 0,
            "the {lane} attack never got a large review through: it proves nothing ({summary})"
        );
    }
    assert!(
        failures.is_empty(),
        "{} writes got no answer from the webhook during the attack:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        refused >= 3 && admitted >= 3,
        "too few writes during the attack to show anything: {refused} refused, {admitted} admitted"
    );
    assert!(
        rss_peak < MEMORY_LIMIT && after.peak < MEMORY_LIMIT && after.limit_hit == before.limit_hit,
        "the webhook reached its memory limit: peak RSS {} MiB, cgroup {after:?}",
        mib(rss_peak)
    );
    let now = pods(&release.namespace, &selector(&release.name, "webhook"));
    assert_eq!(
        now.iter().map(pod_name).collect::<Vec<_>>(),
        std::slice::from_ref(&pod),
        "the same pod serves"
    );
    let status = &now[0]["status"]["containerStatuses"][0];
    assert_eq!(
        status["restartCount"],
        json!(0),
        "the webhook restarted: {status}"
    );
    assert_eq!(container_pid(&now[0]), pid, "the webhook's process was replaced");

    let _ = std::fs::remove_file(&ca_file);
    for ns in [attackers, team] {
        ns.delete_and_wait(&client).await;
    }
    release.uninstall();
    system.delete_and_wait(&client).await;
}

/// The source address this host's processes (the apiserver among them) use towards `ip`: what
/// the kernel's routing picks (`ip route get`), e.g. the pod bridge's address for a pod.
fn host_source_address(ip: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-o", "route", "get", ip])
        .output()
        .expect("ip route get");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == "src")
        .and_then(|_| words.next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no source address towards {ip}: {text}"))
}

/// Issue 35's starvation attacks against the chart's webhook pod on the node, both at once, from
/// pods (pod addresses, as any workload of the cluster): one pod with 2 HTTP/2 connections of 64
/// reviews whose small body trickles a byte every 100 ms, and five pods each holding 64 idle
/// connections (320, more than the pod's cap of 256). The release lists the apiserver's source
/// address towards pods (apiServer.cidrs: on this node the pod bridge's address, which `ip route
/// get` confirms). While the attacks run, 20 spec changes of a Projection through the apiserver
/// (`failurePolicy: Fail`, `timeoutSeconds: 10`) must each be admitted within the timeout.
///
/// Fails on 987fb69's webhook: there a small review took its unit at its headers, a connection
/// had 100 streams and a body 10 s, so the 128 slow reviews held all 64 units and the apiserver's
/// reviews were shed (429) until its timeout; and the 320 idle connections filled the cap, so a
/// new apiserver connection waited in the listen queue.
#[tokio::test]
async fn webhook_pod_under_slow_body_and_idle_attacks_admits_twenty_spec_changes() {
    const ATTACK: Duration = Duration::from_secs(45);
    const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
    let _cores = projection_tests::cores_alone().await;
    let (_serial, client, system) = on_the_node("node-starve").await;
    // Where the apiserver's calls to pods come from: the host's source address towards the pod
    // network (any address of it: the route is the bridge's).
    let pod_network: std::net::Ipv4Addr = POD_CIDR
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("pod CIDR");
    let apiserver = format!(
        "{}/32",
        host_source_address(&std::net::Ipv4Addr::from(u32::from(pod_network) + 2).to_string())
    );
    let values = vec![
        ("webhook.replicas", json!(1)),
        ("webhook.podDisruptionBudget.enabled", json!(false)),
        ("apiServer.cidrs", json!([apiserver])),
    ];
    let release = Release::install_and_wait("projection-st", system.name(), &values);
    let name = format!("{}-webhook", release.name);
    wait_ca_bundles_set(&name).await;
    let webhook = pods(&release.namespace, &selector(&release.name, "webhook"));
    assert_eq!(webhook.len(), 1, "one webhook pod");
    let webhook = &webhook[0];
    let flags = webhook["spec"]["containers"][0]["args"].to_string();
    assert!(
        flags.contains(&format!("--apiserver-cidrs={apiserver}")),
        "{flags}"
    );
    let policy: Value = serde_json::from_str(&kubectl_ok(&[
        "-n",
        &release.namespace,
        "get",
        "networkpolicy",
        &name,
        "-o",
        "json",
    ]))
    .expect("policy JSON");
    let from = &policy["spec"]["ingress"][0]["from"];
    assert!(
        from.as_array()
            .is_some_and(|peers| peers.contains(&json!({"ipBlock": {"cidr": apiserver}}))),
        "the admission port only from the apiserver's addresses: {from}"
    );
    let (pod, ip) = (
        pod_name(webhook),
        webhook["status"]["podIP"].as_str().expect("pod IP").to_owned(),
    );
    let ca_file = testenv_dir().join(format!("starve-{}.crt", system.name()));
    std::fs::write(&ca_file, &decoded_ca_bundles(&name)[0]).expect("write the webhook's CA");

    let team = TestNamespace::create(&client, "node-starve-team").await;
    let ns = team.name();
    let projection = |n: usize| {
        format!(
            "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: edited, namespace: {ns}}}\n\
             spec:\n  source: {{kind: ConfigMap, namespace: default, name: settings-{n}}}\n"
        )
    };
    let out = apply(&projection(0));
    assert!(out.status.success(), "{}", stderr(&out));

    let attackers = TestNamespace::create(&client, "node-starve-attackers").await;
    let address = format!("{ip}:9443");
    let server_name = format!("{name}.{}.svc", release.namespace);
    let mut lanes: Vec<(String, Vec<&str>)> = vec![(
        "slow".to_owned(),
        vec![
            "--mode",
            "slow-bodies",
            "--connections",
            "2",
            "--streams-per-connection",
            "64",
        ],
    )];
    for n in 1..=5 {
        lanes.push((format!("idle-{n}"), vec!["--mode", "idle", "--per-source", "64"]));
    }
    // Every attacker pod first; then the slow bodies, in place once the pod has cut some (their
    // two connections are then held), then the idle connections, which fill what is left.
    let pids: Vec<u32> = lanes
        .iter()
        .map(|(lane, _)| container_pid(&attacker_pod(attackers.name(), &format!("attacker-{lane}"))))
        .collect();
    let metric = |sample: &str| {
        projection_tests::http_get_from(&ip, 8080, "/metrics", None)
            .and_then(|(_, _, body)| projection_tests::metric_value(&body, sample))
            .unwrap_or(0.0)
    };
    let reserved = "projection_webhook_connection_limit_hits_total{limit=\"reserved_for_apiserver\"}";
    let cut = "projection_webhook_errors_total{category=\"timeout\"}";
    let mut attacks = Vec::new();
    let started = Instant::now();
    for ((lane, flags), pid) in lanes.iter().zip(pids) {
        let mut command = std::process::Command::new("nsenter");
        command
            .args(["-t", &pid.to_string(), "-n"])
            .arg(env!("CARGO_BIN_EXE_webhook-exhaust"))
            .args(["--address", &address, "--server-name", &server_name])
            .arg("--ca-file")
            .arg(&ca_file)
            .args(["--duration", &format!("{}s", ATTACK.as_secs())])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        attacks.push((lane.clone(), command.spawn().expect("nsenter runs the attack")));
        if lane == "slow" {
            wait_for("the slow bodies to be cut", Duration::from_secs(20), || async {
                let c = metric(cut);
                if c > 0.0 {
                    Ok(())
                } else {
                    Err(format!("body timeouts {c}"))
                }
            })
            .await;
        }
    }

    // In place: every connection other addresses may use is held (the pod closed a connection
    // because only the apiserver's room was left), and slow bodies were cut by the body timeout.
    wait_for("the attacks to be in place", Duration::from_secs(30), || async {
        let (r, c) = (metric(reserved), metric(cut));
        if r > 0.0 && c > 0.0 {
            Ok(())
        } else {
            Err(format!("reserved_for_apiserver {r}, body timeouts {c}"))
        }
    })
    .await;
    let in_place_after = started.elapsed();

    // 20 spec changes through the apiserver, each within the webhook's timeout.
    let mut changes = Vec::new();
    for n in 1..=20 {
        let t = Instant::now();
        let out = apply(&projection(n));
        let took = t.elapsed();
        let source = kubectl(&[
            "-n",
            ns,
            "get",
            "projection",
            "edited",
            "-o",
            "jsonpath={.spec.source.name}",
        ]);
        changes.push((
            n,
            out.status.success(),
            String::from_utf8_lossy(&source.stdout).into_owned(),
            took,
            stderr(&out),
        ));
    }
    let during = started.elapsed();
    let (reserved_hits, cut_hits) = (metric(reserved), metric(cut));
    let outcomes = attack_summaries(attacks);
    eprintln!(
        "webhook pod {pod} ({ip}), apiserver {apiserver}: attacks in place after {in_place_after:?}, 20 spec \
         changes done {during:?} after the start (attack {ATTACK:?}), slowest {:?}; connections closed for the \
         apiserver's room {reserved_hits}, slow bodies cut {cut_hits}; attacks: {outcomes:?}",
        changes.iter().map(|c| c.3).max()
    );
    assert!(
        during < ATTACK,
        "the spec changes outlasted the attack: {during:?}"
    );
    for (n, ok, source, took, err) in &changes {
        assert!(
            *ok && *source == format!("settings-{n}") && *took <= WEBHOOK_TIMEOUT,
            "spec change {n} was not admitted within {WEBHOOK_TIMEOUT:?}: exit ok {ok}, source {source:?}, \
             took {took:?}: {err}"
        );
    }
    let held: u64 = outcomes
        .iter()
        .filter(|(lane, _)| lane.starts_with("idle"))
        .filter_map(|(_, s)| s["held"].as_u64())
        .sum();
    assert!(held >= 192, "the idle attack held only {held} connections");
    let now = pods(&release.namespace, &selector(&release.name, "webhook"));
    assert_eq!(
        now[0]["status"]["containerStatuses"][0]["restartCount"],
        json!(0),
        "the webhook restarted"
    );

    let _ = std::fs::remove_file(&ca_file);
    for ns in [attackers, team] {
        ns.delete_and_wait(&client).await;
    }
    release.uninstall();
    system.delete_and_wait(&client).await;
}

/// Waits for each attack of the load tool (run by `nsenter` in a pod's network) to end by itself,
/// and returns its lane with the JSON summary it prints last; panics on a failed attack.
fn attack_summaries<L: std::fmt::Display>(attacks: Vec<(L, std::process::Child)>) -> Vec<(L, Value)> {
    attacks
        .into_iter()
        .map(|(lane, attack)| {
            let out = attack.wait_with_output().expect("the attack ends by itself");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "the {lane} attack failed: {}\n{text}",
                String::from_utf8_lossy(&out.stderr)
            );
            let summary: Value = serde_json::from_str(text.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("the {lane} attack's summary: {e}\n{text}"));
            (lane, summary)
        })
        .collect()
}
