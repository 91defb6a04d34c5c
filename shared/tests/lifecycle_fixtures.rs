//! Adoption consent and orphaning, from YAML fixtures in `tests/fixtures/adoption/` (an owner, the
//! existing object's metadata, `adopt` or the exact conflict message) and `tests/fixtures/orphan/`
//! (an owner, a copy's metadata, the exact merge patch or `null` when the copy is not ours).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;
use shared::{
    copy::adoption::{Consent, consent},
    copy::ownership::Owner,
    pass::lifecycle::orphan_patch,
};
use std::path::Path;

#[derive(Deserialize)]
struct AdoptionFixture {
    description: String,
    owner: Owner,
    object: ObjectMeta,
    expected: String,
}

#[derive(Deserialize)]
struct OrphanFixture {
    description: String,
    owner: Owner,
    metadata: ObjectMeta,
    expected: Value,
}

/// Every fixture of `folder`, read through JSON values (so the owner enum reads as a plain map).
fn fixtures<T: serde::de::DeserializeOwned>(folder: &str) -> Vec<(String, T)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(folder);
    let mut all: Vec<(String, T)> = std::fs::read_dir(&dir)
        .expect("fixture folder")
        .map(|entry| {
            let path = entry.expect("entry").path();
            let value: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).expect("readable"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let fixture = serde_json::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.display().to_string(), fixture)
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[test]
fn only_the_exact_cr_named_by_an_unowned_object_adopts_it() {
    let all = fixtures::<AdoptionFixture>("adoption");
    assert!(all.len() >= 7, "the adoption fixtures are read");
    for (path, fixture) in all {
        let expected = match fixture.expected.as_str() {
            "adopt" => Consent::Adopt,
            message => Consent::Refused(message.to_owned()),
        };
        assert_eq!(
            consent(&fixture.object, &fixture.owner),
            expected,
            "{path}: {}",
            fixture.description
        );
    }
}

#[test]
fn an_orphaned_copy_loses_exactly_our_keys() {
    let all = fixtures::<OrphanFixture>("orphan");
    assert!(all.len() >= 4, "the orphan fixtures are read");
    for (path, fixture) in all {
        let patch = orphan_patch(&fixture.metadata, &fixture.owner).unwrap_or(Value::Null);
        assert_eq!(patch, fixture.expected, "{path}: {}", fixture.description);
    }
}
