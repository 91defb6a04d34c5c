//! `docs/api-reference.md`, rendered from the CRDs generated from the Rust types: names, printer
//! columns, every schema field (type, required, default, validation, description) and the CEL rules.
//! The `apidocs` binary writes it; a test fails when the committed file is stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use std::fmt::Write as _;

/// Where the reference lives, relative to the workspace root.
pub const API_REFERENCE_PATH: &str = "docs/api-reference.md";

/// Renders the whole reference.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from the CRD schemas (shared/src/api/crd.rs) by `cargo run -p codegen --bin apidocs`. \
         Do not edit by hand. -->\n\n",
    );
    out.push_str("# API reference: `projection.sh/v1`\n\n");
    out.push_str(
        "Generated from the OpenAPI schemas of the CRDs in `charts/projection/crd-manifests/`, which are generated \
         from the Rust types; a test fails when this page is stale. For a guided tour see \
         [api.md](api.md); for what the controller does with each field see [concepts.md](concepts.md).\n\n",
    );
    out.push_str(
        "Notation: `a.b` is a field of an object, `a[]` an item of a list, `a{}` a value of a map. \
         *Required* means required in its parent object (a required field of an optional object is \
         required only when that object is present); list items and map values show —. Fields marked *nullable* may be `null`, which \
         means the same as absent. The admission webhook checks the same rules with friendlier \
         messages and adds checks that need the cluster ([webhook.md](webhook.md)).\n\n",
    );
    out.push_str("- [`Projection`](#projection)\n- [`ClusterProjection`](#clusterprojection)\n\n");
    for crd in crate::crds::definitions() {
        render_crd(&mut out, &crd);
    }
    // One trailing newline.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

fn render_crd(out: &mut String, crd: &CustomResourceDefinition) {
    let names = &crd.spec.names;
    let Some(version) = crd.spec.versions.first() else {
        return;
    };
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);

    let _ = writeln!(out, "## `{}`\n", names.kind);
    if let Some(description) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{}\n", one_line(description));
    }
    let list = |v: &Option<Vec<String>>| {
        v.as_ref()
            .filter(|v| !v.is_empty())
            .map(|v| v.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "))
            .unwrap_or_else(|| "—".to_owned())
    };
    let mut subresources = Vec::new();
    if let Some(s) = &version.subresources {
        if s.status.is_some() {
            subresources.push("`status`");
        }
        if s.scale.is_some() {
            subresources.push("`scale`");
        }
    }
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| API version | `{}/{}` |", crd.spec.group, version.name);
    let _ = match &names.list_kind {
        Some(list_kind) => writeln!(out, "| kind | `{}` (list: `{list_kind}`) |", names.kind),
        None => writeln!(out, "| kind | `{}` |", names.kind),
    };
    let _ = writeln!(
        out,
        "| resource | `{}` (singular `{}`) |",
        names.plural,
        names.singular.as_deref().unwrap_or("—")
    );
    let _ = writeln!(out, "| scope | {} |", crd.spec.scope);
    let _ = writeln!(out, "| short names | {} |", list(&names.short_names));
    let _ = writeln!(out, "| categories | {} |", list(&names.categories));
    let _ = writeln!(
        out,
        "| served / storage | {} / {} |",
        yes_no(version.served),
        yes_no(version.storage)
    );
    let _ = writeln!(
        out,
        "| subresources | {} |\n",
        if subresources.is_empty() {
            "—".to_owned()
        } else {
            subresources.join(", ")
        }
    );

    let columns = version.additional_printer_columns.as_deref().unwrap_or_default();
    if !columns.is_empty() {
        let _ = writeln!(out, "### `kubectl get` columns\n");
        let _ = writeln!(out, "| column | type | JSONPath | shown |\n|---|---|---|---|");
        for c in columns {
            let shown = match c.priority.unwrap_or(0) {
                0 => "always".to_owned(),
                p => format!("with `-o wide` (priority {p})"),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                c.name,
                c.type_,
                code(&c.json_path),
                shown
            );
        }
        out.push('\n');
    }

    let selectable = version.selectable_fields.as_deref().unwrap_or_default();
    if !selectable.is_empty() {
        let _ = writeln!(out, "### Selectable fields\n");
        let _ = writeln!(
            out,
            "`kubectl get --field-selector` (and any list or watch) can select on these:\n"
        );
        for field in selectable {
            let _ = writeln!(out, "- {}", span(field.json_path.trim_start_matches('.')));
        }
        out.push('\n');
    }

    let mut fields = Vec::new();
    let mut rules = Vec::new();
    walk(&schema, "", &mut fields, &mut rules);

    let _ = writeln!(out, "### Fields\n");
    let _ = writeln!(
        out,
        "| field | type | required | default | validation | description |\n|---|---|---|---|---|---|"
    );
    for f in &fields {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            code(&f.path),
            cell(&f.type_),
            match f.required {
                Some(true) => "yes",
                Some(false) => "no",
                None => "—",
            },
            f.default.as_deref().map(code).unwrap_or_default(),
            cell(&f.validation.join("; ")),
            cell(&f.description),
        );
    }
    out.push('\n');

    if !rules.is_empty() {
        let _ = writeln!(out, "### Validation rules (CEL)\n");
        let _ = writeln!(
            out,
            "Checked by the apiserver on every write, with or without the webhook. `self` is the object \
             at the path.\n"
        );
        let _ = writeln!(out, "| on | rule | message |\n|---|---|---|");
        for r in &rules {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                code(&r.path),
                code(&r.rule),
                cell(&r.message)
            );
        }
        out.push('\n');
    }
}

