//! What the controller's caches keep of an object: only what a decision reads. The caches hold
//! every CR and every copy for as long as they exist, so each field dropped here is memory saved per
//! object; each function says which readers it was checked against.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use shared::api::keys::RESERVED_PREFIX;

/// Trims a cached CR (`Projection`, `ClusterProjection`). Nothing the controller decides reads a
/// CR's `managedFields`, its labels, or annotations outside `projection.sh/` (the reconcile request
/// stamp is the only one read; `kubectl.kubernetes.io/last-applied-configuration` alone is a second
/// copy of the whole spec, and a map of even one label costs a B-tree node of several hundred
/// bytes); its spec, status, finalizers, generation and deletion stay.
pub fn trim_cr(metadata: &mut ObjectMeta) {
    metadata.managed_fields = None;
    metadata.labels = None;
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.retain(|key, _| key.starts_with(RESERVED_PREFIX));
    }
    if metadata.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        metadata.annotations = None;
    }
}

/// Trims a cached copy. Its content, labels, annotations, uid and resourceVersion stay (the write
/// plan, adoption consent, ownership checks and preconditions read them); of `managedFields` only
/// the entries the write plan reads stay: those of `field_manager` on the main resource (see
/// [`shared::copy::write_plan::owned_fields`]), each with its `fieldsV1` kept as JSON text: as a tree it
/// costs one map per level, several hundred bytes each, and the write plan reads either form.
/// Nothing sends a cached copy's `managedFields` back to the apiserver.
pub fn trim_copy(metadata: &mut ObjectMeta, field_manager: &str) {
    if let Some(entries) = metadata.managed_fields.as_mut() {
        entries.retain(|e| {
            e.manager.as_deref() == Some(field_manager)
                && e.subresource.as_deref().unwrap_or_default().is_empty()
        });
        for fields in entries.iter_mut().filter_map(|e| e.fields_v1.as_mut()) {
            if !fields.0.is_string() {
                fields.0 = Value::String(fields.0.to_string());
            }
        }
    }
}

/// A digest of a value the controller wrote (a CR's status), kept instead of the value: what is
/// asked of it is only whether the next value is the same. SHA-256 of its JSON serialization, which
/// is the same for equal values of one type.
pub fn digest<T: Serialize>(value: &T) -> [u8; 32] {
    let mut hasher = Sha256::new();
    // Writing into a hasher cannot fail; a value that cannot be serialized digests as what it
    // serialized so far, the same every time.
    let _ = serde_json::to_writer(DigestWriter(&mut hasher), value);
    hasher.finalize().into()
}

/// Feeds serialized bytes to a hasher, so no JSON text is built.
struct DigestWriter<'a>(&'a mut Sha256);

impl std::io::Write for DigestWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shared::api::keys::LAST_APPLIED;
    use shared::copy::write_plan::{WritePlan, owned_fields, plan_update};

    const ME: &str = "projection-controller";

    fn metadata(value: Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    fn copy_with_three_managers() -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "c", "namespace": "n", "resourceVersion": "7",
                "labels": {"x": "1", "theirs": "t"},
                "managedFields": [
                    {"manager": ME, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:data": {"f:a": {}, "f:gone": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}},
                    {"manager": ME, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                     "subresource": "status", "fieldsV1": {"f:status": {}}},
                    {"manager": "kubectl-edit", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:data": {"f:theirs": {}}, "f:metadata": {"f:labels": {"f:theirs": {}}}}},
                ],
            },
            "data": {"a": "1", "gone": "g", "theirs": "t"},
        })
    }

    #[test]
    fn a_trimmed_cr_keeps_what_decisions_read() {
        let mut meta = metadata(json!({
            "name": "p", "namespace": "n", "uid": "u", "generation": 3, "finalizers": ["f"],
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {LAST_APPLIED: "{\"spec\":{}}", "projection.sh/requested-at": "now",
                            "meta.helm.sh/release-name": "r"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}],
        }));
        let before = meta.clone();
        trim_cr(&mut meta);
        assert_eq!(meta.managed_fields, None);
        assert_eq!(meta.labels, None);
        let annotations = meta.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["projection.sh/requested-at"], "now");
        let restore = ObjectMeta {
            managed_fields: before.managed_fields.clone(),
            annotations: before.annotations.clone(),
            labels: before.labels.clone(),
            ..meta
        };
        assert_eq!(restore, before, "nothing else changed");

        let mut unstamped = metadata(json!({"name": "p", "annotations": {LAST_APPLIED: "{}"}}));
        trim_cr(&mut unstamped);
        assert_eq!(unstamped.annotations, None, "no empty map is kept");
    }

    #[test]
    fn a_trimmed_copy_keeps_only_our_main_resource_entries() {
        let mut copy = copy_with_three_managers();
        let mut meta = metadata(copy["metadata"].clone());
        trim_copy(&mut meta, ME);
        let kept = meta.managed_fields.as_ref().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].manager.as_deref(), Some(ME));
        assert_eq!(kept[0].subresource, None);
        let text = kept[0].fields_v1.as_ref().unwrap().0.as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            copy["metadata"]["managedFields"][0]["fieldsV1"],
            "the same fields, as text"
        );
        let mut again = meta.clone();
        trim_copy(&mut again, ME);
        assert_eq!(again, meta, "trimming twice changes nothing");
        let untouched = copy["metadata"].clone();
        copy["metadata"] = serde_json::to_value(&meta).unwrap();
        assert_eq!(copy["metadata"]["labels"], untouched["labels"]);
        assert_eq!(copy["metadata"]["resourceVersion"], untouched["resourceVersion"]);
    }

    #[test]
    fn the_write_plan_is_the_same_on_a_trimmed_copy() {
        let full = copy_with_three_managers();
        let mut trimmed = full.clone();
        let mut meta = metadata(trimmed["metadata"].clone());
        trim_copy(&mut meta, ME);
        trimmed["metadata"] = serde_json::to_value(&meta).unwrap();
        assert_eq!(owned_fields(&trimmed, ME), owned_fields(&full, ME));
        let desired = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "labels": {"x": "2"}}, "data": {"a": "1"}});
        let plan = plan_update(&trimmed, &desired, ME);
        assert_eq!(plan, plan_update(&full, &desired, ME));
        assert_eq!(
            plan,
            WritePlan::Patch(
                json!({"data": {"gone": null}, "metadata": {"labels": {"x": "2"}, "resourceVersion": "7"}})
            )
        );
    }

    #[test]
    fn equal_statuses_digest_alike_and_different_ones_do_not() {
        let ready = json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Projected"}]});
        let same = json!({"conditions": [{"reason": "Projected", "status": "True", "type": "Ready"}]});
        let deleted =
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "SourceDeleted"}]});
        assert_eq!(digest(&ready), digest(&same));
        assert_ne!(digest(&ready), digest(&deleted));
        assert_ne!(digest(&json!({"a": "bc"})), digest(&json!({"ab": "c"})));
    }
}
