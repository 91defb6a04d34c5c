//! `kubectl projection why KIND/NAME`: who owns this copy and whether it is current.

use crate::{
    cli::{Global, Output},
    cluster::{Cluster, Named, unless_forbidden},
    copies::{Built, build_now, state_in},
    crs::{AnyCr, every_cr, last_seen},
    exit::{Code, Failure},
    output::{or_none, structured, table},
};
use anyhow::Context as _;
use k8s_openapi::api::{core::v1::Namespace, events::v1::Event};
use kube::{Api, api::ListParams};
use serde::Serialize;
use serde_json::Value;
use shared::api::kind::ProjectionCr;
use shared::copy::ownership::Owner;
use shared::inspect::summary::of_cr;
use shared::{
    api::{
        crd::{Condition, SourceRef},
        keys::{OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION, SOURCE_CLUSTER},
        source::GroupKind,
    },
    copy::adoption::adoption_value,
    inspect::{
        copy_of::{CopyState, CrName, kubectl_name, left_by_event, named_owners, would_write, written_by_us},
        summary::Summary,
    },
    pass::targets::TargetRule,
};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    object: ObjectName,
    /// The CRs its ownership annotations name (one, unless something went wrong).
    owned_by: Vec<Owned>,
    /// For an object no CR owns.
    #[serde(skip_serializing_if = "Option::is_none")]
    not_owned: Option<NotOwned>,
    /// For a copy written from another cluster: that cluster, where its CR was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    written_from: Option<WrittenFrom>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectName {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Owned {
    cr: CrName,
    /// Whether the CR exists.
    exists: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<SourceRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    copy: Option<CopyState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<Summary>,
    conditions: Vec<Condition>,
    events: Vec<EventLine>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NotOwned {
    /// CRs whose spec writes a copy here: each reports `DestinationConflict`.
    would_write: Vec<CrName>,
    /// CRs whose events say they left this object in place (orphaned, or its annotation changed).
    left_by: Vec<CrName>,
    /// Whether the controller ever wrote it (its field manager in `managedFields`).
    written_by_projection: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    #[serde(rename = "type")]
    type_: String,
    reason: String,
    note: String,
    last_seen: Option<String>,
}

impl EventLine {
    pub fn of(event: &Event) -> Self {
        Self {
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            note: event.note.clone().unwrap_or_default(),
            last_seen: last_seen(event).map(|t| t.to_string()),
        }
    }
}

/// The cluster a copy's CR lives in, when the copy was written from another cluster.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WrittenFrom {
    /// That cluster's identity, as the copy names it.
    cluster: String,
    /// The kubeconfig context it was read through.
    context: String,
}

/// Where the CRs that own `object` live: this cluster, or the one of `source_context` when the
/// copy names another (`projection.sh/source-cluster`), checked to be that one.
async fn cluster_of_owners(
    global: &Global,
    object: &Value,
    source_context: Option<&str>,
) -> Result<Option<(Cluster, WrittenFrom)>, Failure> {
    let Some(from) = object["metadata"]["annotations"][SOURCE_CLUSTER].as_str() else {
        return Ok(None);
    };
    let Some(context) = source_context else {
        return Err(Failure::Usage(format!(
            "this copy was written from another cluster (its {SOURCE_CLUSTER} is {from}: that cluster's \
             cluster.clusterset.k8s.io ClusterProperty, or the uid of its kube-system namespace): name \
             that cluster's kubeconfig context with --source-context to read the CR that owns it"
        )));
    };
    let source_global = Global {
        context: Some(context.to_owned()),
        namespace: None,
        ..global.clone()
    };
    let cluster = Cluster::connect(&source_global).await?;
    let identity = runtime::cluster_identity::read(&cluster.client)
        .await
        .with_context(|| format!("reading the identity of context {context}"))?;
    if identity != from {
        return Err(Failure::Usage(format!(
            "context {context} is the cluster {identity}, but this copy was written from {from}: name \
             the context of that cluster"
        )));
    }
    Ok(Some((
        cluster,
        WrittenFrom {
            cluster: from.to_owned(),
            context: context.to_owned(),
        },
    )))
}

