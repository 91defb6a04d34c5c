//! What a copy carries (SPEC §10), from YAML fixtures in `tests/fixtures/copy/`: each file lists
//! cases of a source, the spec's `overlay` / `metadata` / `keys` / `fields`, and either the exact
//! copy expected (owned by the Projection `team/p`, placed at `team/copy`) or the exact refusal.
//! Every built copy carries `projection.sh/source-hash`; the harness checks it against the content
//! and leaves it out of the comparison.

use serde::Deserialize;
use serde_json::Value;
use shared::{
    api::copy_spec::{FieldExclusion, KeySelection, MetadataFilter},
    api::crd::Overlay,
    api::keys::SOURCE_HASH,
    copy::content::{BuiltContent, CopyRules},
    copy::destination::Target,
    copy::ownership::Owner,
};
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    #[serde(default)]
    spec: Rules,
    source: Value,
    #[serde(default)]
    expected: Option<Value>,
    #[serde(default)]
    refused: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Rules {
    overlay: Option<Overlay>,
    metadata: Option<MetadataFilter>,
    keys: Option<KeySelection>,
    fields: Option<FieldExclusion>,
}

fn owner() -> Owner {
    Owner::Projection {
        namespace: "team".into(),
        name: "p".into(),
        uid: "u1".into(),
        cluster: None,
    }
}

fn target() -> Target {
    Target {
        namespace: "team".into(),
        name: "copy".into(),
    }
}

fn rules(spec: &Rules) -> CopyRules<'_> {
    CopyRules {
        overlay: spec.overlay.as_ref(),
        metadata: spec.metadata.as_ref(),
        keys: spec.keys.as_ref(),
        fields: spec.fields.as_ref(),
    }
}

fn files() -> Vec<(String, Vec<Case>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/copy");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixture folder")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable");
            let cases: Vec<Case> =
                serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.display().to_string(), cases)
        })
        .collect()
}

#[test]
fn every_case_builds_its_expected_copy_or_its_refusal() {
    let mut count = 0;
    for (file, cases) in files() {
        for case in cases {
            let at = format!("{file}: {}", case.description);
            let built = BuiltContent::build(&case.source, &rules(&case.spec));
            match (&case.expected, &case.refused, built) {
                (Some(expected), None, Ok(built)) => {
                    let mut copy = built.place(&owner(), &target());
                    let annotations = copy["metadata"]["annotations"]
                        .as_object_mut()
                        .unwrap_or_else(|| panic!("{at}: no annotations"));
                    let hash = annotations.remove(SOURCE_HASH);
                    assert_eq!(hash.as_ref().and_then(Value::as_str), Some(built.hash()), "{at}");
                    assert_eq!(built.hash().len(), 64, "{at}");
                    assert_eq!(
                        &copy,
                        expected,
                        "{at}:\nbuilt:    {}\nexpected: {}",
                        serde_json::to_string_pretty(&copy).unwrap_or_default(),
                        serde_json::to_string_pretty(expected).unwrap_or_default()
                    );
                }
                (None, Some(refused), Err(e)) => assert_eq!(&e.message, refused, "{at}"),
                (_, _, built) => panic!("{at}: give exactly one of expected or refused; built {built:?}"),
            }
            count += 1;
        }
    }
    assert!(count >= 30, "only {count} cases");
}

/// The hash answers "is this copy current?": it moves with what the copy carries and with nothing
/// else, and it is the same for every target.
#[test]
fn the_hash_changes_exactly_when_the_carried_content_does() {
    let source = |data: &str, extra_annotation: Option<(&str, &str)>| {
        let mut annotations = serde_json::json!({"team": "a"});
        if let Some((k, v)) = extra_annotation {
            annotations[k] = Value::String(v.into());
        }
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "s", "namespace": "src", "resourceVersion": "1", "annotations": annotations},
            "data": {"k": data}})
    };
    let none = CopyRules::default();
    let base = BuiltContent::build(&source("1", None), &none).expect("builds");
    // A metadata-only edit the copy does not carry: same hash (and the same copy, so no write).
    for untracked in [
        ("argocd.argoproj.io/tracking-id", "app:/ConfigMap:src/s"),
        ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ("projection.sh/projectable", "true"),
    ] {
        let edited = BuiltContent::build(&source("1", Some(untracked)), &none).expect("builds");
        assert_eq!(edited.hash(), base.hash(), "{untracked:?}");
        assert_eq!(edited.place(&owner(), &target()), base.place(&owner(), &target()));
    }
    // A carried change: a new hash.
    let changed = BuiltContent::build(&source("2", None), &none).expect("builds");
    assert_ne!(changed.hash(), base.hash());
    let annotated = BuiltContent::build(&source("1", Some(("note", "x"))), &none).expect("builds");
    assert_ne!(annotated.hash(), base.hash());
    // The same content placed elsewhere, for another owner: the same hash.
    let other = Owner::ClusterProjection {
        name: "c".into(),
        uid: "u2".into(),
        cluster: None,
    };
    let elsewhere = base.place(
        &other,
        &Target {
            namespace: "other".into(),
            name: "x".into(),
        },
    );
    assert_eq!(
        elsewhere["metadata"]["annotations"][SOURCE_HASH].as_str(),
        Some(base.hash())
    );
}
