//! `kubectl projection check api`: whether the installation answers, the way `cmctl check api` does
//! for cert-manager. The plugin reads the cluster (discovery, two dry-run creates, the controllers'
//! Deployments and Leases, the other clusters CRs write into); `shared::inspect::api_health`
//! judges each answer.

use crate::{
    check::{CONTROLLER_COMPONENT, controller_flags},
    cli::Global,
    cluster::{Cluster, unless_forbidden},
    crs::every_cr,
    exit::{Code, Failure},
    other_cluster,
    output::{structured, table},
};
use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::PostParams};
use serde_json::{Value, json};
use shared::{
    api::{crd::Projection, keys::LEADER_LEASE, kind::ProjectionCr as _, reason::Reason},
    inspect::api_health::{self, Verdict},
    policy::kubeconfig::KubeconfigSecret,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

/// Runs `check api`, again every 2 s until all hold when `wait` is given.
pub async fn run(
    global: &Global,
    wait: Option<Duration>,
    controller_namespace: &str,
) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let deadline = wait.map(|w| std::time::Instant::now() + w);
    let verdicts = loop {
        let mut verdicts = verdicts(&cluster).await?;
        verdicts.extend(other_clusters(&cluster, controller_namespace).await?);
        let healthy = verdicts.iter().all(|v| v.ok);
        match deadline {
            Some(deadline) if !healthy && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            _ => break verdicts,
        }
    };
    match structured(&global.output, &verdicts)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&verdicts)),
    }
    Ok(match (verdicts.iter().all(|v| v.ok), wait) {
        (true, _) => Code::Ok,
        (false, Some(_)) => Code::TimedOut,
        (false, None) => Code::Attention,
    })
}

async fn verdicts(cluster: &Cluster) -> Result<Vec<Verdict>, Failure> {
    let client = &cluster.client;
    let served = match client.list_api_group_resources("projection.sh/v1").await {
        Ok(list) => Some(list.resources.into_iter().map(|r| r.name).collect::<Vec<_>>()),
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => return Err(anyhow::Error::new(e).context("reading discovery").into()),
    };
    let mut verdicts = vec![api_health::crds(served.as_deref())];
    if served.is_some() {
        let ns = &cluster.namespace;
        let valid = dry_run_create(
            cluster,
            json!({"source": source(ns, "projection-check-source"),
            "destination": {"name": "projection-check-copy"}}),
        )
        .await?;
        verdicts.push(api_health::admits(valid.as_ref().map_err(String::as_str)));
        // Its copy would be its own source: only the webhook can tell (it sees the namespace).
        let onto_itself = dry_run_create(cluster, json!({"source": source(ns, "projection-check")})).await?;
        verdicts.push(api_health::refuses(onto_itself.as_ref().map_err(String::as_str)));
    }
    // A tenant may not read the controllers' Deployments nor their Lease: those checks are skipped
    // (said on stderr), the rest is what a tenant can check.
    let Some(deployments) = cluster.deployments_everywhere(CONTROLLER_COMPONENT).await? else {
        return Ok(verdicts);
    };
    let controllers: Vec<(String, String)> = deployments
        .iter()
        .filter_map(|d| Some((d.metadata.namespace.clone()?, controller_flags(d)?.author_access)))
        .collect();
    if controllers.is_empty() {
        verdicts.push(Verdict {
            check: "leader".to_owned(),
            ok: false,
            detail: format!("no projection controller Deployment (labelled {CONTROLLER_COMPONENT}) found"),
        });
    }
    let namespaces: BTreeSet<&str> = controllers.iter().map(|(ns, _)| ns.as_str()).collect();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    for namespace in namespaces {
        let read = unless_forbidden(
            Api::<Lease>::namespaced(client.clone(), namespace)
                .get_opt(LEADER_LEASE)
                .await,
            || format!("you may not read Lease {namespace}/{LEADER_LEASE}; its leader is not checked"),
            &format!("reading Lease {namespace}/{LEADER_LEASE}"),
        )?;
        let Some(lease) = read else { continue };
        let lease = lease.map(|l| serde_json::to_value(l).unwrap_or_default());
        verdicts.push(api_health::leader(namespace, lease.as_ref(), now));
    }
    for (namespace, mode) in &controllers {
        verdicts.push(api_health::author_access(namespace, mode));
    }
    Ok(verdicts)
}

/// Each other cluster the CRs write into, through its Secret: whether it answers (its version),
/// opened as the controller opens it.
async fn other_clusters(cluster: &Cluster, controller_namespace: &str) -> Result<Vec<Verdict>, Failure> {
    let mut secrets: BTreeMap<KubeconfigSecret, usize> = BTreeMap::new();
    for cr in every_cr(cluster).await? {
        if let Some(secret) = KubeconfigSecret::of(&cr.view(), controller_namespace) {
            *secrets.entry(secret).or_default() += 1;
        }
    }
    let mut verdicts = Vec::new();
    for (secret, crs) in secrets {
        let answer = match other_cluster::open(cluster, &secret, None).await? {
            Err(unusable) => Err(unusable),
            Ok((there, _)) => {
                match tokio::time::timeout(ANSWER_WITHIN, there.client.apiserver_version()).await {
                    Ok(Ok(version)) => Ok(version.git_version),
                    Ok(Err(e)) => Err((Reason::DestinationClusterUnreachable, e.to_string())),
                    Err(_) => Err((
                        Reason::DestinationClusterUnreachable,
                        format!("no answer within {}s", ANSWER_WITHIN.as_secs()),
                    )),
                }
            }
        };
        let answer = answer
            .as_ref()
            .map(String::as_str)
            .map_err(|(reason, message)| (*reason, message.as_str()));
        verdicts.push(api_health::other_cluster(&secret.path(), crs, answer));
    }
    Ok(verdicts)
}

/// How long another cluster has to answer `check api` (the controller gives it 5 s to connect and
/// 15 s for an answer).
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

fn source(namespace: &str, name: &str) -> Value {
    json!({"version": "v1", "kind": "ConfigMap", "namespace": namespace, "name": name})
}

/// A server-side dry run of creating a Projection with `spec` in the namespace: the object the
/// apiserver would store, or its refusal's message.
async fn dry_run_create(cluster: &Cluster, spec: Value) -> Result<Result<Value, String>, Failure> {
    let projection: Projection = serde_json::from_value(json!({
        "apiVersion": "projection.sh/v1", "kind": "Projection",
        "metadata": {"generateName": "projection-check-", "namespace": cluster.namespace},
        "spec": spec,
    }))
    .context("building the check's Projection")?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<Projection>::namespaced(cluster.client.clone(), &cluster.namespace)
        .create(&params, &projection)
        .await
    {
        Ok(created) => Ok(Ok(serde_json::to_value(created).unwrap_or_default())),
        Err(kube::Error::Api(s)) => Ok(Err(s.message.clone())),
        Err(e) => Err(anyhow::Error::new(e)
            .context("creating a Projection (dry run)")
            .into()),
    }
}

fn render(verdicts: &[Verdict]) -> String {
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.check.clone(),
                if v.ok { "ok" } else { "failing" }.to_owned(),
                v.detail.clone(),
            ]
        })
        .collect();
    table(&["CHECK", "RESULT", "DETAIL"], &rows)
}
