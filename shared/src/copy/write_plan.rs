//! Deciding whether an owned copy needs a write, and which write: a JSON merge patch that sets what we
//! manage and removes what we once set and the source no longer has, and nothing else. Fields other
//! writers added are never touched, and an up-to-date copy gets no request at all.
//!
//! What "we once set" means comes from the copy's `managedFields`: the apiserver records, per field
//! manager, which fields each writer last changed. Lists are compared as a whole (a merge patch
//! replaces them), maps key by key.

use crate::{
    api::keys::FIELD_MANAGER,
    copy::{
        adoption::{Consent, adoption_patch, consent},
        ownership::Owner,
    },
    pass::plan::Existing,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The result of comparing a copy with what it should be.
#[derive(Clone, Debug, PartialEq)]
pub enum WritePlan {
    /// Nothing to write.
    UpToDate,
    /// A JSON merge patch, with `metadata.resourceVersion` set as a precondition.
    Patch(Value),
}

/// What writing one copy does with the object found at its coordinates: the one decision of the
/// controller's writer (which adds only I/O, its journal and its fast paths), and of the kubectl
/// plugin's `preview`, which makes it without writing.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteDecision {
    /// Nothing is there: the copy is created.
    Create,
    /// Our copy already matches: nothing is sent.
    UpToDate,
    /// Our copy is left as it is (`syncPolicy: ApplyOnce` keeps what exists).
    Kept,
    /// Our copy differs: this JSON merge patch (with a resourceVersion precondition) updates it.
    Update(Value),
    /// A stranger's object whose owner consented (`projection.sh/adopt-by`): this patch makes it
    /// our copy and removes the consent.
    Adopt(Value),
    /// A stranger's object without consent: left alone; the conflict message.
    Conflict(String),
}

/// Decides what writing `desired` (a built copy of `owner`) does with `current`, the object at its
/// coordinates as stored (`None` when nothing is there), when `existing` copies are updated or kept.
/// Only the ownership annotation makes `current` ours; anything else is adopted only with consent.
pub fn decide(current: Option<&Value>, desired: &Value, owner: &Owner, existing: Existing) -> WriteDecision {
    let Some(current) = current else {
        return WriteDecision::Create;
    };
    let ours = current["metadata"]["annotations"]
        .get(owner.annotation_key())
        .and_then(Value::as_str)
        .is_some_and(|v| owner.is_annotation_value(v));
    if !ours {
        let meta: ObjectMeta = serde_json::from_value(current["metadata"].clone()).unwrap_or_default();
        if let Consent::Refused(message) = consent(&meta, owner) {
            return WriteDecision::Conflict(message);
        }
        return WriteDecision::Adopt(match plan_update(current, desired, FIELD_MANAGER) {
            WritePlan::UpToDate => adoption_patch(Value::Object(Map::new())),
            WritePlan::Patch(p) => adoption_patch(p),
        });
    }
    if existing == Existing::Keep {
        return WriteDecision::Kept;
    }
    match plan_update(current, desired, FIELD_MANAGER) {
        WritePlan::UpToDate => WriteDecision::UpToDate,
        WritePlan::Patch(p) => WriteDecision::Update(p),
    }
}

/// Keys an apiserver allocates inside list items of a copy (Service ports' `nodePort`): their
/// presence on the copy alone is no difference.
const ALLOCATED_ITEM_KEYS: &[&str] = &["nodePort"];

