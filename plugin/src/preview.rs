//! `kubectl projection preview -f FILE`: what a Projection or ClusterProjection would write now, per
//! namespace: the controller's pass over what the cluster holds, with the controller's own
//! decisions (`shared::pass::source`, `shared::pass::plan::PassInput::of` and `plan`,
//! `shared::copy::write_plan::decide`) and the author checks asked as the user who runs it, and a
//! writer that only describes. Nothing is written. A manifest the webhook would refuse is refused
//! with the webhook's message (`shared::admission::validation`).

use crate::{
    access::Asker,
    cli::{Global, Output},
    cluster::Cluster,
    crs::AnyCr,
    exit::{Code, Failure},
    other_cluster,
    output::{or_none, structured, table},
};
use anyhow::Context as _;
use futures::StreamExt;
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
        kind::{CrName, CrView, ProjectionCr},
        reason::Reason,
        source::cluster_scoped_message,
    },
    copy::{
        content::{BuiltContent, CopyRules},
        destination::Target,
        ownership::Owner,
        write_plan::{WriteDecision, decide},
    },
    inspect::{
        copy_of::kubectl_name,
        preview::{Row, action_word, needs_attention, refused, rows},
    },
    pass::{
        lifecycle::{is_suspended, requested_at, stamp_request},
        plan::{CopyView, PassInput, Plan, plan},
        source::{author_questions, check_read, missing, read_denied, secret_denied},
        status::Stop,
        targets::targets_of,
    },
    policy::{
        author::{AccessQuestion, Author, denial_message},
        kind_policy::{AllowedPowerKinds, check_kind},
        kubeconfig::KubeconfigSecret,
        projectable::SourceMode,
    },
};
use std::{io::Read as _, path::PathBuf};

/// How many author questions a preview asks at once.
const ASKED_AT_ONCE: usize = 16;

