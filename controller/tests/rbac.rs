//! The controller running as a ServiceAccount whose ClusterRole mirrors the chart's, with
//! `supportedKinds` narrowed to ConfigMaps: a Projection of a Secret must say at once, in its
//! conditions and an event, that the operator's RBAC does not cover Secrets, while ConfigMaps are
//! mirrored; granting Secrets lets it recover.

use k8s_openapi::api::{
    core::v1::{ConfigMap, PodTemplate, Secret},
    rbac::v1::ClusterRole,
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use projection_tests::{ServiceProcess, events_about, http_get, metric_value, wait_for, wait_for_event};
use serde_json::json;
use shared::api::crd::{ClusterProjection, Projection};
use std::time::Duration;

mod common;
use common::{account::ControllerAccount, *};

#[tokio::test]
async fn a_kind_outside_the_controllers_rbac_is_reported_at_once() {
    let env = env("rbac").await;
    let (src, dst) = env.names();
    // The controller's own namespace: its ServiceAccount and (as in the chart) its Lease Role.
    let account = ControllerAccount::create(&env, "rbac-home", &["configmaps"]).await;
    assert_eq!(account.can_i("list", "configmaps"), "yes");

    let mut controller = leader_as(&account, "5s").await;

    create(
        &env.api::<Secret>(&src),
        json!({"metadata": {"name": "tls", "annotations": opted_in()}, "stringData": {"key": "v"}}),
    )
    .await;
    source_configmap(&env.api::<ConfigMap>(&src), "settings", json!({"a": "1"})).await;
    let projections = env.projections();
    let started = std::time::Instant::now();
    create(
        &projections,
        projection(
            "tls",
            json!({"version": "v1", "kind": "Secret", "namespace": src, "name": "tls"}),
            json!({}),
        ),
    )
    .await;
    env.project_configmap("settings", "settings", json!({})).await;

    let ready = wait_not_ready(&projections, "tls", "SourceForbidden").await;
    let elapsed = started.elapsed();
    let message = ready["message"].as_str().unwrap_or_default().to_owned();
    for part in [
        "the controller may not list and watch secrets in all namespaces",
        "its RBAC does not cover secrets (Helm value supportedKinds",
        "secrets is forbidden: User \"system:serviceaccount:",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    // The apiserver's own words: a watch streaming its initial objects is refused its watch, one
    // listing them (--initial-list=list, or a cluster without WatchList) its list.
    assert!(
        message.contains("cannot watch resource \"secrets\"")
            || message.contains("cannot list resource \"secrets\""),
        "{message}"
    );
    assert!(!message.contains("Status {"), "{message}");
    assert!(
        elapsed < Duration::from_secs(10),
        "reported after {elapsed:?}, not after a 30 s sync timeout"
    );
    let source_resolved = wait_condition(
        &projections,
        "tls",
        "SourceResolved",
        "False",
        Some("SourceForbidden"),
    )
    .await;
    assert_eq!(source_resolved["message"], ready["message"]);
    let note = wait_for_event(&env.client, &dst, "tls", "SourceForbidden").await;
    assert_eq!(note, message, "the event says what the condition says");
    let event = events_about(&env.client, &dst, "tls")
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("SourceForbidden"))
        .expect("the event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // ConfigMaps are covered and mirrored in the same run.
    wait_ready(&projections, "settings").await;
    let copy = env.api::<ConfigMap>(&dst).get("settings").await.expect("copy");
    assert_eq!(data_of(&copy), json!({"a": "1"}));
    controller
        .metrics_once_counted(&["projection_reconcile_total{kind=\"Projection\",result=\"source_error\"}"])
        .await;

    // A cluster admin adds Secrets (supportedKinds): the Projection follows on its next retry.
    account.grant(&["configmaps", "secrets"]).await;
    wait_ready(&projections, "tls").await;
    let copy = env.api::<Secret>(&dst).get("tls").await.expect("secret copy");
    assert!(copy.data.is_some_and(|d| d.contains_key("key")));

    // Taken away again mid-run, with the watches of Secrets already running: the next edit of the
    // source cannot be read. The Projection says so, retries with a growing delay (one INFO line
    // per retry, no WARN flood) and follows the grant again without a restart.
    account.grant(&["configmaps"]).await;
    wait_for("Secrets to be refused to the controller", TIMEOUT, || async {
        let answer = account.can_i("get", "secrets");
        (answer == "no").then_some(()).ok_or(answer)
    })
    .await;
    let loud_before = loud_lines_about(&controller, "tls");
    merge(
        &env.api::<Secret>(&src),
        "tls",
        json!({"stringData": {"key": "v2"}}),
    )
    .await;
    let refused = wait_not_ready(&projections, "tls", "SourceForbidden").await;
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("secrets \"tls\" is forbidden")),
        "{refused}"
    );
    let name = format!("{dst}/tls");
    wait_retry_delay(&controller, &name, "2s").await;
    let retries = retries_of(&controller, &name);
    let loud = loud_lines_about(&controller, "tls") - loud_before;
    assert!(
        loud <= 2,
        "{loud} WARN/ERROR lines about the refused source; retries: {retries:?}"
    );

    account.grant(&["configmaps", "secrets"]).await;
    wait_object(
        &env.api::<Secret>(&dst),
        "tls",
        "the copy with the edit made while refused",
        |copy: &Secret| {
            copy.data
                .as_ref()
                .and_then(|d| d.get("key"))
                .is_some_and(|v| v.0 == b"v2")
        },
    )
    .await;
    wait_ready(&projections, "tls").await;
    assert!(controller.is_running(), "no restart needed");

    env.finish().await;
    drop(controller);
    account.home.delete_and_wait(&env.client).await;
}

