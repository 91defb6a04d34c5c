//! `docs/observability.md` must name, in backticks, every condition type and reason, event reason and
//! action, metric and metric label value the code can produce. Reasons, actions and results come
//! from their types in `shared` (a reason added to the enum without a line in the doc fails here);
//! metric names and the other label values are scraped from the sources of the controller and the
//! webhook (test modules excluded).

use regex::Regex;
use shared::{
    api::reason::{Reason, ResultCategory, Verb},
    pass::status::CONDITION_TYPES,
};
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The text of a source file without its `#[cfg(test)]` module.
fn code(relative: &str) -> String {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// Every `.rs` file under `dir`, recursively, without test modules.
fn code_under(dir: &str) -> String {
    fn visit(path: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(path).expect("readable source directory") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                visit(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    visit(&root().join(dir), &mut files);
    files.sort();
    files
        .iter()
        .map(|f| {
            let relative = f.strip_prefix(root()).expect("under the root");
            code(&relative.to_string_lossy())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first capture group of every match of `pattern` in `text`.
fn captures(pattern: &str, text: &str) -> BTreeSet<String> {
    Regex::new(pattern)
        .expect("valid pattern")
        .captures_iter(text)
        .map(|c| c[1].to_owned())
        .collect()
}

fn doc() -> String {
    let path = root().join("docs/observability.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn assert_documented(what: &str, names: &BTreeSet<String>, at_least: usize) {
    assert!(
        names.len() >= at_least,
        "found only {} {what} in the code ({names:?}); did the code's shape change? update this test",
        names.len()
    );
    let doc = doc();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/observability.md does not name these {what}: {missing:?}"
    );
}

#[test]
fn every_condition_type_and_reason_is_documented() {
    let mut names: BTreeSet<String> = CONDITION_TYPES.iter().map(|t| (*t).to_owned()).collect();
    names.extend(Reason::ALL.iter().map(|r| r.as_str().to_owned()));
    assert_documented("condition types and reasons", &names, 20);
}

#[test]
fn every_event_reason_and_action_is_documented() {
    let names: BTreeSet<String> = Reason::ALL
        .iter()
        .filter(|r| r.verb().is_some())
        .map(|r| r.as_str().to_owned())
        .collect();
    assert_documented("event reasons", &names, 16);

    let actions: BTreeSet<String> = Verb::ALL.iter().map(|v| v.as_str().to_owned()).collect();
    assert_documented("event actions", &actions, 6);
}

#[test]
fn every_metric_is_documented() {
    let mut names = BTreeSet::new();
    let registered =
        Regex::new(r#"register\(\s*"(\w+)",\s*"[^"]*",\s*(?:metrics|families)\.(\w+)\.clone\(\)"#)
            .expect("valid");
    for file in [
        "controller/src/metrics.rs",
        "controller/src/queue_metrics.rs",
        "webhook/src/metrics.rs",
    ] {
        let text = code(file);
        let counters = captures(r"(?:pub )?(\w+): (?:Family<\w+, )?Counter\b", &text);
        for c in registered.captures_iter(&text) {
            // prometheus-client exposes counters with a `_total` suffix.
            names.insert(if counters.contains(&c[2]) {
                format!("{}_total", &c[1])
            } else {
                c[1].to_owned()
            });
        }
    }
    // Gauges computed at scrape time by the controller's own collector.
    names.extend(captures(
        r#"encode_descriptor\(\s*"(\w+)""#,
        &code("controller/src/metrics.rs"),
    ));
    let process = code("runtime/src/process_metrics.rs");
    names.extend(captures(r#""(process_\w+)""#, &process));
    // The CPU counter is registered without its `_total` suffix.
    if names.remove("process_cpu_seconds") {
        names.insert("process_cpu_seconds_total".into());
    }
    assert_documented("metrics", &names, 27);
}

#[test]
fn every_metric_label_value_is_documented() {
    let mut values = BTreeSet::new();
    let label = r#"(?:kind|result|event|category|endpoint|resource|operation|verdict): "(\w+)""#;
    for file in [
        "controller/src/pass/mod.rs",
        "controller/src/pass/report.rs",
        "webhook/src/handler.rs",
    ] {
        values.extend(captures(label, &code(file)));
    }
    values.extend(ResultCategory::ALL.iter().map(|c| c.as_str().to_owned()));
    for file in [
        "controller/src/error.rs",
        "webhook/src/error.rs",
        "webhook/src/review.rs",
        "runtime/src/tls.rs",
    ] {
        values.extend(captures(r#"=> "(\w+)""#, &code(file)));
    }
    values.extend(captures(r#"(?m)^\s+"(\w+)"\s*$"#, &code("runtime/src/tls.rs")));
    values.extend(captures(
        r#"const KIND: &'static str = "(\w+)";"#,
        &code_under("controller/src"),
    ));
    assert_documented("metric label values", &values, 30);
}
