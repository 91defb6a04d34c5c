//! The services' Kubernetes client against the real apiserver behind a path that goes silent: a
//! request or a watch on a connection that accepts and never answers fails within the client's
//! timeouts instead of hanging, and the client works again once the path is back.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{ListParams, WatchParams},
};
use projection_tests::{black_hole::BlackHoleProxy, test_config, wait_for};
use runtime::kube_client::{Timeouts, client_with_timeouts};
use std::time::{Duration, Instant};

/// Short enough for a test; the point is that there is one.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(2),
    response: Duration::from_secs(2),
    read: Duration::from_secs(2),
    write: Duration::from_secs(2),
    ping_interval: Duration::from_secs(2),
    ping_timeout: Duration::from_secs(2),
};

/// Far beyond every timeout above: reaching it means the client hangs.
const HANG: Duration = Duration::from_secs(30);

/// A client that reaches the apiserver through a black-hole proxy.
async fn client_through_proxy() -> (Client, BlackHoleProxy) {
    client_through_proxy_with(TIMEOUTS).await
}

/// [`client_through_proxy`] with the given timeouts.
async fn client_through_proxy_with(timeouts: Timeouts) -> (Client, BlackHoleProxy) {
    let mut config = test_config()
        .await
        .expect("the local control plane's kubeconfig (start it with tests/control-plane/up.sh)");
    let upstream = projection_tests::apiserver_addr()
        .await
        .expect("the apiserver's address resolves");
    let proxy = BlackHoleProxy::start(upstream).await.expect("proxy listens");
    config.cluster_url = format!("https://{}", proxy.addr()).parse().expect("URL");
    let client = client_with_timeouts(config, timeouts).expect("client");
    (client, proxy)
}

async fn list_namespaces(client: &Client) -> Result<usize, kube::Error> {
    let list = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await?;
    Ok(list.items.len())
}

#[tokio::test]
async fn a_request_on_a_silent_path_fails_within_the_timeout_and_the_client_recovers() {
    let (client, proxy) = client_through_proxy().await;
    list_namespaces(&client)
        .await
        .expect("a request through the open path");

    // The pooled connection stays open but nothing comes back: only a timeout can end the wait.
    proxy.black_hole();
    let start = Instant::now();
    let outcome = tokio::time::timeout(HANG, list_namespaces(&client)).await;
    let waited = start.elapsed();
    let error = outcome
        .unwrap_or_else(|_| panic!("the request still hung after {HANG:?} on a black-holed connection"))
        .expect_err("nothing can come back through a black hole");
    assert!(
        waited < Duration::from_secs(10),
        "the request failed only after {waited:?} ({error})"
    );

    proxy.restore();
    wait_for(
        "a request through the restored path",
        Duration::from_secs(15),
        || async { list_namespaces(&client).await.map_err(|e| e.to_string()) },
    )
    .await;
}

/// Opens a watch through a proxy with `timeouts`, black-holes the path, and returns how long the
/// watch took to end in an error (panicking if it did not end, or ended otherwise).
async fn silent_watch_ends_after(timeouts: Timeouts) -> Duration {
    let (client, proxy) = client_through_proxy_with(timeouts).await;
    let namespaces = Api::<Namespace>::all(client.clone());
    let version = namespaces
        .list(&ListParams::default().limit(1))
        .await
        .expect("list through the open path")
        .metadata
        .resource_version
        .expect("a list has a resourceVersion");
    // The server would keep this watch open for 290 s: any earlier end is the client's.
    let mut events = namespaces
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .expect("watch through the open path")
        .boxed();

    proxy.black_hole();
    let start = Instant::now();
    let outcome = tokio::time::timeout(HANG, events.try_next()).await;
    let waited = start.elapsed();
    let next = outcome
        .unwrap_or_else(|_| panic!("the watch was still waiting after {HANG:?} on a black-holed connection"));
    assert!(
        next.is_err(),
        "a black-holed watch must end in an error, not {next:?}"
    );
    waited
}

#[tokio::test]
async fn a_watch_on_a_silent_path_ends_within_the_read_timeout() {
    let waited = silent_watch_ends_after(TIMEOUTS).await;
    assert!(
        waited < Duration::from_secs(10),
        "the watch failed only after {waited:?}"
    );
}

/// The client speaks HTTP/2 to the apiserver and pings a silent connection: a dead path ends a watch
/// within the ping interval and timeout even when every other timeout is minutes long (as the
/// read timeout is by default, above the apiserver's one-minute bookmarks). Over HTTP/1.1 this
/// watch would wait the whole read timeout.
#[tokio::test]
async fn a_watch_on_a_silent_path_ends_within_the_ping_timeout() {
    let long = Duration::from_secs(120);
    let waited = silent_watch_ends_after(Timeouts {
        response: long,
        read: long,
        write: long,
        ..TIMEOUTS
    })
    .await;
    assert!(
        waited < Duration::from_secs(10),
        "the watch failed only after {waited:?}: no ping ended the silent connection"
    );
}

#[tokio::test]
async fn a_write_into_a_terminating_namespace_is_recognised_as_such() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use runtime::api_error::{describe, is_namespace_terminating};

    let client = projection_tests::client().await;
    let ns = projection_tests::TestNamespace::create(&client, "terminating").await;
    // A finalizer nobody removes keeps the namespace Terminating until the test lets it go.
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns.name());
    let held: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "held", "finalizers": ["projection.test/hold"]}
    }))
    .expect("configmap");
    configmaps
        .create(&PostParams::default(), &held)
        .await
        .expect("create");
    Api::<Namespace>::all(client.clone())
        .delete(ns.name(), &DeleteParams::default())
        .await
        .expect("delete the namespace");

    let other: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "late"}})).expect("configmap");
    let refusal = wait_for(
        "the namespace to refuse new content",
        Duration::from_secs(30),
        || async {
            match configmaps.create(&PostParams::default(), &other).await {
                Err(e) => Ok(e),
                Ok(_) => Err("created".to_owned()),
            }
        },
    )
    .await;
    assert!(is_namespace_terminating(&refusal), "{refusal}");
    assert!(
        describe(&refusal).contains("because it is being terminated"),
        "{}",
        describe(&refusal)
    );
    assert!(!describe(&refusal).contains("Status {"), "{}", describe(&refusal));
    let forbidden_elsewhere = Api::<Namespace>::all(client.clone())
        .get("projection-test-no-such-namespace")
        .await
        .expect_err("absent");
    assert!(!is_namespace_terminating(&forbidden_elsewhere));

    configmaps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the finalizer");
}