/// Runs `why`.
pub async fn run(
    global: &Global,
    reference: &str,
    event_count: usize,
    source_context: Option<&str>,
) -> Result<Code, Failure> {
    let Named {
        cluster,
        resource,
        group_kind,
        namespace,
        name,
        object,
    } = Named::read(global, reference).await?;
    let name = name.as_str();
    let Some(object) = object else {
        return Err(Failure::NotFound(format!(
            "{} {namespace}/{name} not found",
            resource.kind
        )));
    };
    let mut report = Report {
        object: ObjectName {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: namespace.clone(),
            name: name.to_owned(),
        },
        owned_by: Vec::new(),
        not_owned: None,
        written_from: None,
    };
    let owners = named_owners(&object);
    let elsewhere = match owners.is_empty() {
        true => None,
        false => cluster_of_owners(global, &object, source_context).await?,
    };
    let copy_at = Placed {
        cluster: &cluster,
        from: elsewhere.as_ref().map(|(_, from)| from.cluster.as_str()),
        group_kind: &group_kind,
        namespace: &namespace,
        name,
    };
    let crs_in = elsewhere
        .as_ref()
        .map_or(&cluster, |(owners_cluster, _)| owners_cluster);
    for owner in &owners {
        report
            .owned_by
            .push(owned(crs_in, owner, &copy_at, event_count).await?);
    }
    report.written_from = elsewhere.map(|(_, from)| from);
    if owners.is_empty() {
        report.not_owned = Some(not_owned(&cluster, &object, &group_kind, &namespace, name).await?);
    }
    let code = if report.not_owned.is_some() {
        Code::NotManaged
    } else if report.owned_by.iter().all(|o| {
        o.copy == Some(CopyState::Current) && !o.summary.as_ref().is_some_and(Summary::needs_attention)
    }) {
        Code::Ok
    } else {
        Code::Attention
    };
    match structured(&global.output, &report)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&report, global.output == Output::Wide)),
    }
    Ok(code)
}

/// Where the copy is: its cluster (and the one its CR wrote it from, when another), kind and
/// coordinates.
struct Placed<'a> {
    cluster: &'a Cluster,
    from: Option<&'a str>,
    group_kind: &'a GroupKind,
    namespace: &'a str,
    name: &'a str,
}

/// What `owner`, read from `cluster` (the CR's), says of the copy at `copy`.
async fn owned(
    cluster: &Cluster,
    owner: &CrName,
    copy: &Placed<'_>,
    event_count: usize,
) -> Result<Owned, Failure> {
    let (group_kind, namespace, name) = (copy.group_kind, copy.namespace, copy.name);
    let Some(cr) = AnyCr::get(cluster, owner).await? else {
        return Ok(Owned {
            cr: owner.clone(),
            exists: false,
            source: None,
            copy: None,
            summary: None,
            conditions: Vec::new(),
            events: Vec::new(),
        });
    };
    // The copy's kind and name must be the CR's: an annotation copied onto another object names a
    // CR that does not write it.
    let copy = if cr.view().source.group_kind() == *group_kind && cr.view().copy_name == name {
        let built: Built = build_now(cluster, &cr).await?;
        state_in((copy.cluster, copy.from), &cr, &built, namespace).await?
    } else {
        CopyState::Unknown {
            why: format!(
                "{} writes {} copies named {}, not this object",
                kubectl_name(owner),
                cr.view().source.kind,
                cr.view().copy_name.to_owned()
            ),
        }
    };
    let events = cr.events(cluster, event_count).await?;
    Ok(Owned {
        cr: owner.clone(),
        exists: true,
        source: Some(cr.view().source.clone()),
        copy: Some(copy),
        summary: Some(of_cr(&cr.view())),
        conditions: cr.view().status.map(|s| s.conditions.clone()).unwrap_or_default(),
        events: events.iter().map(EventLine::of).collect(),
    })
}

async fn not_owned(
    cluster: &Cluster,
    object: &Value,
    group_kind: &GroupKind,
    namespace: &str,
    name: &str,
) -> Result<NotOwned, Failure> {
    let namespace_labels = Api::<Namespace>::all(cluster.client.clone())
        .get_opt(namespace)
        .await
        .context("reading the namespace")?
        .and_then(|ns| ns.metadata.labels)
        .unwrap_or_default();
    let mut would = Vec::new();
    for cr in every_cr(cluster).await? {
        if !would_write(cr.view().source, cr.view().copy_name, group_kind, name) {
            continue;
        }
        let view = cr.view();
        let here = match view.namespaces {
            None => view.home() == Some(namespace),
            Some(destination) => {
                TargetRule::of(destination).is_ok_and(|rule| rule.selects(namespace, &namespace_labels))
            }
        };
        if here {
            would.push(cr.view().name());
        }
    }
    let path = format!("{namespace}/{name}");
    let mut left = Vec::new();
    for events_namespace in [namespace, "default"] {
        // A ClusterProjection's events are in `default`, which a tenant may not read: skipped.
        let listed = Api::<Event>::namespaced(cluster.client.clone(), events_namespace)
            .list(&ListParams::default())
            .await;
        let what = format!("listing events in {events_namespace}");
        let events = if events_namespace == namespace {
            listed.map_err(|e| anyhow::Error::new(e).context(what))?
        } else {
            let note = || {
                format!(
                    "you may not list events in namespace {events_namespace}; ClusterProjections that left this object are not shown"
                )
            };
            match unless_forbidden(listed, note, &what)? {
                Some(events) => events,
                None => continue,
            }
        };
        for event in events.items {
            let (reason, note) = (
                event.reason.as_deref().unwrap_or_default(),
                event.note.as_deref().unwrap_or_default(),
            );
            if !left_by_event(reason, note, &path) {
                continue;
            }
            let Some(regarding) = &event.regarding else {
                continue;
            };
            let cr = match regarding.kind.as_deref() {
                Some("Projection") => CrName::Projection {
                    namespace: regarding.namespace.clone().unwrap_or_default(),
                    name: regarding.name.clone().unwrap_or_default(),
                },
                Some("ClusterProjection") => CrName::ClusterProjection {
                    name: regarding.name.clone().unwrap_or_default(),
                },
                _ => continue,
            };
            if !left.contains(&cr) {
                left.push(cr);
            }
        }
    }
    would.sort();
    left.sort();
    Ok(NotOwned {
        would_write: would,
        left_by: left,
        written_by_projection: written_by_us(object),
    })
}

