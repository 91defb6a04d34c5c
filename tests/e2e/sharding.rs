//! The ring of `shared::shard` against the apiserver's sharded list and watch (KEP-5866, feature
//! gate `ShardedListAndWatch`): the second control plane runs with the gate on
//! (`tests/control-plane/remote.sh up`), the first with it off. With it on, a list or watch with a
//! member's `shardSelector` returns exactly the objects our ring gives that member, ConfigMaps and
//! our Projections alike; with it off, the parameter is ignored and everything comes back, which
//! is why a replica always filters on its side too.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{PostParams, WatchEvent},
    core::ObjectList,
};
use projection_tests::{
    TestNamespace, client, install_crds,
    remote::{RemoteNamespace, remote_client},
    sharded_list_and_watch,
};
use serde::de::DeserializeOwned;
use serde_json::json;
use shared::{
    api::crd::Projection,
    shard::{
        HashRange, Ring,
        selector::{ShardFilter, shard_selector},
    },
};
use std::collections::BTreeSet;

/// Three replicas, named as a Deployment's pods are.
fn ring() -> Ring {
    Ring::new([
        "projection-controller-7c9d5b6f4-k2x8q",
        "projection-controller-7c9d5b6f4-p9w3m",
        "projection-controller-7c9d5b6f4-z4r7t",
    ])
}

/// `path` with `shardSelector=selector` (percent-encoded).
fn with_selector(path: &str, selector: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", selector)
        .finish();
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}{query}")
}

/// The names a list returns, of the objects the test made (each namespace also has the
/// `kube-root-ca.crt` ConfigMap of kube-controller-manager).
async fn list_names<K: DeserializeOwned + kube::Resource + Clone>(
    client: &Client,
    path: &str,
) -> BTreeSet<String> {
    let list: ObjectList<K> = client
        .request(http::Request::get(path).body(Vec::new()).expect("request"))
        .await
        .unwrap_or_else(|e| panic!("GET {}: {e}", &path[..path.len().min(200)]));
    list.items
        .iter()
        .map(|item| item.meta().name.clone().expect("a name"))
        .filter(|name| name.starts_with("cm-") || name.starts_with("p-"))
        .collect()
}

fn selector_of(ranges: &[HashRange]) -> String {
    match shard_selector(ranges) {
        ShardFilter::Ranges(selector) => selector,
        other => panic!("a member of three owns part of the space, not {other:?}"),
    }
}

/// Names of `objects` (name, uid) whose uid our ring gives `member`.
fn expected(ring: &Ring, member: &str, objects: &[(String, String)]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|(_, uid)| ring.owner_of(uid) == Some(member))
        .map(|(name, _)| name.clone())
        .collect()
}

async fn create_config_maps(client: &Client, namespace: &str, count: usize) -> Vec<(String, String)> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut created = Vec::new();
    for i in 0..count {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).expect("cm");
        let cm = api
            .create(&PostParams::default(), &cm)
            .await
            .expect("create a ConfigMap");
        created.push((cm.metadata.name.expect("name"), cm.metadata.uid.expect("uid")));
    }
    created
}

async fn create_projections(client: &Client, namespace: &str, count: usize) -> Vec<(String, String)> {
    let api: Api<Projection> = Api::namespaced(client.clone(), namespace);
    let mut created = Vec::new();
    for i in 0..count {
        let projection: Projection = serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": format!("p-{i}"), "namespace": namespace},
            "spec": {"source": {"version": "v1", "kind": "ConfigMap", "namespace": namespace, "name": "cm-0"}},
        }))
        .expect("Projection");
        let projection = api
            .create(&PostParams::default(), &projection)
            .await
            .expect("create a Projection");
        created.push((
            projection.metadata.name.expect("name"),
            projection.metadata.uid.expect("uid"),
        ));
    }
    created
}

