//! The controller squeezed by API Priority and Fairness: its ServiceAccount's requests go to a
//! priority level with a few seats that rejects (HTTP 429) what does not fit. The fan-out must meet
//! the rejections with backoff (no hot loop), converge anyway, and go back to its normal pace once
//! the squeeze is lifted, without a restart.

use k8s_openapi::api::{
    core::v1::ConfigMap,
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use projection_tests::{ClusterScopedGuard, NamespaceSet, ServiceProcess, kubectl_ok, wait_for};
use serde_json::json;
use shared::api::crd::ClusterProjection;
use std::time::Duration;

mod common;
use common::{account::ControllerAccount, *};

const NAMESPACES: usize = 60;

/// `apiserver_flowcontrol_<family>` summed over the samples of priority level `level`.
fn flow_control(family: &str, level: &str) -> f64 {
    kubectl_ok(&["get", "--raw", "/metrics"])
        .lines()
        .filter(|l| l.starts_with(&format!("apiserver_flowcontrol_{family}{{")))
        .filter(|l| l.contains(&format!("priority_level=\"{level}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_copies(client: &kube::Client, names: &[String], value: &str, within: Duration) {
    wait_for(&format!("every copy at {value}"), within, || async {
        let mut behind = 0;
        for ns in names {
            let copy = Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt("settings")
                .await
                .map_err(|e| e.to_string())?;
            if copy
                .and_then(|c| c.data)
                .and_then(|d| d.get("k").cloned())
                .as_deref()
                != Some(value)
            {
                behind += 1;
            }
        }
        (behind == 0)
            .then_some(())
            .ok_or_else(|| format!("{behind} copies behind"))
    })
    .await;
}

#[tokio::test]
async fn squeezed_by_api_priority_and_fairness_the_controller_backs_off_and_converges() {
    let env = env("apf").await;
    let account = ControllerAccount::create(&env, "apf-home", &["configmaps"]).await;
    let level = format!("projection-squeeze-{}", account.namespace());
    let _guards = [
        ClusterScopedGuard::new("flowschemas", &level),
        ClusterScopedGuard::new("prioritylevelconfigurations", &level),
    ];
    // The smallest share there is, nothing borrowed, and no queue: what does not fit gets a 429.
    let squeeze: PriorityLevelConfiguration = serde_json::from_value(json!({
        "metadata": {"name": level},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                 "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}
    }))
    .expect("priority level");
    Api::<PriorityLevelConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &squeeze)
        .await
        .expect("priority level created");
    let schema: FlowSchema = serde_json::from_value(json!({
        "metadata": {"name": level},
        "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": 100,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount":
                               {"name": "projection-controller", "namespace": account.namespace()}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "namespaces": ["*"], "clusterScope": true}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}
    }))
    .expect("flow schema");
    let schemas = Api::<FlowSchema>::all(env.client.clone());
    schemas
        .create(&PostParams::default(), &schema)
        .await
        .expect("flow schema created");

    let mut namespaces = NamespaceSet::new("apf");
    let names = namespaces
        .create_many(
            &env.client,
            "n",
            NAMESPACES,
            &[("projection.test/apf", &namespaces.run.clone())],
        )
        .await;
    let src = env.source.name().to_owned();
    create(
        &env.api::<ConfigMap>(&src),
        json!({"metadata": {"name": "settings", "annotations": opted_in()}, "data": {"k": "v1"}}),
    )
    .await;
    let rejected_before = flow_control("rejected_requests_total", &level);
    let dispatched_before = flow_control("dispatched_requests_total", &level);

    let mut controller = ServiceProcess::start_as(
        binary(),
        &["--requeue-interval", "5m", "--author-access=trusted"],
        &account.kubeconfig,
        &[],
    );
    controller.wait_ready().await;
    let cps: Api<ClusterProjection> = Api::all(env.client.clone());
    let cp = format!("apf-{}", namespaces.run);
    create(
        &cps,
        json!({"apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
               "metadata": {"name": cp},
               "spec": {"source": {"kind": "ConfigMap", "namespace": src, "name": "settings"},
                        "destination": {"namespaceSelector": {"matchLabels": {"projection.test/apf": namespaces.run}}}}}),
    )
    .await;
    let slow = Duration::from_secs(120);
    wait_copies(&env.client, &names, "v1", slow).await;
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"k": "v2"}}),
    )
    .await;
    wait_copies(&env.client, &names, "v2", slow).await;

    let rejected = flow_control("rejected_requests_total", &level) - rejected_before;
    let dispatched = flow_control("dispatched_requests_total", &level) - dispatched_before;
    let warnings = loud_lines_about(&controller, "");
    eprintln!(
        "{NAMESPACES} namespaces, 2 values: {dispatched} requests served, {rejected} rejected (429), \
         {warnings} WARN/ERROR lines"
    );
    assert!(rejected > 0.0, "the squeeze never bit: no request was rejected");
    // Two values for every namespace is 2 × 60 writes; reads, status, events and retries come on
    // top. A controller retrying without backoff would make thousands.
    let limit = 12.0 * NAMESPACES as f64;
    assert!(
        dispatched + rejected < limit,
        "{dispatched} served + {rejected} rejected requests for {} writes: a hot loop",
        2 * NAMESPACES
    );

    // Lifted: the next value goes through at the normal pace, same process.
    delete(&schemas, &level).await;
    merge(
        &env.api::<ConfigMap>(&src),
        "settings",
        json!({"data": {"k": "v3"}}),
    )
    .await;
    wait_copies(&env.client, &names, "v3", TIMEOUT).await;
    assert!(controller.is_running(), "no restart needed");

    let _ = cps.delete(&cp, &DeleteParams::default()).await;
    wait_absent(&cps, &cp, "the ClusterProjection gone").await;
    drop(controller);
    env.finish().await;
    account.home.delete_and_wait(&env.client).await;
}
