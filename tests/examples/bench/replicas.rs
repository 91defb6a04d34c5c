//! The replicas dimension (`--replicas 1,2,4`): ours run as N replicas with `--shard-by-lease`,
//! each reconciling its part of the CRs, measured per replica and in total, one count after the
//! other in one run, and printed side by side.

use std::{collections::HashMap, path::Path, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::ListParams};
use serde_json::{Value, json};
use shared::shard::membership::{ACKNOWLEDGED_ANNOTATION, MEMBER_LABEL};

use projection_tests::ServiceProcess;

/// The most replicas one run starts (each is a process on this machine).
const MOST: usize = 16;

/// Checks the counts of `--replicas`: 0 is one controller without shards (today's default), any
/// other count that many replicas with shards.
pub fn check_counts(counts: &[usize]) -> anyhow::Result<()> {
    if let Some(bad) = counts.iter().find(|&&n| n > MOST) {
        anyhow::bail!("--replicas: {bad} is more than {MOST} replicas");
    }
    Ok(())
}

/// What a count is called in the tables.
pub fn label(count: usize) -> String {
    match count {
        0 => "1, no shards".to_owned(),
        1 => "1 shard".to_owned(),
        n => format!("{n} shards"),
    }
}

/// Starts `count` replicas of `binary` with shards (member Leases in `namespace`, which exists),
/// named `<namespace>-r<i>`, and waits until all of them acknowledge the ring of all `count`:
/// only then is the split the one measured.
pub async fn start(
    client: &Client,
    binary: &Path,
    extra: &[&str],
    namespace: &str,
    count: usize,
) -> anyhow::Result<Vec<ServiceProcess>> {
    let mut args = vec!["--shard-by-lease", "--leader-election-namespace", namespace];
    args.extend_from_slice(extra);
    let replicas: Vec<ServiceProcess> = (0..count)
        .map(|i| {
            let name = format!("{namespace}-r{i}");
            ServiceProcess::start_as(
                binary,
                &args,
                &projection_tests::kubeconfig_path(),
                &[("POD_NAME", name.as_str())],
            )
        })
        .collect();
    // Their readiness is waited for by the caller, as for any controller it starts.
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let members = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
    super::wait_until(
        "the replicas to acknowledge one ring of all of them",
        Duration::from_secs(120),
        || async {
            let list = leases.list(&members).await?;
            let acknowledged: Vec<Option<&String>> = list
                .items
                .iter()
                .map(|l| l.metadata.annotations.as_ref()?.get(ACKNOWLEDGED_ANNOTATION))
                .collect();
            Ok(acknowledged.len() == count
                && acknowledged[0].is_some()
                && acknowledged.iter().all(|a| *a == acknowledged[0]))
        },
    )
    .await?;
    Ok(replicas)
}

/// The controller's figures from each replica's (steady RSS, peak RSS, idle CPU, whole-run CPU):
/// memory per replica (the largest), CPU of all replicas together; with several replicas also the
/// sum of their memory, the busiest one's CPU and each replica's figures.
pub fn controller_figures(replicas: &[(f64, f64, f64, f64)]) -> Value {
    const MIB: f64 = 1_048_576.0;
    let most = |pick: fn(&(f64, f64, f64, f64)) -> f64| replicas.iter().map(pick).fold(0.0, f64::max);
    let sum = |pick: fn(&(f64, f64, f64, f64)) -> f64| replicas.iter().map(pick).sum::<f64>();
    let mut figures = json!({
        "rss_steady_mib": most(|r| r.0) / MIB,
        "rss_peak_mib": most(|r| r.1) / MIB,
        "cpu_seconds_idle_window": sum(|r| r.2),
        "cpu_seconds_whole_run": sum(|r| r.3),
    });
    if replicas.len() > 1 {
        figures["replicas"] = json!(replicas.len());
        figures["rss_steady_mib_all_replicas"] = json!(sum(|r| r.0) / MIB);
        figures["cpu_seconds_whole_run_busiest_replica"] = json!(most(|r| r.3));
        figures["per_replica"] = replicas
            .iter()
            .map(|r| json!({"rss_steady_mib": r.0 / MIB, "rss_peak_mib": r.1 / MIB, "cpu_seconds_whole_run": r.3}))
            .collect();
    }
    figures
}

/// Prints the reports of one profile run at several replica counts, with each count's ratio to
/// the first's.
pub fn print_side_by_side(profile: &str, reports: &[(usize, Value)]) {
    let Some((first_count, first)) = reports.first() else {
        return;
    };
    println!("\n### {profile}: ours at several replica counts, one after the other in one run\n");
    let later = &reports[1..];
    let mut header = format!("| figure | {} |", label(*first_count));
    let mut rule = "|---|---|".to_owned();
    for (count, _) in later {
        header += &format!(
            " {} | {} / {} |",
            label(*count),
            label(*count),
            label(*first_count)
        );
        rule += "---|---|";
    }
    println!("{header}\n{rule}");
    let columns: Vec<HashMap<String, f64>> = later
        .iter()
        .map(|(_, report)| super::figures(report).into_iter().collect())
        .collect();
    // Every figure any count has, in the order they first appear (the busiest replica's exist
    // only with several).
    let mut names: Vec<String> = Vec::new();
    for (_, report) in reports {
        for (name, _) in super::figures(report) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let first: HashMap<String, f64> = super::figures(first).into_iter().collect();
    for name in names {
        let Some(&value) = first.get(&name) else {
            let mut row = format!("| {name} | – |");
            for column in &columns {
                row += &column
                    .get(&name)
                    .map_or(" – | – |".to_owned(), |v| format!(" {v:.1} | – |"));
            }
            println!("{row}");
            continue;
        };
        let mut row = format!("| {name} | {value:.1} |");
        for column in &columns {
            match column.get(&name) {
                Some(v) if value > 0.0 => row += &format!(" {v:.1} | {:.2} |", v / value),
                Some(v) => row += &format!(" {v:.1} | – |"),
                None => row += " – | – |",
            }
        }
        println!("{row}");
    }
    for (count, report) in reports {
        if let Some(per_replica) = report.get("controller").and_then(|c| c.get("per_replica")) {
            println!("\n{} per replica: {per_replica}", label(*count));
        }
        if let Some(v) = report.get("requests_per_source_edit") {
            println!("\n{} requests_per_source_edit: {v}", label(*count));
        }
    }
}