/// One row of the fields table.
struct Field {
    path: String,
    type_: String,
    /// `None` for list items and map values.
    required: Option<bool>,
    default: Option<String>,
    validation: Vec<String>,
    description: String,
}

/// One CEL rule.
struct Rule {
    path: String,
    rule: String,
    message: String,
}

/// Visits the properties of the object schema `schema` at `path` (`""` for the root).
fn walk(schema: &Value, path: &str, fields: &mut Vec<Field>, rules: &mut Vec<Rule>) {
    collect_rules(schema, path, rules);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    // serde_json keeps keys sorted, so the order is stable.
    for (name, property) in properties {
        let field_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        fields.push(Field {
            path: field_path.clone(),
            type_: type_of(property),
            required: Some(required.contains(&name.as_str())),
            default: property.get("default").map(Value::to_string),
            validation: validation_of(property),
            description: property
                .get("description")
                .and_then(Value::as_str)
                .map(one_line)
                .unwrap_or_default(),
        });
        descend(property, &field_path, fields, rules);
    }
}

/// Visits what is inside `schema` (an object's properties, a list's items, a map's values).
fn descend(schema: &Value, path: &str, fields: &mut Vec<Field>, rules: &mut Vec<Rule>) {
    if schema.get("properties").is_some() {
        walk(schema, path, fields, rules);
    } else {
        collect_rules(schema, path, rules);
    }
    if let Some(items) = schema.get("items") {
        let item_path = format!("{path}[]");
        if is_structured(items) {
            fields.push(Field {
                path: item_path.clone(),
                type_: type_of(items),
                required: None,
                default: None,
                validation: validation_of(items),
                description: items
                    .get("description")
                    .and_then(Value::as_str)
                    .map(one_line)
                    .unwrap_or_default(),
            });
        }
        descend(items, &item_path, fields, rules);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let value_path = format!("{path}{{}}");
        if is_structured(values) {
            fields.push(Field {
                path: value_path.clone(),
                type_: type_of(values),
                required: None,
                default: None,
                validation: validation_of(values),
                description: String::new(),
            });
        }
        descend(values, &value_path, fields, rules);
    }
}

/// Whether a list item or map value deserves its own row: it has a description or constraints
/// beyond its type (plain `string` items are described by their list's type).
fn is_structured(schema: &Value) -> bool {
    schema.get("description").is_some() || !validation_of(schema).is_empty()
}

