//! `kubectl projection preview -f FILE`: what a Projection or ClusterProjection would write now, per
//! namespace, made by the controller's own decisions (`shared::pass::plan::plan` and
//! `shared::copy::write_plan::decide`) on what the cluster holds. Nothing is written. A manifest the
//! webhook would refuse is refused with the webhook's message (`shared::admission::validation`).

use crate::{
    cli::{Global, Output},
    cluster::Cluster,
    crs::AnyCr,
    exit::{Code, Failure},
    output::{or_none, structured, table},
};
use anyhow::Context as _;
use kube::api::{Api, DynamicObject, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::{
    admission::validation::{check_cluster_projection, check_projection},
    api::{
        crd::{
            ClusterProjection, ClusterProjectionSpec, Projection, ProjectionSpec, SourceRef,
            WrittenDestination,
        },
        source::cluster_scoped_message,
    },
    copy::{content::BuiltContent, destination::Target, write_plan::decide},
    inspect::{
        copy_of::{CrName, kubectl_name, owner_of},
        preview::{Row, action_word, needs_attention, refused, rows},
    },
    pass::{
        lifecycle::{is_suspended, requested_at, stamp_request},
        plan::{CopyView, Destinations, PassInput, plan},
        targets::{TargetRule, Targets},
    },
    policy::{
        kind_policy::{AllowedPowerKinds, check_kind, check_object},
        projectable::{SourceMode, check_projectable},
    },
};
use std::{io::Read as _, path::PathBuf};

/// The controller's settings a preview takes into account.
pub struct Settings {
    pub source_mode: SourceMode,
    pub allow_power_kinds: AllowedPowerKinds,
}

/// A manifest that passed validation.
struct Manifest {
    cr: AnyCr,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Preview {
    #[serde(flatten)]
    cr: CrName,
    source: SourceRef,
    /// Whether the CR exists in the cluster (its status and copies are then taken into account).
    exists: bool,
    suspended: bool,
    /// Why nothing would be written at all, when so (the reason the controller would report).
    #[serde(skip_serializing_if = "Option::is_none")]
    stopped: Option<Stopped>,
    rows: Vec<Row>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Stopped {
    reason: String,
    message: String,
}

/// Runs `preview`.
pub async fn run(global: &Global, files: &[PathBuf], settings: &Settings) -> Result<Code, Failure> {
    let mut documents = Vec::new();
    for file in files {
        documents.extend(read_documents(file)?);
    }
    let cluster = Cluster::connect(global).await?;
    let manifests = documents
        .into_iter()
        .map(|doc| check(doc, &cluster.namespace, settings))
        .collect::<Result<Vec<_>, _>>()?;
    let mut previews = Vec::new();
    for manifest in &manifests {
        previews.push(preview(&cluster, manifest, settings).await?);
    }
    let attention = previews
        .iter()
        .any(|p| p.stopped.is_some() || needs_attention(&p.rows));
    match structured(global.output, &previews)? {
        Some(text) => print!("{text}"),
        None => print!("{}", render(&previews, global.output == Output::Wide)),
    }
    Ok(if attention { Code::Attention } else { Code::Ok })
}

/// The documents of a file (`-` is standard input): YAML or JSON, several per file, `List`s opened.
fn read_documents(file: &PathBuf) -> Result<Vec<Value>, Failure> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Failure::NotFound(format!("file {} not found", file.display())),
            _ => Failure::Error(anyhow::Error::new(e).context(format!("reading {}", file.display()))),
        })?
    };
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("parsing {}", file.display()))?;
        let value: Value = serde_json::to_value(value).context("reading a document")?;
        match value {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                documents.extend(
                    o.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            other => documents.push(other),
        }
    }
    Ok(documents)
}

