//! Field rules of `Projection` and `ClusterProjection` specs (SPEC §3), as pure functions. The
//! admission webhook denies with them; the controller can run them again as defence in depth. Every
//! error names the field path and the rule, and all errors are returned at once, so one `kubectl
//! apply` shows everything that needs fixing.

use crate::{
    api::copy_spec::{DATA_KEY_PATTERN, KEY_GLOB_PATTERN, METADATA_GLOB_PATTERN, MetadataKeyFilter},
    api::crd::{
        ClusterProjectionSpec, CopyControls, DNS1123_LABEL, DNS1123_SUBDOMAIN, GROUP_PATTERN, KIND_PATTERN,
        Overlay, ProjectionSpec, SourceRef, VERSION_PATTERN,
    },
    api::keys::RESERVED_PREFIX,
    copy::content::CopyRules,
    copy::field_exclusion::check_expression,
    copy::self_copy::self_copy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use regex::Regex;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::LazyLock,
};

/// One broken rule: where, and what the rule is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.source.kind` or `spec.overlay.labels[team]`.
    pub path: String,
    /// The rule, phrased so the user knows what to write instead.
    pub rule: String,
}

impl FieldError {
    fn new(path: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.rule)
    }
}

/// Every broken rule of one spec, in field order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub Vec<FieldError>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

/// Kubernetes' limit on the total size of an object's annotations.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;
const LABEL_VALUE_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;
const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// A string rule: a length bound and a pattern shared with the CRD schema.
struct StringRule {
    pattern: &'static str,
    regex: LazyLock<Regex>,
    max_len: usize,
    /// What the pattern means, with an example, for people who do not read regular expressions.
    meaning: &'static str,
}

macro_rules! string_rule {
    ($pattern:expr, $max:expr, $meaning:expr) => {
        StringRule {
            pattern: $pattern,
            // The patterns are compile-time constants covered by the tests below.
            #[allow(clippy::unwrap_used)]
            regex: LazyLock::new(|| Regex::new($pattern).unwrap()),
            max_len: $max,
            meaning: $meaning,
        }
    };
}

static GROUP: StringRule = string_rule!(
    GROUP_PATTERN,
    253,
    "empty for the core group, or a DNS-1123 subdomain, e.g. apps or example.com"
);
static VERSION: StringRule = string_rule!(
    VERSION_PATTERN,
    usize::MAX,
    "empty for the preferred version, or e.g. v1, v1beta1, v2alpha3"
);
static KIND: StringRule = string_rule!(KIND_PATTERN, usize::MAX, "PascalCase kind, e.g. ConfigMap");
static NAMESPACE: StringRule = string_rule!(
    DNS1123_LABEL,
    63,
    "DNS-1123 label: lowercase alphanumerics and '-', starting and ending with an alphanumeric, e.g. team-a"
);
static OBJECT_NAME: StringRule = string_rule!(
    DNS1123_SUBDOMAIN,
    253,
    "DNS-1123 subdomain: lowercase alphanumerics, '-' and '.', e.g. shared-settings"
);
static NAME_PART: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)]
    Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").unwrap()
});

impl StringRule {
    /// The rule's problem with `value`, if any.
    fn problem(&self, value: &str) -> Option<String> {
        if value.len() > self.max_len {
            return Some(format!(
                "must be at most {} characters (has {})",
                self.max_len,
                value.len()
            ));
        }
        if self.regex.is_match(value) {
            return None;
        }
        // `^$|` only admits the empty value, which is never the problem; leave it out of the message.
        let shown = self.pattern.trim_start_matches("^$|");
        Some(format!("must match {shown} ({})", self.meaning))
    }

    fn check(&self, errors: &mut Vec<FieldError>, path: &str, value: &str) {
        if let Some(rule) = self.problem(value) {
            errors.push(FieldError::new(path, rule));
        }
    }

