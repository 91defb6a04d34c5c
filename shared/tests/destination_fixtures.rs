//! Destination building, from YAML fixtures in `tests/fixtures/destination/`: each file holds a
//! source, an owner, a target, an optional overlay and the exact expected copy.

use serde::Deserialize;
use serde_json::Value;
use shared::{
    api::crd::Overlay,
    api::keys::SOURCE_HASH,
    copy::content::{BuiltContent, CopyRules},
    copy::destination::{Target, build_destination},
    copy::ownership::Owner,
};
use std::path::Path;

#[derive(Deserialize)]
struct Fixture {
    description: String,
    owner: Owner,
    target: FixtureTarget,
    overlay: Option<Overlay>,
    source: Value,
    expected: Value,
}

#[derive(Deserialize)]
struct FixtureTarget {
    namespace: String,
    name: String,
}

#[test]
fn every_fixture_builds_its_expected_copy() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/destination");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("fixture folder") {
        let path = entry.expect("entry").path();
        // Through JSON values, so the owner enum reads as a plain map rather than a YAML tag.
        let value: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).expect("readable"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let fixture: Fixture =
            serde_json::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let owner = fixture.owner;
        let target = Target {
            namespace: fixture.target.namespace,
            name: fixture.target.name,
        };
        let built = build_destination(&fixture.source, fixture.overlay.as_ref(), &owner, &target);
        assert_eq!(
            built,
            fixture.expected,
            "{} ({}):\nbuilt:    {}\nexpected: {}",
            path.display(),
            fixture.description,
            serde_json::to_string_pretty(&built).unwrap_or_default(),
            serde_json::to_string_pretty(&fixture.expected).unwrap_or_default()
        );
        // The controller's path (spec rules, then the hash) builds the same copy, plus the hash.
        let rules = CopyRules {
            overlay: fixture.overlay.as_ref(),
            ..CopyRules::default()
        };
        let content = BuiltContent::build(&fixture.source, &rules).expect("no spec rule to refuse");
        let mut placed = content.place(&owner, &target);
        let hash = placed["metadata"]["annotations"]
            .as_object_mut()
            .and_then(|a| a.remove(SOURCE_HASH));
        assert_eq!(
            hash.as_ref().and_then(Value::as_str),
            Some(content.hash()),
            "{}",
            path.display()
        );
        assert_eq!(placed, built, "{}: the controller's path differs", path.display());
        count += 1;
    }
    assert!(count >= 10, "only {count} fixtures found in {}", dir.display());
}
