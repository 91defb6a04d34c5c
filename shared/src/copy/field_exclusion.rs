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
    /// The parser's message, and the expression meant, when it can be told (a member name that
    /// needs the bracket form, such as `$.data['admin-password']`).
    Unparsable {
        /// The parser's message.
        message: String,
        /// What to write instead.
        instead: Option<String>,
    },
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
    let unparsable = |message: String| ExclusionProblem::Unparsable {
        message,
        instead: meant(expression),
    };
    parse_json_path(expression).map_err(|e| unparsable(one_line(&e.to_string())))?;
    let probe = protected_probe();
    let reached = probe
        .query_only_path(expression)
        .map_err(|e| unparsable(e.to_string()))?;
    // Every match in the probe is a protected field or a map above one; the root itself is `$`.
    match reached.into_iter().next() {
        Some(path) => Err(ExclusionProblem::Protected(path)),
        None => Ok(()),
    }
}

/// The expression an unparsable one most likely means, if it parses: every dotted member name that
/// RFC 9535's shorthand cannot hold (`-`, `/`, a leading digit: it allows only letters, digits and
/// `_`) in the bracket form, e.g. `$.data.admin-password` → `$.data['admin-password']`; under
/// `labels` or `annotations` the rest of a dotted run is one key (`app.kubernetes.io/name`); a
/// missing `$.` (as kubectl's `{.spec.replicas}`) is added.
pub fn meant(expression: &str) -> Option<String> {
    let rooted = match expression.strip_prefix('$') {
        Some(_) => expression.to_owned(),
        None if expression.starts_with('.') => format!("${expression}"),
        None => format!("$.{expression}"),
    };
    let mut out = String::from("$");
    let mut rest = &rooted[1..];
    let mut last = String::new();
    while let Some(c) = rest.chars().next() {
        match c {
            '[' => {
                // A bracketed segment is kept as written, up to its closing bracket outside quotes.
                let end = bracket_end(rest)?;
                out.push_str(&rest[..end]);
                rest = &rest[end..];
                last.clear();
            }
            '.' => {
                let dots = if rest.starts_with("..") { ".." } else { "." };
                rest = &rest[dots.len()..];
                // Under labels or annotations a key may hold dots (`app.kubernetes.io/name`).
                let whole_key = matches!(last.as_str(), "labels" | "annotations");
                let end = if whole_key {
                    rest.find('[')
                } else {
                    rest.find(['.', '['])
                };
                let end = end.unwrap_or(rest.len());
                let name = &rest[..end];
                rest = &rest[end..];
                last = name.to_owned();
                if name == "*" || (is_shorthand(name) && !name.contains('.')) {
                    out.push_str(dots);
                    out.push_str(name);
                } else if name.is_empty() {
                    return None;
                } else {
                    let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
                    out.push_str(if dots == ".." { "..[" } else { "[" });
                    out.push_str(&format!("'{quoted}']"));
                }
            }
            _ => return None,
        }
    }
    (out != expression && parse_json_path(&out).is_ok()).then_some(out)
}

/// Whether `name` may be written after a dot (RFC 9535 `member-name-shorthand`).
fn is_shorthand(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || !c.is_ascii());
    first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii())
}

/// The length of the bracketed segment `text` starts with (its closing bracket included).
fn bracket_end(text: &str) -> Option<usize> {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(_), _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, ']') => return Some(i + 1),
            _ => {}
        }
    }
    None
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
            Self::Unparsable {
                message,
                instead: None,
            } => format!("not a JSONPath expression: {message}"),
            Self::Unparsable {
                message,
                instead: Some(meant),
            } => {
                let why = if meant.contains("['") {
                    "a name with '-', '.', '/' or a leading digit needs the bracket form"
                } else {
                    "an expression starts at the root, $"
                };
                format!("not a JSONPath expression: {message}; write {meant} ({why})")
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unparsable_expression_says_what_to_write_instead() {
        #[rustfmt::skip]
        let cases: &[(&str, Option<&str>)] = &[
            ("$.data.admin-password", Some("$.data['admin-password']")),
            ("$..admin-password", Some("$..['admin-password']")),
            ("$.metadata.annotations.example.com/team", Some("$.metadata.annotations['example.com/team']")),
            ("$.metadata.labels.app.kubernetes.io/name", Some("$.metadata.labels['app.kubernetes.io/name']")),
            ("$.data['tls.crt'].x-y", Some("$.data['tls.crt']['x-y']")),
            ("$.spec.template.spec.containers[0].env", None),
            ("$.data.0abc", Some("$.data['0abc']")),
            ("spec.replicas", Some("$.spec.replicas")),
            (".spec.replicas", Some("$.spec.replicas")),
            ("$.data.it's-mine", Some("$.data['it\\'s-mine']")),
            ("$.spec[", None),
            ("$.data..", None),
        ];
        for (written, expected) in cases {
            assert_eq!(meant(written).as_deref(), *expected, "{written}");
        }
    }

    #[test]
    fn the_refusal_of_a_dashed_key_names_the_bracket_form() {
        let problem = check_expression("$.data.admin-password").unwrap_err();
        let rule = problem.rule();
        assert!(rule.starts_with("not a JSONPath expression: "), "{rule}");
        assert!(
            rule.ends_with(
                "; write $.data['admin-password'] (a name with '-', '.', '/' or a leading digit needs the \
                 bracket form)"
            ),
            "{rule}"
        );
        assert_eq!(check_expression("$.data['admin-password']"), Ok(()));
    }
}
