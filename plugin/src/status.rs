//! `kubectl projection status`: one line per CR.

use crate::{
    cli::{Global, Output},
    cluster::Cluster,
    crs::AnyCr,
    exit::{Code, Failure},
    output::{or_none, structured, table},
};
use kube::api::ListParams;
use serde::Serialize;
use shared::api::kind::ProjectionCr;
use shared::inspect::summary::of_cr;
use shared::inspect::{copy_of::CrName, summary::Summary};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    #[serde(flatten)]
    cr: CrName,
    #[serde(flatten)]
    summary: Summary,
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

/// Runs `status` on the CRs `selector` matches (all without one).
pub async fn run(global: &Global, selector: Option<&str>) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let params = match selector {
        Some(selector) => ListParams::default().labels(selector),
        None => ListParams::default(),
    };
    let crs = listed(&cluster, &params).await?;
    let mut lines: Vec<Line> = crs
        .iter()
        .map(|cr| Line {
            cr: cr.view().name(),
            summary: of_cr(&cr.view()),
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
