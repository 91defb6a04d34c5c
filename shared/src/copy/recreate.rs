//! What happens when the apiserver refuses an in-place update of a copy as immutable. Deleting and
//! creating the copy anew is harmless for ConfigMaps and Secrets (their content is the copy) but can
//! destroy data or rerun work for other kinds (a PersistentVolumeClaim's volume, a Job), so only
//! those two, and kinds a platform opts in with `--recreate-on-immutable`, are recreated; any other
//! copy is left as it is, with a reason naming the immutable field and the way out.

use crate::api::source::GroupKind;
use kube::core::Status;
use std::{collections::BTreeSet, fmt, str::FromStr};

/// The kinds whose copies are recreated when an update is refused as immutable, beyond ConfigMaps
/// and Secrets (always recreated): `--recreate-on-immutable=Kind.group,...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecreateKinds(BTreeSet<GroupKind>);

/// Why a `--recreate-on-immutable` value is refused.
#[derive(Debug, PartialEq, Eq)]
pub struct BadRecreateKinds(pub String);

impl fmt::Display for BadRecreateKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRecreateKinds {}

impl FromStr for RecreateKinds {
    type Err = BadRecreateKinds;

    /// `Kind.group` entries separated by commas (`PersistentVolumeClaim` for the core group,
    /// `Job.batch`); empty means none. A kind starts with an uppercase letter, as the API spells it,
    /// so a plural (`jobs.batch`) or a lowercase typo is refused rather than matching nothing.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let mut kinds = BTreeSet::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (kind, group) = match entry.split_once('.') {
                Some((kind, group)) => (kind, Some(group)),
                None => (entry, None),
            };
            let kind_ok = kind.starts_with(|c: char| c.is_ascii_uppercase())
                && kind.chars().all(|c| c.is_ascii_alphanumeric());
            // A dot promises a group: `Job.` is refused, not read as the core group.
            let group_ok = group.is_none_or(|group| {
                group.split('.').all(|label| {
                    !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
            });
            if !kind_ok || !group_ok {
                return Err(BadRecreateKinds(format!(
                    "{entry:?} is not Kind.group (e.g. PersistentVolumeClaim for the core group, \
                     Job.batch): the kind as the API spells it (CamelCase, singular), then its group"
                )));
            }
            kinds.insert(GroupKind {
                group: group.unwrap_or_default().to_owned(),
                kind: kind.to_owned(),
            });
        }
        Ok(Self(kinds))
    }
}

impl RecreateKinds {
    /// Whether a copy of `kind` may be deleted and created anew when an update is refused as
    /// immutable: ConfigMaps and Secrets of the core group always, other kinds only when opted in.
    pub fn allows(&self, kind: &GroupKind) -> bool {
        let always = kind.group.is_empty() && matches!(kind.kind.as_str(), "ConfigMap" | "Secret");
        always || self.0.contains(kind)
    }

    /// The opted-in kinds as the flag takes them (`Kind.group`, `Kind` for the core group).
    pub fn flag_value(&self) -> String {
        self.0.iter().map(flag_entry).collect::<Vec<_>>().join(",")
    }
}

/// `Kind.group`, or `Kind` for the core group: how the flag names a kind.
pub fn flag_entry(kind: &GroupKind) -> String {
    if kind.group.is_empty() {
        kind.kind.clone()
    } else {
        format!("{}.{}", kind.kind, kind.group)
    }
}

/// Whether the apiserver's answer to an update refuses it because a field is immutable (HTTP 422
/// whose message says so, as every built-in and CEL immutability rule does).
pub fn is_immutable_refusal(status: &Status) -> bool {
    status.code == 422 && status.message.contains("immutable")
}

