//! Scale-out by Leases (`--shard-by-lease`) against the real control plane, with controller
//! processes: each replica holds a member Lease, every CR is reconciled by the one replica the
//! ring of the live members gives it (its events name that replica), and a replica killed hard
//! has its CRs taken over once its Lease expired, with no edit lost.

mod common;

use common::*;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Event},
};
use kube::api::ListParams;
use projection_tests::{ServiceProcess, kubeconfig_path, wait_for};
use serde_json::json;
use shared::shard::Ring;
use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

const LEASE_SECONDS: u64 = 4;
const CRS: usize = 24;

/// The replicas whose events name the CR `name` in `namespace`.
async fn reporters(env: &Env, namespace: &str, name: &str) -> BTreeSet<String> {
    env.api::<Event>(namespace)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("events")
        .items
        .into_iter()
        .filter_map(|event| event.reporting_instance)
        .collect()
}

#[tokio::test]
async fn replicas_split_the_crs_by_the_ring_and_take_over_a_killed_ones() {
    let env = env("shards").await;
    let (src, dst) = env.names();
    let names = [
        format!("shard-a-{}", std::process::id()),
        format!("shard-b-{}", std::process::id()),
    ];
    let seconds = format!("{LEASE_SECONDS}s");
    let args = [
        "--author-access=trusted",
        "--requeue-interval",
        "5m",
        "--shard-by-lease",
        "--leader-election-lease-duration",
        seconds.as_str(),
        "--leader-election-namespace",
        src.as_str(),
    ];
    let start =
        |name: &str| ServiceProcess::start_as(binary(), &args, &kubeconfig_path(), &[("POD_NAME", name)]);
    let (mut a, mut b) = (start(&names[0]), start(&names[1]));
    a.wait_ready().await;
    b.wait_ready().await;

    // Both hold a member Lease and acknowledge the ring of both.
    let ring = Ring::new(names.clone());
    let leases = env.api::<Lease>(&src);
    let acknowledged = |version: String| {
        let leases = leases.clone();
        async move {
            let list = leases
                .list(&ListParams::default().labels("projection.sh/controller-member=true"))
                .await
                .map_err(|e| e.to_string())?;
            let said: Vec<Option<String>> = list
                .items
                .iter()
                .map(|l| {
                    l.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("projection.sh/ring-version").cloned())
                })
                .collect();
            (!said.is_empty() && said.iter().all(|s| s.as_deref() == Some(version.as_str())))
                .then_some(list.items.len())
                .ok_or(format!("the members acknowledge {said:?}, not {version}"))
        }
    };
    let members = wait_for("both members acknowledge the ring of both", TIMEOUT, || {
        acknowledged(ring.version())
    })
    .await;
    assert_eq!(members, 2);

    source_configmap(&env.api::<ConfigMap>(&src), "cfg", json!({"k": "v1"})).await;
    let mut uids = Vec::new();
    for i in 0..CRS {
        let created = create(
            &env.projections(),
            projection(
                &format!("p{i}"),
                cm_source(&src, "cfg"),
                json!({"destination": {"name": format!("cfg-{i}")}}),
            ),
        )
        .await;
        uids.push(created.metadata.uid.expect("a uid"));
    }
    for i in 0..CRS {
        wait_ready(&env.projections(), &format!("p{i}")).await;
    }

    // Each CR was reconciled by its owner alone, and each replica owns some.
    let mut owned = [0usize; 2];
    for (i, uid) in uids.iter().enumerate() {
        let owner = ring.owner_of(uid).expect("an owner").to_owned();
        owned[names.iter().position(|n| *n == owner).expect("a member")] += 1;
        assert_eq!(
            reporters(&env, &dst, &format!("p{i}")).await,
            BTreeSet::from([owner.clone()]),
            "p{i} belongs to {owner}"
        );
    }
    assert!(owned.iter().all(|&n| n > 0), "both own some of {CRS}: {owned:?}");

    // The second is killed; an edit made right after reaches every copy once its Lease expired.
    b.kill_hard();
    let killed = Instant::now();
    merge(&env.api::<ConfigMap>(&src), "cfg", json!({"data": {"k": "v2"}})).await;
    let copies = env.api::<ConfigMap>(&dst);
    wait_for("every copy has the edit", Duration::from_secs(30), || {
        let copies = copies.clone();
        async move {
            let mut stale = Vec::new();
            for i in 0..CRS {
                let copy = copies.get(&format!("cfg-{i}")).await.map_err(|e| e.to_string())?;
                if data_of(&copy)["k"] != "v2" {
                    stale.push(i);
                }
            }
            stale
                .is_empty()
                .then_some(())
                .ok_or(format!("stale copies {stale:?}"))
        }
    })
    .await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(LEASE_SECONDS + 4),
        "taken over {took:?} after the kill (Lease {LEASE_SECONDS}s)"
    );
    let alone = Ring::new([names[0].clone()]).version();
    wait_object(
        &leases,
        &format!("projection-member-{}", names[0]),
        "the survivor acknowledges the ring of one",
        |lease| {
            lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("projection.sh/ring-version"))
                == Some(&alone)
        },
    )
    .await;
    // The dead replica's Lease is deleted once it has been expired for three of its durations.
    wait_absent(
        &leases,
        &format!("projection-member-{}", names[1]),
        "the dead member's Lease",
    )
    .await;

    // A clean stop deletes its member Lease.
    let status = a.terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "clean exit on SIGTERM: {status:?}"
    );
    let left = leases
        .list(&ListParams::default().labels("projection.sh/controller-member=true"))
        .await
        .expect("leases");
    assert!(
        left.items
            .iter()
            .all(|l| l.metadata.name.as_deref() != Some(&format!("projection-member-{}", names[0]))),
        "the stopped replica's Lease is gone"
    );
    let _cleanup = controller(&[]).await;
    env.finish().await;
}