#[tokio::test]
async fn with_the_gate_on_the_apiserver_lists_and_watches_exactly_what_our_ring_gives_each_member() {
    let remote = remote_client().await;
    assert!(
        sharded_list_and_watch(&remote).await,
        "the second control plane runs without ShardedListAndWatch: restart it with \
         `tests/control-plane/remote.sh down && tests/control-plane/remote.sh up`"
    );
    install_crds(&remote).await;
    let namespace = RemoteNamespace::create(&remote, "shard").await;
    let ns = namespace.name();
    let config_maps = create_config_maps(&remote, ns, 150).await;
    let projections = create_projections(&remote, ns, 90).await;

    let ring = ring();
    let (mut all_config_maps, mut all_projections) = (BTreeSet::new(), BTreeSet::new());
    for member in ring.members() {
        let selector = selector_of(&ring.ranges_of(member));
        let listed = list_names::<ConfigMap>(
            &remote,
            &with_selector(&format!("/api/v1/namespaces/{ns}/configmaps"), &selector),
        )
        .await;
        assert_eq!(
            listed,
            expected(&ring, member, &config_maps),
            "ConfigMaps of {member}"
        );
        let listed = list_names::<Projection>(
            &remote,
            &with_selector(
                &format!("/apis/projection.sh/v1/namespaces/{ns}/projections"),
                &selector,
            ),
        )
        .await;
        let mine = expected(&ring, member, &projections);
        assert!(!mine.is_empty(), "{member} owns some of 90 Projections");
        assert_eq!(listed, mine, "Projections of {member}");
        all_config_maps.extend(expected(&ring, member, &config_maps));
        all_projections.extend(mine);
    }
    assert_eq!(
        all_config_maps.len(),
        config_maps.len(),
        "every ConfigMap has one owner"
    );
    assert_eq!(
        all_projections.len(),
        projections.len(),
        "every Projection has one owner"
    );

    // A watch with the initial events sends the same set, up to its end-of-initial-events bookmark.
    let member = &ring.members()[1];
    let path = with_selector(
        &format!(
            "/apis/projection.sh/v1/namespaces/{ns}/projections?watch=true&sendInitialEvents=true\
             &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=30"
        ),
        &selector_of(&ring.ranges_of(member)),
    );
    let events = remote
        .request_events::<Projection>(http::Request::get(&path).body(Vec::new()).expect("request"))
        .await
        .expect("a sharded watch");
    let mut events = events.boxed();
    let mut watched = BTreeSet::new();
    while let Some(event) = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
        .await
        .expect("the initial events end within 30s")
    {
        match event.expect("a watch event") {
            WatchEvent::Added(projection) => {
                watched.insert(projection.metadata.name.expect("name"));
            }
            WatchEvent::Bookmark(bookmark)
                if bookmark
                    .metadata
                    .annotations
                    .contains_key("k8s.io/initial-events-end") =>
            {
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        watched,
        expected(&ring, member, &projections),
        "watched Projections of {member}"
    );

    // Only uid and namespace may place objects.
    let refused = remote
        .request::<ObjectList<ConfigMap>>(
            http::Request::get(with_selector(
                &format!("/api/v1/namespaces/{ns}/configmaps"),
                "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
            ))
            .body(Vec::new())
            .expect("request"),
        )
        .await
        .expect_err("another field is refused");
    assert!(
        refused.to_string().contains("unsupported field path"),
        "the refusal names the field: {refused}"
    );
}

#[tokio::test]
async fn with_the_gate_off_the_apiserver_ignores_the_selector_so_a_replica_filters_itself() {
    let client = client().await;
    assert!(
        !sharded_list_and_watch(&client).await,
        "the first control plane runs with the gate off"
    );
    let namespace = TestNamespace::create(&client, "shard-off").await;
    let ns = namespace.name();
    let config_maps = create_config_maps(&client, ns, 30).await;
    let ring = ring();
    let member = &ring.members()[0];
    let listed = list_names::<ConfigMap>(
        &client,
        &with_selector(
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            &selector_of(&ring.ranges_of(member)),
        ),
    )
    .await;
    let everything: BTreeSet<String> = config_maps.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(listed, everything, "all came back");
    assert!(
        expected(&ring, member, &config_maps).len() < everything.len(),
        "so the replica's own filter is what keeps it to its share"
    );
    namespace.delete_and_wait(&client).await;
}