/// Compares `existing` (the copy as stored) with `desired` (built from the source) for the writer
/// `field_manager`.
pub fn plan_update(existing: &Value, desired: &Value, field_manager: &str) -> WritePlan {
    let owned = owned_fields(existing, field_manager);
    let mut patch = Map::new();

    // Top-level content: everything but identity, metadata and status.
    let empty = Map::new();
    let desired_obj = desired.as_object().unwrap_or(&empty);
    let content_keys = |m: &Map<String, Value>| {
        m.keys()
            .filter(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut top = Map::new();
    for key in content_keys(desired_obj) {
        top.insert(key.clone(), desired_obj[&key].clone());
    }
    let mut owned_top = owned.clone();
    owned_top
        .children
        .retain(|k, _| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
    if let Some(Value::Object(p)) = diff(Some(existing), &Value::Object(top), Some(&owned_top)) {
        patch.extend(p);
    }

    // Labels and annotations, key by key.
    let owned_meta = owned.children.get("metadata");
    let mut meta_patch = Map::new();
    for field in ["labels", "annotations"] {
        let desired_map = desired["metadata"]
            .get(field)
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        let owned_map = owned_meta.and_then(|m| m.children.get(field));
        if let Some(p) = diff(existing["metadata"].get(field), &desired_map, owned_map) {
            meta_patch.insert(field.to_owned(), p);
        }
    }
    if !meta_patch.is_empty() {
        patch.insert("metadata".into(), Value::Object(meta_patch));
    }

    if patch.is_empty() {
        return WritePlan::UpToDate;
    }
    let metadata = patch
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let (Some(meta), Some(rv)) = (
        metadata.as_object_mut(),
        existing["metadata"].get("resourceVersion"),
    ) {
        meta.insert("resourceVersion".into(), rv.clone());
    }
    WritePlan::Patch(Value::Object(patch))
}

/// The merge patch turning `existing` into something that contains `desired`, removing what `owned`
/// lists but `desired` lacks; `None` when nothing changes.
fn diff(existing: Option<&Value>, desired: &Value, owned: Option<&FieldTree>) -> Option<Value> {
    let no_map = Map::new();
    let (existing, desired) = match (existing, desired) {
        (Some(Value::Object(e)), Value::Object(d)) => (e, d),
        // An absent map is an empty one: an empty desired map then needs no write.
        (None, Value::Object(d)) => (&no_map, d),
        _ => return (!existing.is_some_and(|e| same(e, desired))).then(|| desired.clone()),
    };
    let mut patch = Map::new();
    for (key, want) in desired {
        let child = owned.and_then(|o| o.children.get(key));
        if let Some(p) = diff(existing.get(key), want, child) {
            patch.insert(key.clone(), p);
        }
    }
    for (key, child) in owned.map(|o| &o.children).into_iter().flatten() {
        if desired.contains_key(key) || !existing.contains_key(key) {
            continue;
        }
        // We set this once and the source no longer has it: remove what is ours, and only that.
        if child.children.is_empty() || !existing[key].is_object() {
            patch.insert(key.clone(), Value::Null);
        } else if let Some(p) = diff(existing.get(key), &Value::Object(Map::new()), Some(child)) {
            patch.insert(key.clone(), p);
        }
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// Whether the stored value already is the desired one. Maps may carry extra keys (other writers'),
/// lists must match item by item, where items may only add allocated keys.
fn same(existing: &Value, desired: &Value) -> bool {
    match (existing, desired) {
        (Value::Object(e), Value::Object(d)) => d.iter().all(|(k, v)| e.get(k).is_some_and(|ev| same(ev, v))),
        (Value::Array(e), Value::Array(d)) => {
            e.len() == d.len() && e.iter().zip(d).all(|(e, d)| same_item(e, d))
        }
        _ => existing == desired,
    }
}

fn same_item(existing: &Value, desired: &Value) -> bool {
    match (existing, desired) {
        (Value::Object(e), Value::Object(d)) => {
            e.keys()
                .all(|k| d.contains_key(k) || ALLOCATED_ITEM_KEYS.contains(&k.as_str()))
                && d.iter().all(|(k, v)| e.get(k).is_some_and(|ev| same_item(ev, v)))
        }
        (Value::Array(e), Value::Array(d)) => {
            e.len() == d.len() && e.iter().zip(d).all(|(e, d)| same_item(e, d))
        }
        _ => existing == desired,
    }
}

/// A set of field paths, as in `managedFields[].fieldsV1`; list contents collapse into the list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldTree {
    children: BTreeMap<String, FieldTree>,
}

/// The fields `field_manager` owns on `object` (all its entries, whatever the operation, except
/// those of subresources such as `status`); an entry's `fieldsV1` may be the tree or its JSON text.
pub fn owned_fields(object: &Value, field_manager: &str) -> FieldTree {
    let mut tree = FieldTree::default();
    let entries = object["metadata"]["managedFields"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for entry in entries {
        let subresource = entry
            .get("subresource")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if entry["manager"] == field_manager && subresource.is_empty() {
            match &entry["fieldsV1"] {
                // The controller's cache keeps them as JSON text (see `cache_trim::trim_copy`).
                Value::String(text) => {
                    merge_fields_v1(&mut tree, &serde_json::from_str(text).unwrap_or_default());
                }
                fields => merge_fields_v1(&mut tree, fields),
            }
        }
    }
    tree
}

fn merge_fields_v1(tree: &mut FieldTree, fields: &Value) {
    for (key, sub) in fields.as_object().into_iter().flatten() {
        // `f:name` is a field; `k:`, `v:` and `i:` are list items (the list counts as one value);
        // `.` marks the node itself.
        if let Some(name) = key.strip_prefix("f:") {
            let child = tree.children.entry(name.to_owned()).or_default();
            if !sub
                .as_object()
                .is_some_and(|m| m.keys().any(|k| !k.starts_with("f:") && k != "."))
            {
                merge_fields_v1(child, sub);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ME: &str = "projection-controller";

    fn copy(data: Value, labels: Value, managed: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "resourceVersion": "7", "labels": labels,
                         "managedFields": managed},
            "data": data,
        })
    }

    fn mine(fields: Value) -> Value {
        json!([{"manager": ME, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields}])
    }

    fn desired(data: Value, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n", "labels": labels},
               "data": data})
    }

    #[test]
    fn an_identical_copy_needs_no_write() {
        let managed = mine(json!({"f:data": {".": {}, "f:a": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}));
        let existing = copy(json!({"a": "1"}), json!({"x": "1"}), managed);
        assert_eq!(
            plan_update(&existing, &desired(json!({"a": "1"}), json!({"x": "1"})), ME),
            WritePlan::UpToDate
        );
    }

    #[test]
    fn other_writers_labels_and_fields_are_left_alone() {
        let managed = mine(json!({"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}));
        let existing = copy(
            json!({"a": "1", "theirs": "t"}),
            json!({"x": "1", "added-by-someone": "y"}),
            managed,
        );
        assert_eq!(
            plan_update(&existing, &desired(json!({"a": "1"}), json!({"x": "1"})), ME),
            WritePlan::UpToDate
        );
    }

    #[test]
    fn a_source_edit_patches_only_what_changed_with_a_precondition() {
        let managed = mine(json!({"f:data": {"f:a": {}, "f:b": {}}}));
        let existing = copy(json!({"a": "1", "b": "2"}), json!({}), managed);
        let plan = plan_update(&existing, &desired(json!({"a": "1", "b": "3"}), json!({})), ME);
        assert_eq!(
            plan,
            WritePlan::Patch(json!({"data": {"b": "3"}, "metadata": {"resourceVersion": "7"}}))
        );
    }

    #[test]
    fn a_key_the_source_dropped_is_removed_only_if_we_set_it() {
        let managed =
            mine(json!({"f:data": {"f:a": {}, "f:gone": {}}, "f:metadata": {"f:labels": {"f:old": {}}}}));
        let existing = copy(
            json!({"a": "1", "gone": "x", "theirs": "t"}),
            json!({"old": "1", "other": "o"}),
            managed,
        );
        let plan = plan_update(&existing, &desired(json!({"a": "1"}), json!({})), ME);
        assert_eq!(
            plan,
            WritePlan::Patch(
                json!({"data": {"gone": null}, "metadata": {"labels": {"old": null}, "resourceVersion": "7"}})
            )
        );
    }

    #[test]
    fn when_the_source_loses_a_whole_map_only_our_keys_go() {
        let managed = mine(json!({"f:data": {".": {}, "f:a": {}}}));
        let existing = copy(json!({"a": "1", "theirs": "t"}), json!({}), managed);
        let mut want = desired(json!({}), json!({}));
        want.as_object_mut().unwrap().remove("data");
        let plan = plan_update(&existing, &want, ME);
        assert_eq!(
            plan,
            WritePlan::Patch(json!({"data": {"a": null}, "metadata": {"resourceVersion": "7"}}))
        );
    }

    #[test]
    fn a_value_edited_by_hand_is_restored() {
        let managed = mine(json!({"f:data": {}}));
        let existing = copy(json!({"a": "tampered"}), json!({}), managed);
        let plan = plan_update(&existing, &desired(json!({"a": "1"}), json!({})), ME);
        assert_eq!(
            plan,
            WritePlan::Patch(json!({"data": {"a": "1"}, "metadata": {"resourceVersion": "7"}}))
        );
    }

    #[test]
    fn lists_are_replaced_whole_but_allocated_node_ports_are_no_difference() {
        let existing = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "resourceVersion": "3", "managedFields": mine(json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {}}}}))},
            "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30001}]}});
        let want = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}});
        assert_eq!(plan_update(&existing, &want, ME), WritePlan::UpToDate);

        let changed = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "TCP"}]}});
        assert_eq!(
            plan_update(&existing, &changed, ME),
            WritePlan::Patch(
                json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}, {"port": 81, "protocol": "TCP"}]},
                                    "metadata": {"resourceVersion": "3"}})
            )
        );
    }

    #[test]
    fn a_field_removed_inside_a_list_item_is_a_difference() {
        let existing = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"resourceVersion": "1"},
            "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x", "command": ["run"]}]}}}});
        let want = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {},
            "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}});
        assert!(matches!(plan_update(&existing, &want, ME), WritePlan::Patch(_)));
    }

    #[test]
    fn entries_of_other_managers_and_of_subresources_are_not_ours() {
        let object = json!({"metadata": {"managedFields": [
            {"manager": "kubectl", "fieldsV1": {"f:data": {"f:x": {}}}},
            {"manager": ME, "subresource": "status", "fieldsV1": {"f:status": {}}},
            {"manager": ME, "fieldsV1": {"f:data": {"f:mine": {}}}},
        ]}});
        let owned = owned_fields(&object, ME);
        assert_eq!(owned.children.keys().collect::<Vec<_>>(), ["data"]);
        assert_eq!(
            owned.children["data"].children.keys().collect::<Vec<_>>(),
            ["mine"]
        );
    }

    /// The copy of the Projection `team/p` at team/c, with `annotations` and data `a: <value>`.
    fn found(annotations: Value, value: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "namespace": "team", "resourceVersion": "9",
                            "annotations": annotations, "labels": {"projection.sh/owned-by-projection-uid": "u"},
                            "managedFields": mine(json!({"f:data": {"f:a": {}}}))},
               "data": {"a": value}})
    }

    #[test]
    fn the_write_of_one_copy_is_decided_from_what_is_there() {
        use crate::api::keys::{ADOPT_BY, OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION};
        let owner = Owner::Projection {
            namespace: "team".into(),
            name: "p".into(),
            uid: "u".into(),
            cluster: None,
        };
        let cluster = Owner::ClusterProjection {
            name: "p".into(),
            uid: "u".into(),
            cluster: None,
        };
        let want = json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "c", "namespace": "team", "annotations": {OWNED_BY_PROJECTION: "team/p"}},
                          "data": {"a": "1"}});
        let ours = json!({OWNED_BY_PROJECTION: "team/p"});
        let update = json!({"data": {"a": "1"}, "metadata": {"resourceVersion": "9"}});
        let not_owned = "destination team/c exists and is not owned by this Projection";
        let conflict = |m: &str| WriteDecision::Conflict(m.to_owned());
        #[rustfmt::skip]
        let cases: Vec<(&str, Option<Value>, &Owner, Existing, WriteDecision)> = vec![
            ("nothing there", None, &owner, Existing::Update, WriteDecision::Create),
            ("nothing there, ApplyOnce", None, &owner, Existing::Keep, WriteDecision::Create),
            ("ours and current", Some(found(ours.clone(), "1")), &owner, Existing::Update, WriteDecision::UpToDate),
            ("ours and stale", Some(found(ours.clone(), "0")), &owner, Existing::Update, WriteDecision::Update(update.clone())),
            ("ours and stale, ApplyOnce", Some(found(ours.clone(), "0")), &owner, Existing::Keep, WriteDecision::Kept),
            ("a label alone", Some(found(json!({}), "1")), &owner, Existing::Update, conflict(not_owned)),
            ("another Projection's", Some(found(json!({OWNED_BY_PROJECTION: "team/q"}), "1")), &owner, Existing::Update, conflict(not_owned)),
            ("the other tier's", Some(found(ours.clone(), "1")), &cluster, Existing::Update,
                conflict("destination team/c exists and is not owned by this ClusterProjection")),
            ("a ClusterProjection's, named alike", Some(found(json!({OWNED_BY_CLUSTER_PROJECTION: "p"}), "1")), &owner, Existing::Update, conflict(not_owned)),
            ("consent for another CR", Some(found(json!({ADOPT_BY: "team/q"}), "1")), &owner, Existing::Update,
                conflict(&format!("{not_owned}: its {ADOPT_BY} names \"team/q\", not \"team/p\""))),
            ("consent, stale", Some(found(json!({ADOPT_BY: "team/p"}), "0")), &owner, Existing::Update,
                WriteDecision::Adopt(json!({"data": {"a": "1"}, "metadata": {"resourceVersion": "9",
                    "annotations": {OWNED_BY_PROJECTION: "team/p", ADOPT_BY: null}}}))),
            ("consent, ApplyOnce adopts too", Some(found(json!({ADOPT_BY: "team/p"}), "1")), &owner, Existing::Keep,
                WriteDecision::Adopt(json!({"metadata": {"resourceVersion": "9",
                    "annotations": {OWNED_BY_PROJECTION: "team/p", ADOPT_BY: null}}}))),
        ];
        for (case, current, owner, existing, expected) in cases {
            assert_eq!(
                decide(current.as_ref(), &want, owner, existing),
                expected,
                "{case}"
            );
        }
    }
}