/// Validates a document as the webhook does: the same functions, the same messages.
fn check(document: Value, default_namespace: &str, settings: &Settings) -> Result<Manifest, Failure> {
    let kind = document["kind"].as_str().unwrap_or_default().to_owned();
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let name = document["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if api_version != "projection.sh/v1" || !matches!(kind.as_str(), "Projection" | "ClusterProjection") {
        return Err(Failure::Invalid(format!(
            "{api_version} {kind} {name:?} is not a projection.sh/v1 Projection or ClusterProjection"
        )));
    }
    if name.is_empty() {
        return Err(Failure::Invalid(format!("{kind}: metadata.name is required")));
    }
    let denied = |message: String| Failure::Invalid(format!("{kind} {name} would be denied: {message}"));
    let mut document = document;
    let spec = document.get("spec");
    let cr = if kind == "Projection" {
        let namespace = document["metadata"]["namespace"]
            .as_str()
            .unwrap_or(default_namespace)
            .to_owned();
        let spec: ProjectionSpec = check_projection(&namespace, spec).map_err(|e| denied(e.to_string()))?;
        document["metadata"]["namespace"] = Value::String(namespace);
        document["spec"] = serde_json::to_value(&spec).context("encoding the spec")?;
        let mut cr: Projection = serde_json::from_value(document).map_err(|e| denied(e.to_string()))?;
        cr.status = None;
        AnyCr::Projection(cr)
    } else {
        let spec: ClusterProjectionSpec =
            check_cluster_projection(spec).map_err(|e| denied(e.to_string()))?;
        document["spec"] = serde_json::to_value(&spec).context("encoding the spec")?;
        let mut cr: ClusterProjection =
            serde_json::from_value(document).map_err(|e| denied(e.to_string()))?;
        cr.status = None;
        AnyCr::Cluster(cr)
    };
    check_kind(&cr.source().group_kind(), &settings.allow_power_kinds).map_err(denied)?;
    Ok(Manifest { cr })
}

