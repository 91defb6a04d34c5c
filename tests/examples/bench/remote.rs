//! The `remote` profiles: copies written into another cluster (`spec.destination.kubeConfig`), the
//! second local control plane (`tests/control-plane/remote.sh up`, or `--remote-kubeconfig`). Each
//! figure stands beside that cluster's own write-to-watch floor, measured in the same run: a copy
//! there cannot follow its source faster than a write here is seen (the controller's watch of the
//! source) plus a write there is seen (the harness's watch of the copy).

use super::{
    Args, Plan, RUN_LABEL, create_namespace, in_parallel, kind_resource, source_object, summarize, wait_until,
};
use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, Config,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, Projection};
use std::time::{Duration, Instant};

/// Where a ClusterProjection's kubeconfig Secret goes: the controller's namespace when it runs out
/// of a pod (`--controller-namespace`, default `default`).
const CONTROLLER_NAMESPACE: &str = "default";

/// The other cluster's admin client.
pub async fn connect(args: &Args) -> anyhow::Result<Client> {
    let path = args
        .remote_kubeconfig
        .clone()
        .unwrap_or_else(projection_tests::remote::remote_kubeconfig_path);
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = runtime::kube_client::client_for(config)?;
    client
        .apiserver_version()
        .await
        .context("the other cluster does not answer (is `tests/control-plane/remote.sh up` running?)")?;
    Ok(client)
}

