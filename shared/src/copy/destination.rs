//! Building a copy from a source object: a pure function of the source, the overlay, the owner and
//! the target coordinates.

use crate::{
    api::copy_spec::MetadataFilter,
    api::crd::Overlay,
    api::keys::{RESERVED_PREFIX, SOURCE_CLUSTER},
    copy::metadata_hygiene::{MetadataField, travels},
    copy::ownership::Owner,
};
use serde_json::{Map, Value};

/// Where a copy goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// Namespace of the copy.
    pub namespace: String,
    /// Name of the copy.
    pub name: String,
}

/// Annotations a controller writes on an object to record its own progress. Copying them would make
/// the copy's controller and us overwrite each other forever.
const CONTROLLER_STATE_ANNOTATIONS: &[(&str, &str, &str)] = &[
    ("apps", "Deployment", "deployment.kubernetes.io/revision"),
    ("", "PersistentVolumeClaim", "pv.kubernetes.io/bind-completed"),
    (
        "",
        "PersistentVolumeClaim",
        "pv.kubernetes.io/bound-by-controller",
    ),
    ("", "PersistentVolumeClaim", "volume.kubernetes.io/selected-node"),
    (
        "",
        "PersistentVolumeClaim",
        "volume.kubernetes.io/storage-provisioner",
    ),
    (
        "",
        "PersistentVolumeClaim",
        "volume.beta.kubernetes.io/storage-provisioner",
    ),
];

/// Labels the Job controller generates into a Job's pod template; they name the source Job.
const JOB_GENERATED_TEMPLATE_LABELS: &[&str] = &[
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "controller-uid",
    "job-name",
];

/// Builds the copy of `source` (a full object as read from the apiserver) for `owner` at `target`,
/// with every label and annotation travelling that the default hygiene list lets through.
///
/// Only `metadata.labels` and `metadata.annotations` survive from the source's metadata; `status`,
/// the keys of [`NEVER_TRAVELS`](crate::copy::metadata_hygiene::NEVER_TRAVELS) (another tool's tracking
/// and ownership keys, `kubectl.kubernetes.io/last-applied-configuration`), every `projection.sh/`
/// key and fields the apiserver allocated per object are dropped. The overlay is merged over the
/// labels and annotations (overlay wins), then the owner's stamp is written last so nothing can
/// override it. The controller builds through [`crate::copy::content::BuiltContent`], which adds the spec's
/// `metadata`, `keys` and `fields` rules and the source hash to these same steps.
pub fn build_destination(source: &Value, overlay: Option<&Overlay>, owner: &Owner, target: &Target) -> Value {
    let mut copy = build_content(source, overlay, None);
    stamp_owner(&mut copy, owner, target);
    copy
}

/// The copy's content before it is placed: the source's object without server metadata and status,
/// its labels and annotations filtered by the hygiene list and `metadata` (see
/// [`travels`]), the overlay merged over them. Its metadata holds only `labels` and `annotations`.
pub fn build_content(source: &Value, overlay: Option<&Overlay>, metadata: Option<&MetadataFilter>) -> Value {
    let mut copy = source.as_object().cloned().unwrap_or_default();
    copy.remove("status");
    let group = api_group(copy.get("apiVersion"));
    let kind = copy
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let core_kind = if group.is_empty() { kind.as_str() } else { "" };

    let source_meta = copy.remove("metadata").unwrap_or(Value::Null);
    let mut labels = string_map(&source_meta["labels"]);
    let mut annotations = string_map(&source_meta["annotations"]);
    let label_filter = metadata.and_then(|m| m.labels.as_ref());
    let annotation_filter = metadata.and_then(|m| m.annotations.as_ref());
    labels.retain(|k, _| travels(MetadataField::Labels, core_kind, k, label_filter));
    annotations.retain(|k, _| {
        travels(MetadataField::Annotations, core_kind, k, annotation_filter)
            && !CONTROLLER_STATE_ANNOTATIONS
                .iter()
                .any(|(g, kd, a)| *g == group && *kd == kind && a == k)
    });
    if let Some(overlay) = overlay {
        merge_overlay(&mut labels, overlay.labels.as_ref());
        merge_overlay(&mut annotations, overlay.annotations.as_ref());
    }

    let mut metadata = Map::new();
    metadata.insert("labels".into(), Value::Object(labels));
    metadata.insert("annotations".into(), Value::Object(annotations));
    copy.insert("metadata".into(), Value::Object(metadata));

    drop_allocated_fields(&group, &kind, &mut copy);
    Value::Object(copy)
}