fn collect_rules(schema: &Value, path: &str, rules: &mut Vec<Rule>) {
    for v in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rules.push(Rule {
            path: if path.is_empty() {
                "(root)".into()
            } else {
                path.into()
            },
            rule: v
                .get("rule")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        });
    }
}

/// `string`, `integer (int32)`, `list of string`, `map of string to string`, `object`.
fn type_of(schema: &Value) -> String {
    let base = schema.get("type").and_then(Value::as_str).unwrap_or("any");
    let with_format = |t: &str, s: &Value| match s.get("format").and_then(Value::as_str) {
        Some(f) => format!("{t} ({f})"),
        None => t.to_owned(),
    };
    match base {
        "array" => {
            let items = schema.get("items").unwrap_or(&Value::Null);
            format!("list of {}", type_of(items))
        }
        "object" => match schema.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) if schema.get("properties").is_none() => {
                format!("map of string to {}", type_of(values))
            }
            _ => "object".to_owned(),
        },
        t => with_format(t, schema),
    }
}

/// Every constraint of the schema node, in words.
fn validation_of(schema: &Value) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|x| span(&plain(x))).collect();
        v.push(format!("one of {}", values.join(", ")));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        v.push(format!("pattern {}", span(p)));
    }
    for (key, words) in [
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("minProperties", "min entries"),
        ("maxProperties", "max entries"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
    ] {
        if let Some(n) = schema.get(key) {
            v.push(format!("{words} {}", number(n)));
        }
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => v.push("a set: no duplicate items".into()),
        Some(other) => v.push(format!("list type `{other}`")),
        None => {}
    }
    if let Some(t) = schema.get("x-kubernetes-map-type").and_then(Value::as_str) {
        v.push(format!("map type `{t}` (replaced as a whole)"));
    }
    if schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        v.push("nullable".into());
    }
    v
}

/// `0.0` → `0`, `253` → `253`.
fn number(n: &Value) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 => format!("{}", f as i64),
        _ => n.to_string(),
    }
}

/// A string value without JSON quotes; other values as JSON.
fn plain(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Descriptions may span lines in the Rust doc comments.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A table cell: pipes escaped (GitHub tables split on them, also inside code spans).
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A code span in a table cell.
fn code(s: &str) -> String {
    cell(&span(s))
}

/// A code span, not yet escaped for a table.
fn span(s: &str) -> String {
    format!("`{s}`")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn committed_api_reference_matches_the_crds() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(API_REFERENCE_PATH);
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert!(
            committed == render(),
            "{} is stale: run `cargo run -p codegen --bin apidocs` and commit the result",
            path.display()
        );
    }

    #[test]
    fn every_schema_field_and_rule_is_rendered() {
        let doc = render();
        for field in [
            "`spec.source.group`",
            "`spec.source.version`",
            "`spec.source.kind`",
            "`spec.source.namespace`",
            "`spec.source.name`",
            "`spec.destination.name`",
            "`spec.destination.namespaces`",
            "`spec.destination.namespaces[]`",
            "`spec.destination.namespaceSelector.matchExpressions[].operator`",
            "`spec.overlay.labels`",
            "`status.conditions[].reason`",
            "`status.failedNamespaces[].namespace`",
            "`status.namespacesWritten`",
            "`status.writtenDestination.version`",
        ] {
            assert!(doc.contains(field), "{field} missing");
        }
        for message in [
            "namespaces and namespaceSelector are mutually exclusive",
            "one of namespaces or namespaceSelector must be set",
            "overlay.labels keys under projection.sh/ are reserved for the operator",
        ] {
            assert!(doc.contains(message), "{message} missing");
        }
        // Patterns with alternatives keep their pipes, escaped for the table.
        assert!(doc.contains(r"pattern `^$\|^v[0-9]+((alpha\|beta)[0-9]+)?$`"));
        assert!(doc.contains("| `status.namespacesFailed` | integer (int32) | no | `0` |"));
        assert!(
            doc.contains("| Failed | integer | `.status.namespacesFailed` | with `-o wide` (priority 1) |")
        );
    }
}