/// Measures the remote profile's Projections (source edit → copy over there, copy deleted there →
/// restored) and its ClusterProjection fan-out into the other cluster's namespaces.
pub async fn measure(
    (client, remote): (&Client, &Client),
    args: &Args,
    plan: &Plan,
    (run, source_ns): (&str, &str),
    report: &mut Value,
) -> anyhow::Result<()> {
    let labels = json!({RUN_LABEL: run});
    // The floor over there.
    report["remote_apiserver_write_to_watch"] =
        json!(super::write_to_watch_floor(remote, run, args.samples).await?);

    // The credentials a platform team would give: a ServiceAccount there with a ClusterRole for
    // ConfigMaps and namespaces.
    let home = format!("{run}-home");
    create_namespace(remote, &home, labels.clone()).await?;
    let rules = json!([
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]);
    let kubeconfig = projection_tests::remote::service_account_kubeconfig(
        remote,
        (&home, "bench"),
        (&[], json!([])),
        Some(rules),
    )
    .await;
    let secret_name = format!("bench-remote-{run}");
    let author = projection_tests::author_annotation(client).await?;

    if plan.projections > 0 {
        // Every Projection in one namespace here, its copy in the namespace of that name there.
        let dest = format!("{run}-d0");
        create_namespace(client, &dest, labels.clone()).await?;
        create_namespace(remote, &dest, labels.clone()).await?;
        write_secret(client, &dest, &secret_name, &kubeconfig).await?;
        let t = Instant::now();
        in_parallel((0..plan.projections).collect(), |i| {
            let (client, source_ns, dest, author) =
                (client.clone(), source_ns.to_owned(), dest.clone(), author.clone());
            let secret_name = secret_name.clone();
            async move {
                let resource = kind_resource(0);
                let name = format!("s-{i}");
                let api = Api::<DynamicObject>::namespaced_with(client.clone(), &source_ns, &resource);
                api.create(
                    &PostParams::default(),
                    &source_object(&resource, &source_ns, &name)?,
                )
                .await?;
                let p: Projection = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {RUN_LABEL: run}, "annotations": author},
                    "spec": {"source": {"kind": "ConfigMap", "namespace": source_ns, "name": name},
                             "destination": {"kubeConfig": {"secretRef": {"name": secret_name}}}}}))?;
                Api::<Projection>::namespaced(client, &dest)
                    .create(&PostParams::default(), &p)
                    .await?;
                Ok(())
            }
        })
        .await?;
        let projections: Api<Projection> = Api::namespaced(client.clone(), &dest);
        let ready_after = super::all_ready(&projections, run, plan.projections).await?;
        report["remote_projections_ready_seconds"] = json!(t.elapsed().max(ready_after).as_secs_f64());

        let copies: Api<DynamicObject> = Api::namespaced_with(remote.clone(), &dest, &kind_resource(0));
        let sources: Api<DynamicObject> = Api::namespaced_with(client.clone(), source_ns, &kind_resource(0));
        let (edits, heals) = super::edit_and_heal_times(args.samples, |sample| {
            let name = format!("s-{}", (sample * 7919) % plan.projections);
            (sources.clone(), copies.clone(), name)
        })
        .await?;
        report["remote_source_edit_to_copy"] = json!(summarize(edits));
        report["remote_copy_deleted_to_restored"] = json!(summarize(heals));
    }

    if plan.fan_out > 0 {
        let targets: Vec<String> = (0..plan.fan_out).map(|i| format!("{run}-t{i:04}")).collect();
        in_parallel(targets.clone(), |ns| {
            let labels = labels.clone();
            async move { create_namespace(remote, &ns, labels).await }
        })
        .await?;
        write_secret(client, CONTROLLER_NAMESPACE, &secret_name, &kubeconfig).await?;
        let sources: Api<DynamicObject> = Api::namespaced_with(client.clone(), source_ns, &kind_resource(0));
        sources
            .create(
                &PostParams::default(),
                &source_object(&kind_resource(0), source_ns, "fanout")?,
            )
            .await?;
        let cp: ClusterProjection = serde_json::from_value(json!({
            "metadata": {"name": run, "labels": {RUN_LABEL: run}, "annotations": author},
            "spec": {"source": {"kind": "ConfigMap", "namespace": source_ns, "name": "fanout"},
                     "destination": {"namespaces": targets,
                                     "kubeConfig": {"secretRef": {"name": secret_name}}}}}))?;
        let cps: Api<ClusterProjection> = Api::all(client.clone());
        let t = Instant::now();
        let created = cps.create(&PostParams::default(), &cp).await?;
        let expected = plan.fan_out as i32;
        wait_until(
            "the remote fan-out to complete",
            Duration::from_secs(600),
            || async {
                let cp = cps.get(run).await?;
                Ok(cp.status.is_some_and(|s| s.counts.namespaces_written == expected))
            },
        )
        .await?;
        report["remote_fan_out_initial_seconds"] = json!(t.elapsed().as_secs_f64());

        let copies = Api::<DynamicObject>::all_with(remote.clone(), &kind_resource(0));
        let config = super::copies_of(&created);
        let (first, last) = super::fan_out_edit_times(
            (&sources, "fanout"),
            (&copies, &config),
            plan.fan_out,
            args.samples.min(10),
        )
        .await?;
        report["remote_fan_out_edit_first_copy"] = json!(summarize(first));
        report["remote_fan_out_edit_last_copy"] = json!(summarize(last));
    }
    Ok(())
}

/// Writes the kubeconfig `text` into the Secret `name` of `namespace` here.
async fn write_secret(client: &Client, namespace: &str, name: &str, text: &str) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: "remote"}}, "stringData": {"value": text}
    }))?;
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("projection-bench").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// Removes what the run created over there (its namespaces and the ServiceAccount's ClusterRole),
/// and the ClusterProjection's Secret here.
pub async fn cleanup((client, remote): (&Client, &Client), run: &str) {
    let lp = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    super::delete_namespaces(remote, &lp).await;
    let home = format!("{run}-home-bench");
    for plural in ["clusterroles", "clusterrolebindings"] {
        let resource = kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        let _ = Api::<DynamicObject>::all_with(remote.clone(), &resource)
            .delete(&home, &DeleteParams::default())
            .await;
    }
    let _ = Api::<Secret>::namespaced(client.clone(), CONTROLLER_NAMESPACE)
        .delete(&format!("bench-remote-{run}"), &DeleteParams::default())
        .await;
}
