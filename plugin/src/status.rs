//! `kubectl projection status`: one line per CR.

use crate::{
    cli::{Global, Output},
    cluster::Cluster,
    crs::AnyCr,
    exit::{Code, Failure},
    output::{or_none, structured, table},
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::ListParams};
use serde::Serialize;
use shared::api::kind::ProjectionCr;
use shared::inspect::summary::of_cr;
use shared::inspect::{copy_of::CrName, summary::Summary};
use shared::shard::{
    membership::{MEMBER_LABEL, MemberLease},
    ring::Ring,
};
use std::time::SystemTime;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    #[serde(flatten)]
    cr: CrName,
    #[serde(flatten)]
    summary: Summary,
    /// The controller replica that reconciles it, when the replicas run sharded.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

/// The CRs `status` lists: the Projections of the namespace (every namespace with `-A`) and every
/// ClusterProjection (they live in no namespace).
pub async fn listed(cluster: &Cluster, params: &ListParams) -> Result<Vec<AnyCr>, Failure> {
    let projections = cluster.projections(cluster.all_namespaces, params).await?;
    let clusters = cluster.cluster_projections(params).await?;
    Ok(projections
        .into_iter()
        .map(AnyCr::Projection)
        .chain(clusters.into_iter().map(AnyCr::Cluster))
        .collect())
}

/// Which replica reconciles each CR when the controllers run sharded (`--shard-by-lease`): the ring
/// of the live member Leases in the controller's namespace, as the replicas compute it. `None` when
/// no member Lease is live (leader election: one replica does all) or the caller may not list them
/// (a tenant: the column is left out, as it is without sharding).
async fn members_ring(cluster: &Cluster, namespace: &str) -> Result<Option<Ring>, Failure> {
    let members = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
    let leases = match Api::<Lease>::namespaced(cluster.client.clone(), namespace)
        .list(&members)
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => return Ok(None),
        Err(e) => {
            let what = format!("listing the controller replicas' Leases in {namespace}");
            return Err(anyhow::Error::new(e).context(what).into());
        }
    };
    let now = SystemTime::now();
    let live: Vec<String> = leases
        .iter()
        .filter_map(MemberLease::of)
        .filter(|member| member.is_live(now))
        .map(|member| member.identity)
        .collect();
    Ok((!live.is_empty()).then(|| Ring::new(live)))
}

/// Runs `status` on the CRs `selector` matches (all without one); the owners from the member
/// Leases in `controller_namespace`.
pub async fn run(
    global: &Global,
    selector: Option<&str>,
    controller_namespace: &str,
) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let params = match selector {
        Some(selector) => ListParams::default().labels(selector),
        None => ListParams::default(),
    };
    let crs = listed(&cluster, &params).await?;
    let ring = members_ring(&cluster, controller_namespace).await?;
    let mut lines: Vec<Line> = crs
        .iter()
        .map(|cr| Line {
            cr: cr.view().name(),
            summary: of_cr(&cr.view()),
            owner: ring
                .as_ref()
                .and_then(|ring| ring.owner_of(cr.view().uid()))
                .map(str::to_owned),
        })
        .collect();
    lines.sort_by(|a, b| a.cr.cmp(&b.cr));
    let attention = lines.iter().any(|l| l.summary.needs_attention());
    if global.output == Output::Name {
        for cr in &crs {
            println!("{}", cr.resource_name());
        }
        return Ok(if attention { Code::Attention } else { Code::Ok });
    }
    match structured(&global.output, &lines)? {
        Some(text) => print!("{text}"),
        None if lines.is_empty() => eprintln!("No Projections or ClusterProjections found."),
        None => print!("{}", render(&lines, global.output == Output::Wide)),
    }
    Ok(if attention { Code::Attention } else { Code::Ok })
}

fn render(lines: &[Line], wide: bool) -> String {
    let mut headers = vec![
        "KIND",
        "NAMESPACE",
        "NAME",
        "READY",
        "REASON",
        "WRITTEN",
        "FAILED",
        "SUSPENDED",
        "LAST CHANGE",
    ];
    // With sharded replicas, which one reconciles each CR.
    let sharded = lines.iter().any(|l| l.owner.is_some());
    if sharded {
        headers.push("OWNER");
    }
    if wide {
        headers.push("MESSAGE");
    }
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            let (kind, namespace, name) = match &l.cr {
                CrName::Projection { namespace, name } => ("Projection", namespace.clone(), name.clone()),
                CrName::ClusterProjection { name } => ("ClusterProjection", String::new(), name.clone()),
            };
            let s = &l.summary;
            let mut row = vec![
                kind.to_owned(),
                or_none(&namespace),
                name,
                s.ready.clone(),
                or_none(&s.reason),
                s.written.to_string(),
                s.failed.to_string(),
                s.suspended.to_string(),
                or_none(s.last_change.as_deref().unwrap_or_default()),
            ];
            if sharded {
                row.push(or_none(l.owner.as_deref().unwrap_or_default()));
            }
            if wide {
                let mut message = s.message.clone();
                for f in &s.failures {
                    message.push_str(&format!("; {}: {} {}", f.namespace, f.reason, f.message));
                }
                row.push(or_none(message.trim_start_matches("; ")));
            }
            row
        })
        .collect();
    table(&headers, &rows)
}
