//! Printing: kubectl-style columns, JSON and YAML.

use crate::{cli::Output, exit::Failure};
use anyhow::Context as _;
use serde::Serialize;

/// Columns aligned as kubectl prints them (three spaces between columns, `<none>` for empty cells
/// is left to the caller).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `value` as JSON, YAML or a JSONPath template's text when `-o` asks for one; `None` for the
/// columns. `-o name` is for the commands that list CRs, which print it themselves.
pub fn structured<T: Serialize>(output: &Output, value: &T) -> Result<Option<String>, Failure> {
    Ok(match output {
        Output::Json => Some(serde_json::to_string_pretty(value).context("encoding JSON")? + "\n"),
        Output::Yaml => Some(serde_yaml::to_string(value).context("encoding YAML")?),
        Output::JsonPath(template) => {
            let value = serde_json::to_value(value).context("encoding JSON")?;
            Some(
                jsonpath_template(template, &value)
                    .map_err(|e| Failure::Usage(format!("-o jsonpath: {e}")))?,
            )
        }
        Output::Name => {
            return Err(Failure::Usage(
                "-o name prints CRs: only `status` lists them (use -o json or -o jsonpath here)".to_owned(),
            ));
        }
        Output::Table | Output::Wide => None,
    })
}

/// kubectl's JSONPath template over `value`: literal text, `{EXPR}` (`.a.b`, `[*]`, filters; each
/// result printed raw when a string, else as JSON, several separated by a space) and `{"text"}`
/// (with `\n` and `\t`). `{range}`/`{end}` are not supported: an error says so.
pub fn jsonpath_template(template: &str, value: &serde_json::Value) -> Result<String, String> {
    use jsonpath_rust::JsonPath as _;
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("unclosed {{ in {template:?}"))?;
        let expr = after[..close].trim();
        rest = &after[close + 1..];
        if let Some(text) = expr.strip_prefix('"').and_then(|e| e.strip_suffix('"')) {
            out.push_str(&text.replace("\\n", "\n").replace("\\t", "\t"));
            continue;
        }
        if expr.starts_with("range") || expr == "end" {
            return Err(format!("{{{expr}}} is not supported; use -o json with jq"));
        }
        let path = match expr.strip_prefix('@') {
            Some(tail) => format!("${tail}"),
            None if expr.starts_with('$') => expr.to_owned(),
            None if expr.starts_with('.') || expr.starts_with('[') => format!("${expr}"),
            None => format!("$.{expr}"),
        };
        let found = value
            .query(&path)
            .map_err(|e| format!("{expr:?} is not a JSONPath expression: {e}"))?;
        let shown: Vec<String> = found
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        out.push_str(&shown.join(" "));
    }
    out.push_str(rest);
    Ok(out)
}

/// An empty cell as kubectl shows it.
pub fn or_none(text: &str) -> String {
    if text.is_empty() {
        "<none>".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_templates_read_what_json_prints() {
        let value = serde_json::json!([
            {"kind": "Projection", "name": "a", "ready": "True", "copies": 1},
            {"kind": "ClusterProjection", "name": "b", "ready": "False", "copies": 3},
        ]);
        let table = [
            ("{[*].name}", "a b"),
            ("{[0].copies}", "1"),
            ("names: {[*].name}{\"\\n\"}", "names: a b\n"),
            ("{[?@.ready == 'False'].name}", "b"),
            ("{$[1].kind}", "ClusterProjection"),
        ];
        for (template, expected) in table {
            assert_eq!(
                jsonpath_template(template, &value).as_deref(),
                Ok(expected),
                "{template}"
            );
        }
        assert!(
            jsonpath_template("{range [*]}{.name}{end}", &value)
                .unwrap_err()
                .contains("not supported")
        );
        assert!(
            jsonpath_template("{[*].name", &value)
                .unwrap_err()
                .contains("unclosed")
        );
        assert!(
            jsonpath_template("{[?@.x ==]}", &value)
                .unwrap_err()
                .contains("not a JSONPath expression")
        );
    }

    #[test]
    fn columns_align_and_lines_carry_no_trailing_space() {
        let rows = vec![
            vec!["a".to_owned(), "longer".to_owned(), String::new()],
            vec!["bbbb".to_owned(), "x".to_owned(), "z".to_owned()],
        ];
        assert_eq!(
            table(&["NAME", "STATE", "NOTE"], &rows),
            "NAME   STATE    NOTE\na      longer\nbbbb   x        z\n"
        );
    }
}