/// `supportedKinds` narrowed after copies of a kind exist: deleting a Projection cannot remove its
/// copy (the controller's GET is refused, 403), so the finalizer holds it. Never silently: the
/// Projection says `Ready=False` `DeletionBlocked`, naming the copy, the kind and the refusal, and
/// the exact command that releases it, with a Warning event. That command releases one Projection
/// (its copy stays behind); giving the access back completes the deletion of the other.
#[tokio::test]
async fn a_deletion_blocked_by_narrowed_rbac_says_why_and_how_to_release_it() {
    let env = env("rbac-blocked").await;
    let (src, dst) = env.names();
    let account = ControllerAccount::create(&env, "rbac-blocked-home", &["configmaps", "secrets"]).await;
    let mut controller = leader_as(&account, "2s").await;

    let projections = env.projections();
    for name in ["tls", "kept"] {
        create(
            &env.api::<Secret>(&src),
            json!({"metadata": {"name": name, "annotations": opted_in()}, "stringData": {"key": "v"}}),
        )
        .await;
        create(
            &projections,
            projection(
                name,
                json!({"version": "v1", "kind": "Secret", "namespace": src, "name": name}),
                json!({}),
            ),
        )
        .await;
        wait_ready(&projections, name).await;
    }

    account.grant(&["configmaps"]).await;
    wait_for("Secrets to be refused to the controller", TIMEOUT, || async {
        let answer = account.can_i("get", "secrets");
        (answer == "no").then_some(()).ok_or(answer)
    })
    .await;
    let copies = env.api::<Secret>(&dst);
    let mut commands = Vec::new();
    for name in ["tls", "kept"] {
        delete(&projections, name).await;
        let blocked = wait_not_ready(&projections, name, "DeletionBlocked").await;
        let message = blocked["message"].as_str().unwrap_or_default().to_owned();
        for part in [
            "deletion is blocked: the copies could not be removed: Secret ".to_owned(),
            format!("secrets \"{name}\" is forbidden"),
            "give the controller back access to that kind, Helm value supportedKinds".to_owned(),
            format!(
                "remove the finalizer by hand: kubectl patch projection {name} -n {dst} --type=json -p '"
            ),
        ] {
            assert!(message.contains(&part), "{part:?} not in {message:?}");
        }
        let note = wait_for_event(&env.client, &dst, name, "DeletionBlocked").await;
        assert_eq!(note, message, "the event says what the condition says");
        let event = events_about(&env.client, &dst, name)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("DeletionBlocked"))
            .expect("the event");
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let held = projections.get(name).await.expect("held by its finalizer");
        assert!(held.metadata.deletion_timestamp.is_some());
        assert!(
            copies.get_opt(name).await.expect("get").is_some(),
            "the copy is still there"
        );
        let command = message
            .split_once("remove the finalizer by hand: kubectl ")
            .map(|(_, c)| c.to_owned())
            .expect("the command");
        commands.push(command);
    }

    // The command in the message, as a person would paste it: the Projection goes, its copy stays.
    let (args, patch) = commands[1].split_once(" -p '").expect("-p '<patch>'");
    let patch = patch.strip_suffix('\'').expect("quoted patch");
    let mut argv: Vec<&str> = args.split_whitespace().collect();
    argv.extend(["-p", patch]);
    projection_tests::kubectl_ok(&argv);
    wait_gone(&projections, "kept").await;
    assert!(
        copies.get_opt("kept").await.expect("get").is_some(),
        "a copy left behind by a hand-removed finalizer stays"
    );

    // Access given back: the next retry removes the copy, then the finalizer.
    account.grant(&["configmaps", "secrets"]).await;
    wait_gone(&copies, "tls").await;
    wait_gone(&projections, "tls").await;
    assert!(controller.is_running());

    env.finish().await;
    drop(controller);
    account.home.delete_and_wait(&env.client).await;
}