    fn check_required(&self, errors: &mut Vec<FieldError>, path: &str, value: &str) {
        if value.is_empty() {
            errors.push(FieldError::new(path, format!("required ({})", self.meaning)));
        } else {
            self.check(errors, path, value);
        }
    }
}

/// The problem with a label or annotation key (a Kubernetes qualified name), if any.
fn qualified_name_problem(key: &str) -> Option<String> {
    const SHAPE: &str = "an optional DNS-1123 subdomain prefix and '/', then at most 63 alphanumerics, \
                         '-', '_' or '.', starting and ending with an alphanumeric, e.g. app.kubernetes.io/name";
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && OBJECT_NAME.problem(p).is_none());
    let name_ok = name.len() <= QUALIFIED_NAME_MAX && NAME_PART.is_match(name);
    (!(prefix_ok && name_ok)).then(|| format!("invalid key {key:?}: must be {SHAPE}"))
}

/// The problem with a label value, if any.
fn label_value_problem(value: &str) -> Option<String> {
    let ok = value.is_empty() || (value.len() <= LABEL_VALUE_MAX && NAME_PART.is_match(value));
    (!ok).then(|| {
        format!(
            "invalid value {value:?}: must be empty or at most 63 alphanumerics, '-', '_' or '.', \
             starting and ending with an alphanumeric"
        )
    })
}

/// Reads a spec into its type; a missing field or a wrong type is reported with its path.
pub fn parse_spec<T: DeserializeOwned>(spec: Option<&Value>) -> Result<T, Invalid> {
    let Some(spec) = spec.filter(|s| !s.is_null()) else {
        return Err(Invalid(vec![FieldError::new("spec", "required")]));
    };
    serde_path_to_error::deserialize(spec).map_err(|e| {
        // serde reads a flattened struct from a buffer, so an error in one of the `CopyControls`
        // fields surfaces at `spec` itself; reading those fields alone finds its path.
        let e = if e.path().to_string() == "." {
            serde_path_to_error::deserialize::<_, CopyControls>(spec)
                .err()
                .unwrap_or(e)
        } else {
            e
        };
        let at = e.path().to_string();
        let base = if at == "." {
            "spec".to_owned()
        } else {
            format!("spec.{at}")
        };
        let message = e.inner().to_string();
        // serde names the missing field in its message, at the path of the enclosing object.
        let error = match message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
        {
            Some((field, _)) => FieldError::new(format!("{base}.{field}"), "required"),
            None => FieldError::new(base, message),
        };
        Invalid(vec![error])
    })
}

/// Parses and validates a `Projection` spec in `namespace`.
pub fn check_projection(namespace: &str, spec: Option<&Value>) -> Result<ProjectionSpec, Invalid> {
    let spec: ProjectionSpec = parse_spec(spec)?;
    let errors = validate_projection(namespace, &spec);
    if errors.is_empty() {
        Ok(spec)
    } else {
        Err(Invalid(errors))
    }
}

/// Parses and validates a `ClusterProjection` spec.
pub fn check_cluster_projection(spec: Option<&Value>) -> Result<ClusterProjectionSpec, Invalid> {
    let spec: ClusterProjectionSpec = parse_spec(spec)?;
    let errors = validate_cluster_projection(&spec);
    if errors.is_empty() {
        Ok(spec)
    } else {
        Err(Invalid(errors))
    }
}

/// Every broken rule of a `Projection` spec living in `namespace`.
pub fn validate_projection(namespace: &str, spec: &ProjectionSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_source(&mut errors, &spec.source);
    let explicit_name = spec.destination.as_ref().and_then(|d| d.name.as_deref());
    if let Some(name) = explicit_name {
        OBJECT_NAME.check(&mut errors, "spec.destination.name", name);
    }
    let copy_name = explicit_name.unwrap_or(&spec.source.name);
    if let Some(found) = self_copy(&spec.source, namespace, copy_name) {
        let path = if explicit_name.is_some() {
            "spec.destination.name"
        } else {
            "spec.source"
        };
        errors.push(FieldError::new(path, found.projection_message()));
    }
    validate_overlay(&mut errors, spec.controls.overlay.as_deref());
    validate_copy_rules(&mut errors, &CopyRules::of(&spec.controls));
    errors
}

