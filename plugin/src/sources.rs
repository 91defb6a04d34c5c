//! `kubectl projection sources KIND/NAME`: every CR that reads this object, where its copies are and
//! whether each is current.

use crate::{
    cli::{Global, Output},
    cluster::Named,
    copies::{build_now, placements, state_in},
    crs::every_cr,
    exit::{Code, Failure},
    output::{structured, table},
};
use serde::Serialize;
use shared::api::kind::ProjectionCr;
use shared::inspect::copy_of::{CopyState, CrName, reads};
use shared::inspect::summary::of_cr;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Reader {
    cr: CrName,
    /// Whether the CR is Ready.
    ready: String,
    copies: Vec<Copy>,
    /// Why its targets cannot be resolved, if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    targets_error: Option<String>,
    /// The other cluster its copies go to (`spec.destination.kubeConfig`), by its kubeconfig
    /// Secret: their state is read there (`why` with that cluster's context).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Copy {
    namespace: String,
    name: String,
    #[serde(flatten)]
    state: CopyState,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    kind: String,
    namespace: String,
    name: String,
    /// Whether the object exists.
    exists: bool,
    readers: Vec<Reader>,
}

/// Runs `sources`.
pub async fn run(global: &Global, reference: &str) -> Result<Code, Failure> {
    let named = Named::read(global, reference).await?;
    let (cluster, namespace, name) = (&named.cluster, &named.namespace, named.name.as_str());
    let exists = named.object.is_some();
    let namespaces = cluster.namespaces().await?;
    let mut readers = Vec::new();
    for cr in every_cr(cluster).await? {
        if !reads(cr.view().source, &named.group_kind, namespace, name) {
            continue;
        }
        if let Some(secret) = cr.view().cluster {
            readers.push(Reader {
                cr: cr.view().name(),
                ready: of_cr(&cr.view()).ready,
                copies: Vec::new(),
                targets_error: None,
                cluster: Some(format!(
                    "the cluster of Secret {} key {}",
                    secret.name,
                    secret.key()
                )),
            });
            continue;
        }
        let built = build_now(cluster, &cr).await?;
        let (places, targets_error) = match placements(&cr, &namespaces) {
            Ok(places) => (places, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let mut copies = Vec::new();
        for place in places {
            copies.push(Copy {
                state: state_in((cluster, None), &cr, &built, &place).await?,
                namespace: place,
                name: cr.view().copy_name.to_owned(),
            });
        }
        readers.push(Reader {
            cr: cr.view().name(),
            ready: of_cr(&cr.view()).ready,
            copies,
            targets_error,
            cluster: None,
        });
    }
    readers.sort_by(|a, b| a.cr.cmp(&b.cr));
    let attention = readers
        .iter()
        .any(|r| r.targets_error.is_some() || r.copies.iter().any(|c| c.state.needs_attention()));
    let report = Report {
        kind: named.resource.kind.clone(),
        namespace: namespace.clone(),
        name: name.to_owned(),
        exists,
        readers,
    };
    match structured(&global.output, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&report, global.output == Output::Wide)),
    }
    Ok(if !exists {
        Code::NotFound
    } else if attention {
        Code::Attention
    } else {
        Code::Ok
    })
}

fn render(report: &Report, wide: bool) -> String {
    if report.readers.is_empty() {
        return format!(
            "No Projection or ClusterProjection reads {} {}/{}.\n",
            report.kind, report.namespace, report.name
        );
    }
    let mut rows = Vec::new();
    for reader in &report.readers {
        let (kind, cr) = match &reader.cr {
            CrName::Projection { namespace, name } => ("Projection", format!("{namespace}/{name}")),
            CrName::ClusterProjection { name } => ("ClusterProjection", name.clone()),
        };
        let base = |copy: String, state: String| {
            vec![kind.to_owned(), cr.clone(), reader.ready.clone(), copy, state]
        };
        if let Some(e) = &reader.targets_error {
            rows.push(base("<none>".into(), format!("targets not resolved: {e}")));
        }
        if let Some(cluster) = &reader.cluster {
            rows.push(base(
                format!("in {cluster}"),
                "read there: kubectl projection why ... --source-context <this cluster>".into(),
            ));
            continue;
        }
        if reader.copies.is_empty() && reader.targets_error.is_none() {
            rows.push(base("<none>".into(), "no target namespace".into()));
        }
        for copy in &reader.copies {
            let state = match (&copy.state, wide) {
                (CopyState::Stale { copy, now }, true) => format!("stale (copy {copy}, source builds {now})"),
                (state, _) => state.words(),
            };
            rows.push(base(format!("{}/{}", copy.namespace, copy.name), state));
        }
    }
    let mut out = String::new();
    if !report.exists {
        out.push_str(&format!(
            "{} {}/{} does not exist.\n",
            report.kind, report.namespace, report.name
        ));
    }
    out.push_str(&table(&["KIND", "CR", "READY", "COPY", "STATE"], &rows));
    out
}