/// The same for a ClusterProjection, whose copies are found through the cache of its kind's copies
/// (its watch is refused after the narrowing) and whose events are in `default`.
#[tokio::test]
async fn a_cluster_projection_whose_copies_cannot_be_removed_says_so() {
    let env = env("rbac-blocked-cp").await;
    let (src, dst) = env.names();
    let account = ControllerAccount::create(&env, "rbac-blocked-cp-home", &["configmaps", "secrets"]).await;
    let mut controller = leader_as(&account, "2s").await;
    create(
        &env.api::<Secret>(&src),
        json!({"metadata": {"name": "shared", "annotations": opted_in()}, "stringData": {"key": "v"}}),
    )
    .await;
    let cps: Api<ClusterProjection> = Api::all(env.client.clone());
    let name = format!("{dst}-blocked");
    let _guard = projection_tests::ClusterScopedGuard::new("clusterprojections", &name);
    create_cluster_projection(
        &cps,
        &name,
        json!({"source": {"version": "v1", "kind": "Secret", "namespace": src, "name": "shared"},
               "destination": {"namespaces": [dst]}}),
    )
    .await;
    let ready_with = |status: &'static str, reason: &'static str| {
        let cps = cps.clone();
        let name = name.clone();
        async move {
            wait_for(&format!("{name} Ready={status} {reason}"), TIMEOUT, || async {
                let cp = cps.get(&name).await.map_err(|e| e.to_string())?;
                let conditions = cp.status.map(|s| s.copy.conditions).unwrap_or_default();
                match condition(&conditions, "Ready") {
                    Some(c) if c.status == status && c.reason == reason => Ok(c.message.clone()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
        }
    };
    ready_with("True", "Projected").await;
    let copies = env.api::<Secret>(&dst);
    assert!(copies.get_opt("shared").await.expect("get").is_some());

    account.grant(&["configmaps"]).await;
    wait_for("Secrets to be refused to the controller", TIMEOUT, || async {
        let answer = account.can_i("list", "secrets");
        (answer == "no").then_some(()).ok_or(answer)
    })
    .await;
    delete(&cps, &name).await;
    let message = ready_with("False", "DeletionBlocked").await;
    for part in [
        "deletion is blocked: the copies could not be removed: ".to_owned(),
        "Secret".to_owned(),
        "forbidden".to_owned(),
        format!("remove the finalizer by hand: kubectl patch clusterprojection {name} --type=json -p '"),
        r#""value":"projection.sh/cluster-finalizer""#.to_owned(),
    ] {
        assert!(message.contains(&part), "{part:?} not in {message:?}");
    }
    let note = wait_for_event(&env.client, "default", &name, "DeletionBlocked").await;
    assert_eq!(note, message, "the event says what the condition says");
    assert!(
        copies.get_opt("shared").await.expect("get").is_some(),
        "the copy is still there"
    );

    account.grant(&["configmaps", "secrets"]).await;
    wait_gone(&copies, "shared").await;
    wait_gone(&cps, &name).await;
    assert!(controller.is_running());

    env.finish().await;
    drop(controller);
    account.home.delete_and_wait(&env.client).await;
}

/// A Projection whose finalizer is removed by hand (here while its deletion is blocked) never
/// completes the controller's cleanup, yet what the controller kept about it goes when the CR watch
/// reports it deleted: the watches of the kind it alone read stop (`projection_watched_gvks`).
///
/// The controller reconciles every CR of the cluster, also those other people left there (the
/// demo's), and those it may not read are retried with backoff, starting and stopping watches of
/// their kinds at any time: what this test asserts is scoped to the kind only it names
/// (PodTemplate), by the controller's log lines about that kind; the gauges are compared exactly
/// only on a cluster with no CR of anyone else.
#[tokio::test]
async fn a_projection_released_by_hand_is_forgotten() {
    let env = env("rbac-forgotten").await;
    let (src, _) = env.names();
    let alone = foreign_crs(&env).await == 0;
    let account =
        ControllerAccount::create(&env, "rbac-forgotten-home", &["configmaps", "podtemplates"]).await;
    let controller = leader_as(&account, "2s").await;
    let watched = |controller: &ServiceProcess| {
        let text = controller.metrics();
        (
            metric_value(&text, "projection_watched_gvks").unwrap_or(-1.0),
            metric_value(&text, "projection_watched_dest_gvks").unwrap_or(-1.0),
        )
    };
    // The controller's log lines with `message` about the kind PodTemplate.
    let about_pod_templates =
        |controller: &ServiceProcess, message: &str| lines_about_kind(controller, message, "/PodTemplate");
    let before = watched(&controller);
    create(
        &env.api::<PodTemplate>(&src),
        json!({"metadata": {"name": "tls", "annotations": opted_in()},
               "template": {"spec": {"containers": [{"name": "c", "image": "local.test/none"}]}}}),
    )
    .await;
    let projections = env.projections();
    create(
        &projections,
        projection(
            "tls",
            json!({"version": "v1", "kind": "PodTemplate", "namespace": src, "name": "tls"}),
            json!({}),
        ),
    )
    .await;
    wait_ready(&projections, "tls").await;
    assert_eq!(
        about_pod_templates(&controller, "watching kind"),
        1,
        "PodTemplates are watched"
    );
    let reading = watched(&controller);
    if alone {
        assert_eq!(
            reading,
            (before.0 + 1.0, before.1 + 1.0),
            "PodTemplates and their copies are watched"
        );
    }

    account.grant(&["configmaps"]).await;
    wait_for(
        "PodTemplates to be refused to the controller",
        TIMEOUT,
        || async {
            let answer = account.can_i("get", "podtemplates");
            (answer == "no").then_some(()).ok_or(answer)
        },
    )
    .await;
    delete(&projections, "tls").await;
    wait_not_ready(&projections, "tls", "DeletionBlocked").await;
    let stopped = "stopped the watches of kind: no CR reads it any more";
    assert_eq!(
        about_pod_templates(&controller, stopped),
        0,
        "still read while the Projection waits"
    );
    if alone {
        assert_eq!(
            watched(&controller),
            reading,
            "still read while the Projection waits"
        );
    }
    merge(&projections, "tls", json!({"metadata": {"finalizers": null}})).await;
    wait_gone(&projections, "tls").await;
    wait_for("the watches nobody reads any more to stop", TIMEOUT, || async {
        let now = watched(&controller);
        let stopped = about_pod_templates(&controller, stopped) == 1;
        (stopped && (!alone || now == before))
            .then_some(())
            .ok_or_else(|| format!("PodTemplate watches stopped: {stopped}; watched (sources, copies) = {now:?}, before {before:?}"))
    })
    .await;

    env.finish().await;
    drop(controller);
    account.home.delete_and_wait(&env.client).await;
}

/// Waits until `name` no longer exists at all (not merely Terminating, as `wait_absent` accepts).
async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{name} gone"), TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(o)) => Err(format!("still there: {:?}", o.meta().finalizers)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// A replica whose CR watches never sync (here its ClusterRole grants nothing) is not ready, and
/// SIGTERM still stops it at once: kube's controller would hold its shutdown until the caches
/// synced, and the pod would wait for its kill.
#[tokio::test]
async fn a_replica_that_cannot_list_the_crs_is_not_ready_and_stops_on_sigterm() {
    let env = env("rbac-unsynced").await;
    let account = ControllerAccount::create(&env, "rbac-unsynced-home", &["configmaps"]).await;
    Api::<ClusterRole>::all(env.client.clone())
        .patch(
            &account.role_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": []})),
        )
        .await
        .expect("ClusterRole emptied");
    wait_for("Projections to be refused to the controller", TIMEOUT, || async {
        let answer = account.can_i("list", "projections.projection.sh");
        (answer == "no").then_some(()).ok_or(answer)
    })
    .await;

    let mut controller =
        ServiceProcess::start_as(binary(), &["--author-access=trusted"], &account.kubeconfig, &[]);
    let port = controller.http_port;
    wait_for("the controller's /healthz", TIMEOUT, || async {
        match http_get(port, "/healthz") {
            Some((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Its CR watches are refused (403) over and over: it never becomes ready.
    wait_for("a refused watch in the controller's log", TIMEOUT, || async {
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        if log.contains("is forbidden") {
            Ok(())
        } else {
            Err(String::from("not yet"))
        }
    })
    .await;
    assert_eq!(http_get(port, "/readyz").map(|(code, _)| code), Some(503));

    let status = controller.terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status after SIGTERM (None: still running 10 s later): {status:?}"
    );
    drop(controller);
    env.finish().await;
    account.home.delete_and_wait(&env.client).await;
}

/// The controller as the account's ServiceAccount, leader-elected in its namespace, retrying every
/// `requeue` at most; it trusts its own access (these tests are about its RBAC, not the author's).
async fn leader_as(account: &ControllerAccount, requeue: &str) -> ServiceProcess {
    account
        .start_controller(&["--author-access=trusted", "--requeue-interval", requeue])
        .await
}

/// How many Projections and ClusterProjections the cluster holds before this test creates any:
/// those of other tests or people, which the test's controller reconciles too.
async fn foreign_crs(env: &Env) -> usize {
    let projections = Api::<Projection>::all(env.client.clone())
        .list(&Default::default())
        .await
        .expect("listing Projections");
    let clusters = Api::<ClusterProjection>::all(env.client.clone())
        .list(&Default::default())
        .await
        .expect("listing ClusterProjections");
    projections.items.len() + clusters.items.len()
}