/// Every broken rule of a `ClusterProjection` spec.
pub fn validate_cluster_projection(spec: &ClusterProjectionSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_source(&mut errors, &spec.source);
    let destination = &spec.destination;
    if let Some(name) = destination.name.as_deref() {
        OBJECT_NAME.check(&mut errors, "spec.destination.name", name);
    }
    match (&destination.namespaces, &destination.namespace_selector) {
        (Some(_), Some(_)) => errors.push(FieldError::new(
            "spec.destination",
            "namespaces and namespaceSelector are mutually exclusive: set exactly one",
        )),
        (None, None) => errors.push(FieldError::new(
            "spec.destination",
            "set exactly one of namespaces (an explicit list) or namespaceSelector",
        )),
        _ => {}
    }
    if let Some(namespaces) = &destination.namespaces {
        let copy_name = destination.name.as_deref().unwrap_or(&spec.source.name);
        validate_namespaces(&mut errors, namespaces, &spec.source, copy_name);
    }
    if let Some(selector) = &destination.namespace_selector {
        validate_selector(&mut errors, "spec.destination.namespaceSelector", selector);
    }
    validate_overlay(&mut errors, spec.controls.overlay.as_deref());
    validate_copy_rules(&mut errors, &CopyRules::of(&spec.controls));
    errors
}

fn validate_source(errors: &mut Vec<FieldError>, source: &SourceRef) {
    GROUP.check(errors, "spec.source.group", &source.group);
    VERSION.check(errors, "spec.source.version", &source.version);
    KIND.check_required(errors, "spec.source.kind", &source.kind);
    NAMESPACE.check_required(errors, "spec.source.namespace", &source.namespace);
    OBJECT_NAME.check_required(errors, "spec.source.name", &source.name);
}

fn validate_namespaces(errors: &mut Vec<FieldError>, namespaces: &[String], source: &SourceRef, copy: &str) {
    if namespaces.is_empty() {
        errors.push(FieldError::new(
            "spec.destination.namespaces",
            "must list at least one namespace",
        ));
    }
    let mut first_seen: HashMap<&str, usize> = HashMap::new();
    for (i, namespace) in namespaces.iter().enumerate() {
        let path = format!("spec.destination.namespaces[{i}]");
        NAMESPACE.check_required(errors, &path, namespace);
        let first = *first_seen.entry(namespace.as_str()).or_insert(i);
        if first != i {
            errors.push(FieldError::new(
                &path,
                format!("duplicate namespace {namespace:?} (already at namespaces[{first}])"),
            ));
        }
        if let Some(found) = self_copy(source, namespace, copy) {
            errors.push(FieldError::new(&path, found.listed_namespace_message()));
        }
    }
}

fn validate_selector(errors: &mut Vec<FieldError>, path: &str, selector: &LabelSelector) {
    let labels = selector.match_labels.as_ref().filter(|l| !l.is_empty());
    let expressions = selector.match_expressions.as_ref().filter(|e| !e.is_empty());
    if labels.is_none() && expressions.is_none() {
        errors.push(FieldError::new(
            path,
            "must not be empty: an empty selector would select every namespace (give matchLabels or \
             matchExpressions, or list namespaces)",
        ));
    }
    for (key, value) in labels.into_iter().flatten() {
        let at = format!("{path}.matchLabels[{key}]");
        errors.extend(qualified_name_problem(key).map(|r| FieldError::new(&at, r)));
        errors.extend(label_value_problem(value).map(|r| FieldError::new(&at, r)));
    }
    for (i, requirement) in expressions.into_iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        errors.extend(
            qualified_name_problem(&requirement.key).map(|r| FieldError::new(format!("{at}.key"), r)),
        );
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            op @ ("In" | "NotIn") if values.is_empty() => errors.push(FieldError::new(
                format!("{at}.values"),
                format!("must not be empty for operator {op}"),
            )),
            op @ ("Exists" | "DoesNotExist") if !values.is_empty() => errors.push(FieldError::new(
                format!("{at}.values"),
                format!("must be empty for operator {op}"),
            )),
            op if !OPERATORS.contains(&op) => errors.push(FieldError::new(
                format!("{at}.operator"),
                format!("unknown operator {op:?}: must be one of {}", OPERATORS.join(", ")),
            )),
            _ => {}
        }
        for (j, value) in values.iter().enumerate() {
            errors
                .extend(label_value_problem(value).map(|r| FieldError::new(format!("{at}.values[{j}]"), r)));
        }
    }
}