async fn preview(cluster: &Cluster, manifest: &Manifest, settings: &Settings) -> Result<Preview, Failure> {
    let cr = &manifest.cr;
    let source = cr.source().clone();
    let in_cluster = AnyCr::get(cluster, &cr.name()).await?;
    let controls = match cr {
        AnyCr::Projection(p) => &p.spec.controls,
        AnyCr::Cluster(c) => &c.spec.controls,
    };
    let mut out = Preview {
        cr: cr.name(),
        source: source.clone(),
        exists: in_cluster.is_some(),
        suspended: is_suspended(controls.suspend),
        stopped: None,
        rows: Vec::new(),
    };
    let stop = |mut out: Preview, reason: &str, message: String| {
        out.stopped = Some(Stopped {
            reason: reason.to_owned(),
            message,
        });
        Ok(out)
    };
    let (resource, namespaced) = match cluster.resolve_source(&source).await? {
        Some(found) => found,
        None => {
            return stop(
                out,
                "SourceResolutionFailed",
                format!("the source's kind {} is not served", source.group_kind()),
            );
        }
    };
    if !namespaced {
        return Err(Failure::Invalid(format!(
            "{} {} would be denied: {}",
            cr.kind(),
            cr.name(),
            cluster_scoped_message(&source)
        )));
    }
    let object = cluster
        .objects(&resource, &source.namespace)
        .get_opt(&source.name)
        .await
        .context("reading the source")?;
    let Some(object) = object else {
        return stop(
            out,
            "SourceNotFound",
            format!(
                "source {}/{} not found: nothing is written",
                source.namespace, source.name
            ),
        );
    };
    if let Err(blocked) = check_projectable(
        settings.source_mode,
        object.metadata.annotations.as_ref(),
        &source.namespace,
        &source.name,
    ) {
        return stop(out, blocked.reason.as_str(), blocked.message);
    }
    let secret_type = object.data.get("type").and_then(Value::as_str);
    if let Err(message) = check_object(&source.group_kind(), secret_type, &settings.allow_power_kinds) {
        return stop(out, "SourceNotProjectable", message);
    }
    // The CR as stored (if it is) gives the status and the UID its copies carry.
    let uid = in_cluster
        .as_ref()
        .and_then(|c| c.meta().uid.clone())
        .unwrap_or_default();
    let owner = owner_of(&cr.name(), &uid);
    let copy_name = cr.copy_name();
    let (scope, targets) = match cr {
        AnyCr::Projection(_) => (
            Destinations::OwnNamespace,
            Targets::own_namespace(&cr.namespace(), &source, &copy_name),
        ),
        AnyCr::Cluster(c) => match TargetRule::of(&c.spec.destination) {
            Ok(rule) => (
                Destinations::Namespaces,
                rule.resolve(&cluster.namespaces().await?, &source, &copy_name),
            ),
            Err(e) => return stop(out, "TargetResolutionFailed", e.0),
        },
    };
    let (recorded, applied_once) = match &in_cluster {
        Some(AnyCr::Projection(p)) => p.status.as_ref().map_or((None, None), |s| {
            (s.written_destination.clone(), s.applied_once.clone())
        }),
        Some(AnyCr::Cluster(c)) => c.status.as_ref().map_or((None, None), |s| {
            (s.written_destination.clone(), s.applied_once.clone())
        }),
        None => (None, None),
    };
    // Our copies of the kind, found as the controller finds them: by the CR's UID label, then
    // trusted only by the ownership annotation.
    let labelled: Vec<DynamicObject> = if uid.is_empty() {
        Vec::new()
    } else {
        let api: Api<DynamicObject> = match cr {
            AnyCr::Projection(_) => cluster.objects(&resource, &cr.namespace()),
            AnyCr::Cluster(_) => Api::all_with(cluster.client.clone(), &resource),
        };
        let params = ListParams::default().labels(&format!("{}={uid}", owner.uid_label_key()));
        api.list(&params).await.context("listing the copies")?.items
    };
    let ours: Vec<&DynamicObject> = labelled
        .iter()
        .filter(|o| owner.owns(o.metadata.annotations.as_ref()))
        .collect();
    let existing: Vec<CopyView<'_>> = ours
        .iter()
        .map(|o| CopyView {
            namespace: o.metadata.namespace.as_deref().unwrap_or_default(),
            name: o.metadata.name.as_deref().unwrap_or_default(),
            ours: true,
        })
        .collect();
    let copies = WrittenDestination::of(&resource, &copy_name);
    let input = PassInput {
        scope,
        copies: &copies,
        recorded: recorded.as_ref(),
        targets: &targets,
        forbidden: &[],
        existing: &existing,
        sync_policy: controls.sync_policy,
        applied_once: applied_once.as_ref(),
    };
    let plan = match plan(&input) {
        Ok(plan) => plan,
        Err(refusal) => {
            out.rows = refused(&cr.namespace(), &copy_name, &refusal.message);
            return Ok(out);
        }
    };
    let source_value = serde_json::to_value(&object).context("encoding the source")?;
    let built = match BuiltContent::build(&source_value, &cr.rules()) {
        Ok(built) => built,
        Err(refused) => return stop(out, "DestinationInvalid", refused.message),
    };
    let requested = requested_at(cr.meta().annotations.as_ref());
    let mut decisions = Vec::new();
    for namespace in &plan.write {
        let target = Target {
            namespace: namespace.clone(),
            name: copy_name.clone(),
        };
        let mut desired = built.place(&owner, &target);
        stamp_request(&mut desired, requested);
        let current = crate::copies::read_copy(cluster, &resource, namespace, &copy_name).await?;
        decisions.push((
            namespace.clone(),
            decide(current.as_ref(), &desired, &owner, plan.existing),
        ));
    }
    out.rows = rows(&plan, &decisions, out.suspended);
    Ok(out)
}

fn render(previews: &[Preview], wide: bool) -> String {
    let mut out = String::new();
    for (i, p) in previews.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let s = &p.source;
        let group = if s.group.is_empty() {
            String::new()
        } else {
            format!(".{}", s.group)
        };
        let state = if p.exists { "exists" } else { "new" };
        out.push_str(&format!(
            "{} ({state}) of {}{group} {}/{}:\n",
            kubectl_name(&p.cr),
            s.kind,
            s.namespace,
            s.name
        ));
        if let Some(stopped) = &p.stopped {
            out.push_str(&format!(
                "  nothing would be written: {} ({})\n",
                stopped.message, stopped.reason
            ));
            continue;
        }
        if p.rows.is_empty() {
            out.push_str("  no target namespace\n");
            continue;
        }
        let rows: Vec<Vec<String>> = p
            .rows
            .iter()
            .map(|r| {
                let mut detail = r.detail.clone();
                if !wide && detail.chars().count() > 100 {
                    detail = detail.chars().take(97).collect::<String>() + "...";
                }
                vec![
                    r.namespace.clone(),
                    r.name.clone(),
                    action_word(r.action).to_owned(),
                    or_none(&detail),
                ]
            })
            .collect();
        for line in table(&["NAMESPACE", "NAME", "ACTION", "DETAIL"], &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}