/// The fields the apiserver names as immutable in its refusal: the `field` of each cause that says
/// "immutable" (every cause's field when none does), else the field before the first `": "` after
/// `is invalid: ` in the message (`spec`, `data`, `type`). Empty when neither names one.
pub fn immutable_fields(status: &Status) -> Vec<String> {
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    let named = |only_immutable: bool| -> Vec<String> {
        let mut fields: Vec<String> = causes
            .iter()
            .filter(|c| !c.field.is_empty())
            .filter(|c| !only_immutable || c.message.contains("immutable"))
            .map(|c| c.field.clone())
            .collect();
        fields.dedup();
        fields
    };
    let fields = named(true);
    if !fields.is_empty() {
        return fields;
    }
    let fields = named(false);
    if !fields.is_empty() {
        return fields;
    }
    status
        .message
        .split_once("is invalid: ")
        .and_then(|(_, rest)| rest.split_once(": "))
        .map(|(field, _)| field.trim_start_matches('[').trim())
        .filter(|field| !field.is_empty() && !field.contains(' '))
        .map(|field| vec![field.to_owned()])
        .unwrap_or_default()
}

/// The message of `DestinationImmutable`: the copy `copy` (`namespace/name`) of `kind` was left as
/// it is because the apiserver refused to change `fields` in place (`refusal`: its first line), and
/// how to proceed.
pub fn immutable_message(copy: &str, kind: &GroupKind, fields: &[String], refusal: &str) -> String {
    let what = match fields {
        [] => "an immutable field".to_owned(),
        [one] => format!("the immutable field {one}"),
        many => format!("the immutable fields {}", many.join(", ")),
    };
    let first_line = refusal.lines().next().unwrap_or_default().trim();
    format!(
        "the copy {copy} was left unchanged: the apiserver refuses to change {what} in place, and \
         {kind} copies are not deleted and recreated (that could lose their data). To proceed, \
         delete the copy by hand (it is then created anew from the source), or have the platform \
         opt the kind in with the controller flag --recreate-on-immutable={entry} (Helm value \
         controller.recreateOnImmutable); the apiserver said: {first_line}",
        entry = flag_entry(kind),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gk(group: &str, kind: &str) -> GroupKind {
        GroupKind {
            group: group.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn only_configmaps_secrets_and_opted_in_kinds_are_recreated() {
        let none = RecreateKinds::default();
        let opted: RecreateKinds = "Job.batch, PersistentVolumeClaim".parse().unwrap();
        // (kind, recreated by default, recreated with Job.batch and PersistentVolumeClaim opted in)
        for (kind, default, with_opt_in) in [
            (gk("", "ConfigMap"), true, true),
            (gk("", "Secret"), true, true),
            (gk("", "PersistentVolumeClaim"), false, true),
            (gk("batch", "Job"), false, true),
            (gk("apps", "Deployment"), false, false),
            // The same kind name in another group is another kind.
            (gk("example.com", "ConfigMap"), false, false),
            (gk("example.com", "Job"), false, false),
            (gk("", "Service"), false, false),
        ] {
            assert_eq!(none.allows(&kind), default, "{kind}");
            assert_eq!(opted.allows(&kind), with_opt_in, "{kind}");
        }
        assert_eq!(opted.flag_value(), "PersistentVolumeClaim,Job.batch");
    }

    #[test]
    fn the_flag_takes_kind_dot_group_and_refuses_anything_else() {
        assert_eq!("".parse::<RecreateKinds>(), Ok(RecreateKinds::default()));
        assert_eq!(" , ".parse::<RecreateKinds>(), Ok(RecreateKinds::default()));
        let kinds: RecreateKinds = "Widget.example.com,Job.batch,Job.batch".parse().unwrap();
        assert!(kinds.allows(&gk("example.com", "Widget")));
        assert_eq!(kinds.flag_value(), "Job.batch,Widget.example.com");
        for bad in [
            "jobs.batch",
            "job",
            "Job.",
            "Job..batch",
            "Job.batch/v1",
            "batch/Job",
            "Persistent Volume Claim",
            ".batch",
        ] {
            let err = bad.parse::<RecreateKinds>().expect_err(bad);
            assert!(err.0.contains("is not Kind.group"), "{bad}: {err}");
        }
    }

    /// The apiserver's answers (v1.36.3), read with curl: a merge patch of `spec.storageClassName:
    /// null` on a claim, of `data` on an `immutable: true` ConfigMap, of `type` on an Opaque Secret.
    fn status(json: &str) -> Status {
        serde_json::from_str(json).expect("a Status")
    }

    const PVC_SPEC: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"PersistentVolumeClaim \"data\" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n@@ -10,7 +10,7 @@\n   }\n  },\n  \"VolumeName\": \"\",\n- \"StorageClassName\": \"slow\",\n+ \"StorageClassName\": null,\n  \"VolumeMode\": \"Filesystem\",\n  \"DataSource\": null,\n  \"DataSourceRef\": null,\n","reason":"Invalid","details":{"name":"data","kind":"PersistentVolumeClaim","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n@@ -10,7 +10,7 @@\n   }\n  },\n  \"VolumeName\": \"\",\n- \"StorageClassName\": \"slow\",\n+ \"StorageClassName\": null,\n  \"VolumeMode\": \"Filesystem\",\n  \"DataSource\": null,\n  \"DataSourceRef\": null,\n","field":"spec"}]},"code":422}"#;
    const CONFIGMAP_DATA: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap \"cfg\" is invalid: data: Forbidden: field is immutable when `immutable` is set","reason":"Invalid","details":{"name":"cfg","kind":"ConfigMap","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: field is immutable when `immutable` is set","field":"data"}]},"code":422}"#;
    const SECRET_TYPE: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Secret \"tls\" is invalid: [type: Invalid value: \"kubernetes.io/tls\": field is immutable, data[tls.crt]: Required value, data[tls.key]: Required value]","reason":"Invalid","details":{"name":"tls","kind":"Secret","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"kubernetes.io/tls\": field is immutable","field":"type"},{"reason":"FieldValueRequired","message":"Required value","field":"data[tls.crt]"},{"reason":"FieldValueRequired","message":"Required value","field":"data[tls.key]"}]},"code":422}"#;
    const QUOTA: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"cfg\" is forbidden: exceeded quota","reason":"Forbidden","details":{"name":"cfg","kind":"configmaps"},"code":403}"#;

    #[test]
    fn the_refused_field_is_taken_from_the_apiservers_answer() {
        // (answer, immutable refusal, fields named)
        let table: [(&str, bool, &[&str]); 4] = [
            (PVC_SPEC, true, &["spec"]),
            (CONFIGMAP_DATA, true, &["data"]),
            (SECRET_TYPE, true, &["type"]),
            (QUOTA, false, &[]),
        ];
        for (json, immutable, fields) in table {
            let s = status(json);
            assert_eq!(is_immutable_refusal(&s), immutable, "{json}");
            if immutable {
                assert_eq!(immutable_fields(&s), fields, "{json}");
            }
        }
        // Without causes, the message names the field.
        let mut bare = status(CONFIGMAP_DATA);
        bare.details = None;
        assert_eq!(immutable_fields(&bare), ["data"]);
        bare.message = "field is immutable".into();
        assert!(immutable_fields(&bare).is_empty());
    }

    #[test]
    fn the_message_names_the_field_and_both_ways_out() {
        let s = status(PVC_SPEC);
        let message = immutable_message(
            "team-a/data",
            &gk("", "PersistentVolumeClaim"),
            &immutable_fields(&s),
            &s.message,
        );
        for part in [
            "the copy team-a/data was left unchanged",
            "refuses to change the immutable field spec in place",
            "/PersistentVolumeClaim copies are not deleted and recreated",
            "delete the copy by hand",
            "--recreate-on-immutable=PersistentVolumeClaim",
            "controller.recreateOnImmutable",
            "the apiserver said: PersistentVolumeClaim \"data\" is invalid: spec: Forbidden: spec is immutable",
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
        // Only the apiserver's first line: its diff of the whole spec stays out of the condition.
        assert!(!message.contains("StorageClassName"), "{message}");
        assert!(!message.contains("@@"), "{message}");
        let job = immutable_message("a/b", &gk("batch", "Job"), &[], "x is invalid");
        assert!(job.contains("change an immutable field in place"), "{job}");
        assert!(job.contains("--recreate-on-immutable=Job.batch"), "{job}");
        let two = immutable_message(
            "a/b",
            &gk("batch", "Job"),
            &["spec.a".into(), "spec.b".into()],
            "",
        );
        assert!(two.contains("the immutable fields spec.a, spec.b"), "{two}");
    }
}