/// The controller's settings a preview takes into account.
pub struct Settings {
    pub source_mode: SourceMode,
    pub allow_power_kinds: AllowedPowerKinds,
    /// Whether the controller checks the CR's author (`--author-access=enforce`).
    pub author_checked: bool,
    /// Whether the author checks are asked as the CR's recorded author, impersonated.
    pub as_author: bool,
    /// Where a ClusterProjection's kubeconfig Secret lives (`--controller-namespace`).
    pub controller_namespace: String,
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
    // The author checks are asked as the user who runs the plugin, unless `--as-author`.
    let me = match settings.author_checked && !settings.as_author {
        true => Some(Asker::whoami(&cluster.client).await?),
        false => None,
    };
    let mut previews = Vec::new();
    for manifest in &manifests {
        previews.push(preview(&cluster, manifest, (settings, me.as_ref())).await?);
    }
    let attention = previews
        .iter()
        .any(|p| p.stopped.is_some() || needs_attention(&p.rows));
    match structured(&global.output, &previews)? {
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
    check_kind(&cr.view().source.group_kind(), &settings.allow_power_kinds).map_err(denied)?;
    Ok(Manifest { cr })
}

/// The preview of one manifest: the controller's pass over it (the manifest's spec, with the status
/// and UID of the CR in the cluster, if it exists), whose writer only describes.
async fn preview(
    cluster: &Cluster,
    manifest: &Manifest,
    (settings, asker): (&Settings, Option<&Asker>),
) -> Result<Preview, Failure> {
    let mut cr = manifest.cr.clone();
    let stored = AnyCr::get(cluster, &cr.view().name()).await?;
    // The author recorded on the CR in the cluster, else on the manifest.
    let recorded = Author::recorded_in(stored.as_ref().unwrap_or(&cr).view().meta.annotations.as_ref())
        .or_else(|_| Author::recorded_in(cr.view().meta.annotations.as_ref()));
    if let Some(stored) = &stored {
        cr.take_state_of(stored);
    }
    let view = cr.view();
    let suspended = is_suspended(view.controls.suspend);
    let mut out = Preview {
        cr: view.name(),
        source: view.source.clone(),
        exists: stored.is_some(),
        suspended,
        stopped: None,
        rows: Vec::new(),
    };
    let impersonated;
    let asker = match (settings.author_checked && settings.as_author, recorded) {
        (false, _) => asker,
        (true, Ok(author)) => {
            impersonated = Asker::impersonating(cluster, &author)?;
            Some(&impersonated)
        }
        // As the controller: no record, nothing written.
        (true, Err(problem)) => {
            out.stopped = Some(Stopped {
                reason: Reason::SourceForbidden.as_str().to_owned(),
                message: problem.to_string(),
            });
            return Ok(out);
        }
    };
    match pass(cluster, &view, (settings, asker)).await? {
        Ok((plan, decisions)) => out.rows = rows(&plan, &decisions, suspended),
        // A Projection onto its own source: the whole pass is refused, shown as its one row.
        Err(Stop::Destination {
            reason: Reason::DestinationConflict,
            message,
            ..
        }) => out.rows = refused(view.home().unwrap_or_default(), view.copy_name, &message),
        Err(stop) => {
            out.stopped = Some(Stopped {
                reason: stop.reason().as_str().to_owned(),
                message: stop.message().to_owned(),
            })
        }
    }
    Ok(out)
}

/// The controller's pass over `cr`, reading what it reads and deciding with the same functions
/// (`shared::pass::source`, `shared::pass::targets`, `shared::pass::plan`, `write_plan::decide`):
/// its plan and, per namespace it writes, what its writer would do; or why it stops. The author
/// checks are asked as the user who runs the plugin (`asker`; none with `--author-access trusted`).
async fn pass(
    cluster: &Cluster,
    cr: &CrView<'_>,
    (settings, asker): (&Settings, Option<&Asker>),
) -> Result<Result<(Plan, Vec<(String, WriteDecision)>), Stop>, Failure> {
    let source = cr.source;
    let not_served = |message| Stop::Source {
        reason: Reason::SourceResolutionFailed,
        message,
        transient: false,
    };
    let (resource, namespaced) = match cluster.resolve_source(source).await? {
        Some(found) => found,
        None => {
            let message = format!("the source's kind {} is not served", source.group_kind());
            return Ok(Err(not_served(message)));
        }
    };
    if !namespaced {
        return Err(Failure::Invalid(format!(
            "{} {} would be denied: {}",
            cr.scope.kind(),
            cr.name(),
            cluster_scoped_message(source)
        )));
    }
    // Copies that go to another cluster: its kubeconfig Secret, here.
    let secret = KubeconfigSecret::of(cr, &settings.controller_namespace);
    // The author first: nothing of the source is read for an author who may not read it. For
    // another cluster, the second question is whether they may get its Secret: there, the
    // kubeconfig's identity is the only authority.
    let (read_question, create_question) = author_questions(cr, &resource);
    let create_question = secret
        .as_ref()
        .map_or(create_question, KubeconfigSecret::question);
    let mut everywhere = true;
    if let Some(asker) = asker {
        if let Some(why) = asker.denied(&read_question).await? {
            return Ok(Err(read_denied(
                &asker.author,
                &read_question,
                why.as_deref(),
                &resource,
            )));
        }
        let denied = asker.denied(&create_question).await?;
        if let (Some(secret), Some(why)) = (&secret, &denied) {
            let question = (&create_question, secret);
            return Ok(Err(secret_denied(&asker.author, question, why.as_deref(), "")));
        }
        everywhere = denied.is_none() || secret.is_some();
    }
    let there = match &secret {
        None => None,
        Some(secret) => {
            match other_cluster::open(cluster, secret, cr.recorded().and_then(|r| r.cluster.as_deref()))
                .await?
            {
                Ok(there) => Some(there),
                Err((reason, message)) => {
                    return Ok(Err(Stop::Destination {
                        reason,
                        message,
                        resolved: String::new(),
                    }));
                }
            }
        }
    };
    // Where the copies are: here, or the other cluster, whose copies name this one.
    let (copies_at, owner) = match &there {
        Some((there, identity)) => (there, Owner::of_cr(cr).from_cluster(identity)),
        None => (cluster, Owner::of_cr(cr)),
    };
    let object = cluster
        .objects(&resource, &source.namespace)
        .get_opt(&source.name)
        .await
        .context("reading the source")?;
    let Some(object) = object else {
        return Ok(Err(missing(source, resource, cr.ever_projected())));
    };
    let rules = (settings.source_mode, &settings.allow_power_kinds);
    if let Err(stop) = check_read(source, (&object, &resource), rules) {
        return Ok(Err(stop));
    }
    let resolved = String::new();
    let targets = match targets_of(cr, &copies_at.namespaces().await?) {
        Ok(targets) => targets,
        Err(message) => {
            return Ok(Err(Stop::Destination {
                reason: Reason::TargetResolutionFailed,
                message,
                resolved,
            }));
        }
    };
    let mut forbidden = Vec::new();
    if let Some(asker) = asker.filter(|_| !everywhere) {
        // Namespace by namespace, a few at once (as the controller asks them).
        let answers: Vec<Result<Option<(String, String)>, Failure>> = futures::stream::iter(&targets.write)
            .map(|namespace| {
                let resource = &resource;
                async move {
                    let question =
                        AccessQuestion::create_copies(&resource.group, &resource.plural, namespace);
                    let denied = asker.denied(&question).await?;
                    Ok(denied.map(|why| {
                        let message = denial_message(&asker.author, &question, why.as_deref());
                        (namespace.clone(), message)
                    }))
                }
            })
            .buffered(ASKED_AT_ONCE)
            .collect()
            .await;
        for answer in answers {
            forbidden.extend(answer?);
        }
    }
    // Our copies of the kind, found as the controller finds them: by the CR's UID label, then
    // trusted only by the ownership annotation.
    let labelled: Vec<DynamicObject> = if cr.uid().is_empty() {
        Vec::new()
    } else {
        let api: Api<DynamicObject> = match cr.home() {
            Some(home) => copies_at.objects(&resource, home),
            None => Api::all_with(copies_at.client.clone(), &resource),
        };
        let params = ListParams::default().labels(&format!("{}={}", owner.uid_label_key(), cr.uid()));
        api.list(&params).await.context("listing the copies")?.items
    };
    let existing: Vec<CopyView<'_>> = labelled
        .iter()
        .filter(|o| owner.owns(o.metadata.annotations.as_ref()))
        .map(|o| CopyView {
            namespace: o.metadata.namespace.as_deref().unwrap_or_default(),
            name: o.metadata.name.as_deref().unwrap_or_default(),
            ours: true,
        })
        .collect();
    let copies = WrittenDestination::of(&resource, cr.copy_name);
    let input = PassInput::of(cr, (&resolved, &copies), &targets, &forbidden, &existing);
    let plan = match plan(&input) {
        Ok(plan) => plan,
        Err(stop) => return Ok(Err(stop)),
    };
    let source_value = serde_json::to_value(&object).context("encoding the source")?;
    let built = match BuiltContent::build(&source_value, &CopyRules::of(cr.controls)) {
        Ok(built) => built,
        Err(refused) => {
            return Ok(Err(Stop::Destination {
                reason: Reason::DestinationInvalid,
                message: refused.message,
                resolved,
            }));
        }
    };
    // The writer, dry: what it would decide for each copy, as it is now.
    let requested = requested_at(cr.meta.annotations.as_ref());
    let mut decisions = Vec::new();
    for namespace in &plan.write {
        let target = Target {
            namespace: namespace.clone(),
            name: cr.copy_name.to_owned(),
        };
        let mut desired = built.place(&owner, &target);
        stamp_request(&mut desired, requested);
        let current = crate::copies::read_copy(copies_at, &resource, namespace, cr.copy_name).await?;
        decisions.push((
            namespace.clone(),
            decide(current.as_ref(), &desired, &owner, plan.existing),
        ));
    }
    Ok(Ok((plan, decisions)))
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