fn validate_overlay(errors: &mut Vec<FieldError>, overlay: Option<&Overlay>) {
    let Some(overlay) = overlay else { return };
    let reserved = |field: &str| {
        format!("keys under {RESERVED_PREFIX} are reserved for the operator; use another {field} key")
    };
    for (key, value) in overlay.labels.iter().flatten() {
        let at = format!("spec.overlay.labels[{key}]");
        if key.starts_with(RESERVED_PREFIX) {
            errors.push(FieldError::new(&at, reserved("label")));
        } else {
            errors.extend(qualified_name_problem(key).map(|r| FieldError::new(&at, r)));
        }
        errors.extend(label_value_problem(value).map(|r| FieldError::new(&at, r)));
    }
    let annotations: &BTreeMap<String, String> = match &overlay.annotations {
        Some(a) => a,
        None => return,
    };
    for key in annotations.keys() {
        let at = format!("spec.overlay.annotations[{key}]");
        if key.starts_with(RESERVED_PREFIX) {
            errors.push(FieldError::new(&at, reserved("annotation")));
        } else {
            errors.extend(qualified_name_problem(key).map(|r| FieldError::new(&at, r)));
        }
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > ANNOTATIONS_MAX_BYTES {
        errors.push(FieldError::new(
            "spec.overlay.annotations",
            format!("must total at most 256 KiB of keys and values (has {size} bytes)"),
        ));
    }
}

/// The rules of `spec.metadata`, `spec.keys` and `spec.fields` (SPEC §10, "What a copy carries").
fn validate_copy_rules(errors: &mut Vec<FieldError>, rules: &CopyRules<'_>) {
    if let Some(metadata) = rules.metadata {
        for (field, filter) in [
            ("labels", metadata.labels.as_ref()),
            ("annotations", metadata.annotations.as_ref()),
        ] {
            validate_metadata_filter(errors, &format!("spec.metadata.{field}"), filter);
        }
    }
    if let Some(keys) = rules.keys {
        validate_globs(errors, "spec.keys.include", keys.include.as_deref(), &KEY_GLOB);
        validate_globs(errors, "spec.keys.exclude", keys.exclude.as_deref(), &KEY_GLOB);
        if keys.include.as_ref().is_some_and(Vec::is_empty) {
            errors.push(FieldError::new(
                "spec.keys.include",
                "must list at least one glob (omit include to select every key)",
            ));
        }
        let mut targets: BTreeMap<&str, &str> = BTreeMap::new();
        for (from, to) in keys.rename.iter().flatten() {
            let at = format!("spec.keys.rename[{from}]");
            DATA_KEY.check_required(errors, &at, from);
            DATA_KEY.check_required(errors, &at, to);
            if let Some(first) = targets.insert(to.as_str(), from.as_str()) {
                errors.push(FieldError::new(
                    &at,
                    format!("renames onto {to:?}, as rename[{first}] does: two keys cannot share one name"),
                ));
            }
        }
    }
    if let Some(fields) = rules.fields {
        for (i, expression) in fields.exclude.iter().enumerate() {
            if let Err(problem) = check_expression(expression) {
                errors.push(FieldError::new(
                    format!("spec.fields.exclude[{i}]"),
                    problem.rule(),
                ));
            }
        }
    }
}

static KEY_GLOB: StringRule = string_rule!(
    KEY_GLOB_PATTERN,
    253,
    "a data key or a glob of keys: alphanumerics, '-', '_', '.', with '*' for any run and '?' for one character, e.g. *.crt"
);
static DATA_KEY: StringRule = string_rule!(
    DATA_KEY_PATTERN,
    253,
    "a data key: alphanumerics, '-', '_' or '.', e.g. ca.crt"
);
static METADATA_GLOB: StringRule = string_rule!(
    METADATA_GLOB_PATTERN,
    317,
    "a label or annotation key or a glob of keys, with '*' for any run and '?' for one character, e.g. argocd.argoproj.io/*"
);

fn validate_globs(errors: &mut Vec<FieldError>, path: &str, globs: Option<&[String]>, rule: &StringRule) {
    for (i, glob) in globs.into_iter().flatten().enumerate() {
        rule.check_required(errors, &format!("{path}[{i}]"), glob);
    }
}

fn validate_metadata_filter(errors: &mut Vec<FieldError>, path: &str, filter: Option<&MetadataKeyFilter>) {
    let Some(filter) = filter else { return };
    let include = filter.include.as_deref();
    validate_globs(errors, &format!("{path}.include"), include, &METADATA_GLOB);
    validate_globs(
        errors,
        &format!("{path}.exclude"),
        filter.exclude.as_deref(),
        &METADATA_GLOB,
    );
    for (i, glob) in include.into_iter().flatten().enumerate() {
        if glob.starts_with(RESERVED_PREFIX) {
            errors.push(FieldError::new(
                format!("{path}.include[{i}]"),
                format!("keys under {RESERVED_PREFIX} are reserved for the operator and never travel"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles_and_means_what_the_crd_says() {
        assert!(GROUP.problem("").is_none());
        assert!(GROUP.problem("example.com").is_none());
        assert!(VERSION.problem("").is_none());
        assert!(VERSION.problem("v2beta1").is_none());
        assert!(KIND.problem("ConfigMap").is_none());
        assert!(NAMESPACE.problem("team-a").is_none());
        assert!(OBJECT_NAME.problem("a.b-c").is_none());
        assert_eq!(
            KIND.problem("configMap").as_deref(),
            Some("must match ^[A-Z][a-zA-Z0-9]*$ (PascalCase kind, e.g. ConfigMap)")
        );
        assert!(NAMESPACE.problem(&"a".repeat(64)).unwrap().contains("at most 63"));
    }

    #[test]
    fn qualified_names_follow_kubernetes() {
        for good in ["a", "app.kubernetes.io/name", "x_y.z-1", "example.com/A1"] {
            assert_eq!(qualified_name_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "/a",
            "a/",
            "Example.com/a",
            "a/b/c",
            &"a".repeat(64),
        ] {
            assert!(qualified_name_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(label_value_problem(""), None);
        assert!(label_value_problem("has space").is_some());
    }

    #[test]
    fn parse_errors_name_the_field() {
        let missing = serde_json::json!({"source": {"namespace": "a", "name": "b"}});
        let err = parse_spec::<ProjectionSpec>(Some(&missing)).unwrap_err();
        assert_eq!(err.to_string(), "spec.source.kind: required");
        let wrong = serde_json::json!({"source": {"kind": 5, "namespace": "a", "name": "b"}});
        let err = parse_spec::<ProjectionSpec>(Some(&wrong)).unwrap_err();
        assert!(
            err.to_string().starts_with("spec.source.kind: invalid type"),
            "{err}"
        );
        assert_eq!(
            parse_spec::<ProjectionSpec>(None).unwrap_err().to_string(),
            "spec: required"
        );
    }
}
