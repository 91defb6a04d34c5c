//! Scenario 4: the controller's path to the apiserver black-holed. The controller reaches the
//! apiserver through a proxy of the test support ([`BlackHoleProxy`]); the proxy stops forwarding
//! without closing anything while the source is edited, and when the path returns only connections
//! opened from then on are forwarded: the controller's old ones stay silent for good, as after a
//! lost NAT or conntrack entry. A controller that waits on them without a timeout never sees the
//! edit; one with timeouts gives them up (the proxy sees it connect again) and catches up once the
//! path is back, in the same process.

use super::{
    Plan, create_namespace, create_projection, create_source, edit_source, round2, wait_copy_at_least,
};
use anyhow::{Context as _, ensure};
use kube::config::Kubeconfig;
use projection_tests::{ServiceProcess, black_hole::BlackHoleProxy, kubeconfig_path};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long the copy may take to follow an edit while nothing is broken.
const STEADY_LIMIT: Duration = Duration::from_secs(30);

pub async fn black_hole(
    client: &kube::Client,
    run: &str,
    plan: &Plan,
    binary: &Path,
    controller_args: &[String],
) -> anyhow::Result<Value> {
    let proxy = BlackHoleProxy::start(projection_tests::apiserver_addr().await?).await?;
    let kubeconfig = kubeconfig_through(&proxy, run)?;
    let (source_ns, dest_ns) = (format!("{run}-bsrc"), format!("{run}-bdst"));
    create_namespace(client, &source_ns, BTreeMap::new(), run).await?;
    create_namespace(client, &dest_ns, BTreeMap::new(), run).await?;
    let sources = create_source(client, &source_ns).await?;
    let (copies, owner) = create_projection(client, run, &source_ns, &dest_ns).await?;
    let args: Vec<&str> = controller_args.iter().map(String::as_str).collect();
    let mut controller = ServiceProcess::start_split_as(binary, &args, &kubeconfig, &[]);
    controller.wait_ready().await;
    let pid = controller.pid();

    // The path works: an edit reaches the copy.
    edit_source(&sources, 1).await?;
    let edited = Instant::now();
    wait_copy_at_least(&copies, &owner, 1, STEADY_LIMIT).await?;
    let before = edited.elapsed();

    // Black-holed for the planned time (the fault's duration, not a wait for a state), with an
    // edit made through the harness's own path right after it began.
    let holed = Instant::now();
    proxy.black_hole();
    edit_source(&sources, 2).await?;
    tokio::time::sleep(plan.black_hole).await;
    let (reconnects, first_reconnect) = proxy.accepted_since(holed);
    proxy.restore_new_connections_only();
    let restored = Instant::now();
    wait_copy_at_least(&copies, &owner, 2, super::CONVERGE_LIMIT)
        .await
        .with_context(|| {
            format!(
                "the edit made while black-holed (controller log {})",
                controller.log.display()
            )
        })?;
    let recovered = restored.elapsed();

    // And the next edit at the usual pace.
    edit_source(&sources, 3).await?;
    let edited = Instant::now();
    wait_copy_at_least(&copies, &owner, 3, STEADY_LIMIT).await?;
    let after = edited.elapsed();
    ensure!(
        controller.is_running() && controller.pid() == pid,
        "the controller exited while its path was black-holed (log {})",
        controller.log.display()
    );
    let detected = first_reconnect.map(|at| round2(at - holed));
    eprintln!(
        "black hole of {:?}: first new connection after {detected:?} s ({reconnects} during the black hole); \
         the edit made meanwhile reached the copy {recovered:?} after the path returned; edits took {before:?} before, {after:?} after",
        plan.black_hole
    );
    Ok(json!({
        "black_hole_seconds": plan.black_hole.as_secs_f64(),
        "controller_args": controller_args,
        "first_new_connection_seconds_after_black_hole": detected,
        "new_connections_during_black_hole": reconnects,
        "edit_during_black_hole_propagated_seconds_after_restore": round2(recovered),
        "edit_before_seconds": round2(before),
        "edit_after_seconds": round2(after),
        "controller_restarts": 0,
    }))
}

/// The test kubeconfig with its server moved to the proxy (the apiserver's certificate names
/// 127.0.0.1, whatever the port). Written as JSON, which every kubeconfig reader accepts.
fn kubeconfig_through(proxy: &BlackHoleProxy, run: &str) -> anyhow::Result<PathBuf> {
    let mut kubeconfig = Kubeconfig::read_from(kubeconfig_path())?;
    for cluster in &mut kubeconfig.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            cluster.server = Some(format!("https://{}", proxy.addr()));
        }
    }
    let path = projection_tests::testenv_dir().join(format!("{run}-black-hole.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig)?)?;
    Ok(path)
}
