//! `suspend`, `resume` and `sync`: one CR, those matching `-l`, or `--all`.

use crate::{
    cli::{Global, Select},
    cluster::Cluster,
    crs::AnyCr,
    exit::{Code, Failure},
    status::listed,
};
use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use shared::api::kind::ProjectionCr;
use shared::inspect::summary::of_cr;
use shared::{
    api::{
        crd::{ClusterProjection, Projection},
        keys::REQUESTED_AT,
    },
    inspect::copy_of::{CrName, kubectl_name},
};
use std::time::{Duration, Instant};

/// Which kind a word of the command line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrKind {
    Projection,
    Cluster,
}

/// `projection`, `projections`, `proj` (and `.projection.sh`), or the ClusterProjection forms.
pub fn parse_kind(word: &str) -> Option<CrKind> {
    let word = word.to_ascii_lowercase();
    let word = word.strip_suffix(".projection.sh").unwrap_or(&word);
    match word {
        "projection" | "projections" | "proj" => Some(CrKind::Projection),
        "clusterprojection" | "clusterprojections" | "cproj" => Some(CrKind::Cluster),
        _ => None,
    }
}

/// What a selection names: one CR, or a kind (or both) with a selector or `--all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    One(CrKind, String),
    Many(Option<CrKind>),
}

/// Reads a selection; `Err` is the usage message.
pub fn selection(select: &Select) -> Result<Selection, String> {
    let many = select.all || select.selector.is_some();
    match (&select.target, many) {
        (Some(target), false) => match target.split_once('/') {
            Some((kind, name)) if !name.is_empty() => parse_kind(kind)
                .map(|k| Selection::One(k, name.to_owned()))
                .ok_or_else(|| format!("{kind:?} is neither projection nor clusterprojection")),
            _ => Err(format!(
                "{target:?}: name one CR as projection/NAME or clusterprojection/NAME, or a kind with -l or --all"
            )),
        },
        (Some(kind), true) => parse_kind(kind).map(|k| Selection::Many(Some(k))).ok_or_else(|| {
            format!("{kind:?} is neither projection nor clusterprojection (with -l or --all, name a kind)")
        }),
        (None, true) => Ok(Selection::Many(None)),
        (None, false) => {
            Err("name a CR (projection/NAME or clusterprojection/NAME), or use -l or --all".to_owned())
        }
    }
}

/// The CRs a selection names.
async fn selected(cluster: &Cluster, select: &Select) -> Result<Vec<AnyCr>, Failure> {
    let selection = selection(select).map_err(Failure::Usage)?;
    match selection {
        Selection::One(kind, name) => {
            let cr_name = match kind {
                CrKind::Projection => CrName::Projection {
                    namespace: cluster.namespace.clone(),
                    name,
                },
                CrKind::Cluster => CrName::ClusterProjection { name },
            };
            match AnyCr::get(cluster, &cr_name).await? {
                Some(cr) => Ok(vec![cr]),
                None => Err(Failure::NotFound(format!("{} not found", kubectl_name(&cr_name)))),
            }
        }
        Selection::Many(kind) => {
            let mut params = ListParams::default();
            if let Some(selector) = &select.selector {
                params = params.labels(selector);
            }
            let mut crs = listed(cluster, &params).await?;
            crs.retain(|cr| match (kind, cr) {
                (Some(CrKind::Projection), AnyCr::Cluster(_))
                | (Some(CrKind::Cluster), AnyCr::Projection(_)) => false,
                // Without -A, --all and -l stay in the namespace: ClusterProjections only when named.
                (None, AnyCr::Cluster(_)) => cluster.all_namespaces,
                _ => true,
            });
            Ok(crs)
        }
    }
}

async fn patch(cluster: &Cluster, cr: &AnyCr, body: &Value) -> Result<AnyCr, Failure> {
    let params = PatchParams::default();
    let name = cr.view().meta.name.clone().unwrap_or_default();
    let patched = match cr {
        AnyCr::Projection(_) => {
            Api::<Projection>::namespaced(cluster.client.clone(), cr.view().home().unwrap_or_default())
                .patch(&name, &params, &Patch::Merge(body))
                .await
                .map(AnyCr::Projection)
        }
        AnyCr::Cluster(_) => Api::<ClusterProjection>::all(cluster.client.clone())
            .patch(&name, &params, &Patch::Merge(body))
            .await
            .map(AnyCr::Cluster),
    };
    Ok(patched.with_context(|| format!("patching {}", kubectl_name(&cr.view().name())))?)
}