/// Places built content at `target` and stamps `owner`'s ownership keys, last, so nothing built from
/// the source or the spec can change them.
pub fn stamp_owner(copy: &mut Value, owner: &Owner, target: &Target) {
    if let Some(metadata) = object_at(copy, "metadata") {
        metadata.insert("name".into(), Value::String(target.name.clone()));
        metadata.insert("namespace".into(), Value::String(target.namespace.clone()));
    }
    if let Some(annotations) = metadata_map(copy, "annotations") {
        annotations.insert(
            owner.annotation_key().to_owned(),
            Value::String(owner.annotation_value()),
        );
        if let Some(cluster) = owner.cluster() {
            annotations.insert(SOURCE_CLUSTER.to_owned(), Value::String(cluster.to_owned()));
        }
    }
    if let Some(labels) = metadata_map(copy, "labels") {
        labels.insert(
            owner.uid_label_key().to_owned(),
            Value::String(owner.uid().to_owned()),
        );
    }
}

/// `metadata.<field>` of `copy` (`labels` or `annotations`), created when absent or not a map;
/// `None` only when `copy` is not an object.
pub(crate) fn metadata_map<'a>(copy: &'a mut Value, field: &str) -> Option<&'a mut Map<String, Value>> {
    let metadata = object_at(copy, "metadata")?;
    let entry = metadata.entry(field).or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut()
}

/// The object under `key` of the object `value`, created when absent or not an object.
fn object_at<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    let entry = value
        .as_object_mut()?
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut()
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
fn api_group(api_version: Option<&Value>) -> String {
    let api_version = api_version.and_then(Value::as_str).unwrap_or_default();
    api_version
        .rsplit_once('/')
        .map(|(g, _)| g.to_owned())
        .unwrap_or_default()
}

fn string_map(value: &Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

fn merge_overlay(
    into: &mut Map<String, Value>,
    overlay: Option<&std::collections::BTreeMap<String, String>>,
) {
    for (k, v) in overlay.into_iter().flatten() {
        // Reserved keys are refused at admission; never let one through here either.
        if !k.starts_with(RESERVED_PREFIX) {
            into.insert(k.clone(), Value::String(v.clone()));
        }
    }
}

/// Removes what the apiserver or a controller allocated for the source object and would refuse, or
/// allocate anew, for the copy.
fn drop_allocated_fields(group: &str, kind: &str, copy: &mut Map<String, Value>) {
    let Some(spec) = copy.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    match (group, kind) {
        ("", "Service") => {
            // A headless Service keeps `clusterIP: None`: dropping it would make the copy a ClusterIP
            // Service.
            let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
            if !headless {
                for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                    spec.remove(field);
                }
            }
            // Node ports are unique per cluster: the copy gets its own.
            spec.remove("healthCheckNodePort");
            for port in spec
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(port) = port.as_object_mut() {
                    port.remove("nodePort");
                }
            }
        }
        ("", "PersistentVolumeClaim") => {
            spec.remove("volumeName");
        }
        ("", "Pod") => {
            spec.remove("nodeName");
        }
        ("batch", "Job") => {
            // The selector and these labels carry the source Job's controller UID; the apiserver
            // generates fresh ones for the copy.
            spec.remove("selector");
            if let Some(labels) = spec
                .get_mut("template")
                .and_then(|t| t.get_mut("metadata"))
                .and_then(|m| m.get_mut("labels"))
                .and_then(Value::as_object_mut)
            {
                labels.retain(|k, _| !JOB_GENERATED_TEMPLATE_LABELS.contains(&k.as_str()));
            }
        }
        _ => {}
    }
}
