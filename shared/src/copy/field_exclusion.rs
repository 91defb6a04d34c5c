//! `spec.fields.exclude`: JSONPath expressions (RFC 9535, evaluated by jsonpath-rust) whose matches
//! are removed from the built copy.
//!
//! A path that could remove what makes the copy an object we own (`apiVersion`, `kind`,
//! `metadata.name`, `metadata.namespace`, the `projection.sh/` keys, or a map holding them) is
//! refused. Whether it could is decided by evaluating the expression against [`protected_probe`],
//! an object holding exactly those fields: the library itself says what the path reaches, so
//! wildcards (`$.*`), descendants (`$..name`) and bracket forms (`$['kind']`) are all caught.

use crate::api::keys::{
    OWNED_BY_CLUSTER_PROJECTION, OWNED_BY_PROJECTION, OWNED_BY_PROJECTION_UID, SOURCE_HASH,
};
use jsonpath_rust::{JsonPath, parser::parse_json_path, query::queryable::Queryable};
use serde_json::{Value, json};

/// Why an expression cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExclusionProblem {
    /// The parser's message.
    Unparsable(String),
    /// The expression reaches a protected field (its JSONPath as the library normalises it).
    Protected(String),
}

/// An object with every field a copy must keep, each under a key nothing else uses.
pub fn protected_probe() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Probe",
        "metadata": {
            "name": "n",
            "namespace": "ns",
            "annotations": {
                OWNED_BY_PROJECTION: "p",
                OWNED_BY_CLUSTER_PROJECTION: "c",
                SOURCE_HASH: "h",
            },
            "labels": {
                OWNED_BY_PROJECTION_UID: "u",
            },
        },
    })
}

/// Checks one `spec.fields.exclude` expression.
pub fn check_expression(expression: &str) -> Result<(), ExclusionProblem> {
    parse_json_path(expression).map_err(|e| ExclusionProblem::Unparsable(one_line(&e.to_string())))?;
    let probe = protected_probe();
    let reached = probe
        .query_only_path(expression)
        .map_err(|e| ExclusionProblem::Unparsable(e.to_string()))?;
    // Every match in the probe is a protected field or a map above one; the root itself is `$`.
    match reached.into_iter().next() {
        Some(path) => Err(ExclusionProblem::Protected(path)),
        None => Ok(()),
    }
}

/// The parser's message on one line: its position and its expectation, without the drawing of the
/// expression (an admission message is one line in `kubectl`'s output).
fn one_line(message: &str) -> String {
    let kept: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('|') && !l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    kept.join(" ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Removes every match of `expressions` from built `content`. Refuses (naming the entry) an
/// expression that does not parse or reaches a protected field, though admission refuses both
/// already: a spec admitted before this rule existed must not strip a copy's identity.
pub fn exclude_fields(content: &mut Value, expressions: &[String]) -> Result<(), String> {
    for (i, expression) in expressions.iter().enumerate() {
        check_expression(expression).map_err(|p| problem_message(i, &p))?;
        let identity = (content.get("apiVersion").cloned(), content.get("kind").cloned());
        content
            .delete_by_path(expression)
            .map_err(|e| format!("spec.fields.exclude[{i}]: {e}"))?;
        // A filter can match by value what the probe could not show (`$[?@ == 'ConfigMap']`).
        if (content.get("apiVersion").cloned(), content.get("kind").cloned()) != identity {
            return Err(problem_message(
                i,
                &ExclusionProblem::Protected("apiVersion or kind".to_owned()),
            ));
        }
    }
    Ok(())
}

impl ExclusionProblem {
    /// The rule the expression breaks, for the user.
    pub fn rule(&self) -> String {
        match self {
            Self::Unparsable(message) => format!("not a JSONPath expression: {message}"),
            Self::Protected(path) => format!(
                "reaches {path}, which every copy keeps (apiVersion, kind, metadata.name, \
                 metadata.namespace and the projection.sh/ keys cannot be excluded)"
            ),
        }
    }
}

/// The message of `problem` with entry `index` of `spec.fields.exclude`.
fn problem_message(index: usize, problem: &ExclusionProblem) -> String {
    format!("spec.fields.exclude[{index}]: {}", problem.rule())
}