fn render(report: &Report, wide: bool) -> String {
    let o = &report.object;
    let mut out = format!("{} {}/{}\n", o.kind, o.namespace, o.name);
    if let Some(not) = &report.not_owned {
        out.push_str(&format!(
            "Not a copy: no Projection or ClusterProjection owns it (no {OWNED_BY_PROJECTION} or \
             {OWNED_BY_CLUSTER_PROJECTION} annotation; a label alone is never trusted).\n"
        ));
        if not.written_by_projection {
            out.push_str("The controller wrote it once: it was released (orphaned by policy, or its ownership annotation was removed or changed).\n");
        }
        for cr in &not.left_by {
            out.push_str(&format!("Left by:     {}\n", kubectl_name(cr)));
        }
        for cr in &not.would_write {
            out.push_str(&format!(
                "Conflict:    {} would write it, and leaves it alone (DestinationConflict); to let it, annotate the object projection.sh/adopt-by={}\n",
                kubectl_name(cr),
                adoption_value(&Owner::of(cr, ""))
            ));
        }
        if not.would_write.is_empty() && not.left_by.is_empty() {
            out.push_str("No CR would write it.\n");
        }
        return out;
    }
    if let Some(from) = &report.written_from {
        out.push_str(&format!(
            "Written from another cluster ({}), read through context {}\n",
            from.cluster, from.context
        ));
    }
    for owned in &report.owned_by {
        out.push_str(&format!("Owned by:    {}\n", kubectl_name(&owned.cr)));
        if !owned.exists {
            out.push_str("             which does not exist (deleted without removing its copies?): the copy is managed by nothing\n");
            continue;
        }
        if let Some(s) = &owned.source {
            let group = if s.group.is_empty() {
                String::new()
            } else {
                format!(".{}", s.group)
            };
            out.push_str(&format!(
                "Source:      {}{group} {}/{}\n",
                s.kind, s.namespace, s.name
            ));
        }
        if let Some(copy) = &owned.copy {
            let line = match copy {
                CopyState::Current => {
                    "current (its projection.sh/source-hash is the source's as the CR builds it now)"
                        .to_owned()
                }
                CopyState::Stale { copy, now } => format!(
                    "stale: the copy carries source-hash {copy}, the source builds {now} now (see the conditions and events)"
                ),
                CopyState::Unstamped => "unknown: the copy carries no projection.sh/source-hash".to_owned(),
                other => other.words(),
            };
            out.push_str(&format!("Copy:        {line}\n"));
        }
        if let Some(summary) = &owned.summary {
            let suspended = if summary.suspended { ", suspended" } else { "" };
            out.push_str(&format!(
                "Ready:       {} {}{suspended}\n",
                summary.ready, summary.reason
            ));
        }
        out.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = owned
            .conditions
            .iter()
            .map(|c| {
                let mut row = vec![c.r#type.clone(), c.status.clone(), c.reason.clone()];
                row.push(c.last_transition_time.0.to_string());
                row.push(or_none(&c.message));
                row
            })
            .collect();
        out.push_str(&indent(&table(
            &["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
            &rows,
        )));
        out.push_str("Events:\n");
        if owned.events.is_empty() {
            out.push_str("  <none>\n");
        } else {
            let rows: Vec<Vec<String>> = owned
                .events
                .iter()
                .map(|e| {
                    let note = if wide || e.note.chars().count() <= 120 {
                        e.note.clone()
                    } else {
                        e.note.chars().take(117).collect::<String>() + "..."
                    };
                    vec![
                        e.last_seen.clone().unwrap_or_default(),
                        e.type_.clone(),
                        e.reason.clone(),
                        note,
                    ]
                })
                .collect();
            out.push_str(&indent(&table(
                &["LAST SEEN", "TYPE", "REASON", "MESSAGE"],
                &rows,
            )));
        }
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}
