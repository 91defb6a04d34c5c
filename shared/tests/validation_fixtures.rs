//! Spec validation, from YAML fixtures in `tests/fixtures/validation/`: `bad.yaml` lists specs with
//! the exact errors expected, `good.yaml` specs that must pass. The webhook's integration test
//! applies the same cases through the apiserver.

use shared::admission::validation::{Invalid, check_cluster_projection, check_projection};
use std::path::Path;

mod common {
    pub mod validation_case;
}
use common::validation_case::Case;

/// The namespace every fixture Projection lives in.
const NAMESPACE: &str = "tenant";

fn cases(file: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/validation")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check(case: &Case) -> Result<(), Invalid> {
    match case.kind.as_str() {
        "Projection" => check_projection(NAMESPACE, Some(&case.spec)).map(drop),
        "ClusterProjection" => check_cluster_projection(Some(&case.spec)).map(drop),
        other => panic!("{}: unknown kind {other}", case.description),
    }
}

#[test]
fn every_bad_spec_is_refused_with_every_expected_error() {
    let cases = cases("bad.yaml");
    assert!(cases.len() >= 30, "the table should stay large: {}", cases.len());
    for case in &cases {
        let errors = check(case).expect_err(&case.description).0;
        let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(got, case.errors, "{}", case.description);
    }
}

#[test]
fn every_good_spec_passes() {
    for case in cases("good.yaml") {
        assert_eq!(check(&case), Ok(()), "{}", case.description);
    }
}

#[test]
fn all_errors_are_joined_into_one_message() {
    let spec = serde_json::json!({"source": {"kind": "x", "namespace": "A", "name": "ok"}});
    let message = check_projection(NAMESPACE, Some(&spec)).unwrap_err().to_string();
    assert!(message.starts_with("spec.source.kind: must match"), "{message}");
    assert!(
        message.contains("; spec.source.namespace: must match"),
        "{message}"
    );
}