/// `projection.projection.sh/NAME`, as kubectl prints what it changed.
fn resource_name(cr: &AnyCr) -> String {
    match cr {
        AnyCr::Projection(p) => format!("projection.projection.sh/{}", p.name_any()),
        AnyCr::Cluster(c) => format!("clusterprojection.projection.sh/{}", c.name_any()),
    }
}

/// Runs `suspend` (`suspend` true) or `resume`.
pub async fn set_suspend(global: &Global, select: &Select, suspend: bool) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let crs = selected(&cluster, select).await?;
    if crs.is_empty() {
        eprintln!("No Projections or ClusterProjections found.");
    }
    for cr in crs {
        patch(&cluster, &cr, &json!({"spec": {"suspend": suspend}})).await?;
        println!(
            "{} {}",
            resource_name(&cr),
            if suspend { "suspended" } else { "resumed" }
        );
    }
    Ok(Code::Ok)
}

/// Runs `sync`: requests a reconcile of each CR, and with `wait` waits until each has handled it.
pub async fn sync(global: &Global, select: &Select, wait: bool, timeout: Duration) -> Result<Code, Failure> {
    let cluster = Cluster::connect(global).await?;
    let crs = selected(&cluster, select).await?;
    if crs.is_empty() {
        eprintln!("No Projections or ClusterProjections found.");
    }
    let requested = Timestamp::now().to_string();
    let body = json!({"metadata": {"annotations": {REQUESTED_AT: requested}}});
    let mut pending = Vec::new();
    for cr in crs {
        patch(&cluster, &cr, &body).await?;
        println!("{} reconcile requested at {requested}", resource_name(&cr));
        pending.push(cr.view().name());
    }
    if !wait {
        return Ok(Code::Ok);
    }
    let deadline = Instant::now() + timeout;
    let mut code = Code::Ok;
    // Polled: the status is read at most every 250 ms until the deadline.
    while let Some(name) = pending.first().cloned() {
        let cr = AnyCr::get(&cluster, &name)
            .await?
            .ok_or_else(|| Failure::NotFound(format!("{} was deleted while waiting", kubectl_name(&name))))?;
        let view = cr.view();
        if view.status.and_then(|s| s.last_handled_reconcile_at.as_deref()) == Some(requested.as_str()) {
            let summary = of_cr(&view);
            println!(
                "{} reconciled: Ready={} {}",
                resource_name(&cr),
                summary.ready,
                summary.reason
            );
            if summary.needs_attention() {
                code = Code::Attention;
            }
            pending.remove(0);
            continue;
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = pending.iter().map(kubectl_name).collect();
            return Err(Failure::TimedOut(format!(
                "timed out after {} waiting for the controller to handle the request of {requested} ({})",
                humantime::format_duration(timeout),
                names.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(target: Option<&str>, selector: Option<&str>, all: bool) -> Select {
        Select {
            target: target.map(str::to_owned),
            selector: selector.map(str::to_owned),
            all,
        }
    }

    #[test]
    fn a_selection_names_one_cr_or_a_kind_with_a_selector() {
        use CrKind::*;
        #[rustfmt::skip]
        let cases: Vec<(Select, Result<Selection, ()>)> = vec![
            (select(Some("projection/web"), None, false), Ok(Selection::One(Projection, "web".into()))),
            (select(Some("proj/web"), None, false), Ok(Selection::One(Projection, "web".into()))),
            (select(Some("cproj/fan"), None, false), Ok(Selection::One(Cluster, "fan".into()))),
            (select(Some("clusterprojections.projection.sh/fan"), None, false), Ok(Selection::One(Cluster, "fan".into()))),
            (select(Some("projections"), Some("team=a"), false), Ok(Selection::Many(Some(Projection)))),
            (select(None, None, true), Ok(Selection::Many(None))),
            (select(None, Some("team=a"), false), Ok(Selection::Many(None))),
            (select(Some("web"), None, false), Err(())),
            (select(Some("configmap/web"), None, false), Err(())),
            (select(Some("projection/web"), None, true), Err(())),
            (select(None, None, false), Err(())),
        ];
        for (select, expected) in cases {
            assert_eq!(selection(&select).map_err(|_| ()), expected, "{select:?}");
        }
    }
}
