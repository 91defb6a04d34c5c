//! What `/metrics` serves against what `docs/observability.md` says is exported, for the tests of
//! both services: a metric registered without a line in the doc, or documented and not served,
//! fails there. Here only the two readings, each tested below.

use crate::metrics_format::openmetrics_to_classic;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;

/// The metric names a scraper of `registry` sees now, as the classic text format names its families
/// (counters with `_total`, histograms by their base name). A labelled family with no series yet
/// is not written at all, so callers observe one series of each before asking.
pub fn served_names(registry: &Registry) -> BTreeSet<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("a registry encodes");
    type_names(&openmetrics_to_classic(&text))
}

/// The family names of the `# TYPE` lines of an exposition.
pub fn type_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The metric names documented as exported in `doc`: under the `###` headings `tables`, the first
/// cell of every table whose header starts with `| metric |` (prose there, such as a list of what
/// is *not* exported, is not read); under the headings `prose`, every backticked name of the form
/// `[a-z][a-z0-9_]*` with an underscore outside tables and code blocks (the process metrics are a
/// sentence).
pub fn documented_names(doc: &str, tables: &[&str], prose: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut current: Option<&str> = None;
    let (mut in_code, mut in_metric_table) = (false, false);
    for line in doc.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(heading) = line.strip_prefix("### ") {
            current = Some(heading.trim());
            continue;
        }
        if line.starts_with("## ") || line.starts_with("# ") {
            current = None;
            continue;
        }
        let Some(section) = current else { continue };
        if line.starts_with('|') {
            if line.starts_with("| metric |") {
                in_metric_table = true;
            } else if in_metric_table
                && tables.contains(&section)
                && let Some(name) = line.split('|').nth(1).and_then(backticked)
            {
                names.insert(name);
            }
            continue;
        }
        in_metric_table = false;
        if prose.contains(&section) {
            names.extend(
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter_map(|w| backticked(&format!("`{w}`"))),
            );
        }
    }
    names
}

/// The metric name in a cell or word like `` `name` ``, if it is one.
fn backticked(cell: &str) -> Option<String> {
    let name = cell.trim().strip_prefix('`')?.strip_suffix('`')?;
    let mut chars = name.chars();
    let looks_like_metric = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.contains('_');
    looks_like_metric.then(|| name.to_owned())
}

/// The names a binary must serve by `doc`: the metric tables under the `###` headings `tables`,
/// and the process metrics (`process_*`), a sentence of their own section whose later prose and
/// samples mention other metrics.
pub fn documented_with_process_names(doc: &str, tables: &[&str]) -> BTreeSet<String> {
    let mut names = documented_names(doc, tables, &[]);
    names.extend(
        documented_names(doc, &[], &["Process metrics (both)"])
            .into_iter()
            .filter(|name| name.starts_with("process_")),
    );
    names
}

/// Panics unless `documented` (the names a table of docs/observability.md lists, `table` naming it)
/// and `served` (what the registry exposes) are the same set, naming the difference each way.
pub fn assert_same_names(documented: &BTreeSet<String>, served: &BTreeSet<String>, table: &str) {
    assert_eq!(
        documented.difference(served).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented as exported in docs/observability.md but not served"
    );
    assert_eq!(
        served.difference(documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "served but not in docs/observability.md's {table}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram};

    #[test]
    fn served_names_are_the_classic_family_names_once_observed() {
        let mut registry = Registry::default();
        registry.register("things", "Things done", Counter::<u64>::default());
        registry.register("depth", "Depth", Gauge::<i64>::default());
        registry.register("latency_seconds", "Latency", Histogram::new([0.1, 1.0]));
        let labelled = Family::<Vec<(String, String)>, Counter>::default();
        registry.register("labelled", "Labelled", labelled.clone());
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        // No series yet: not served.
        assert_eq!(
            served_names(&registry),
            names(&["things_total", "depth", "latency_seconds"])
        );
        labelled
            .get_or_create(&vec![("a".to_owned(), "b".to_owned())])
            .inc();
        assert_eq!(
            served_names(&registry),
            names(&["things_total", "depth", "latency_seconds", "labelled_total"])
        );
    }

    #[test]
    fn documented_names_come_from_metric_tables_and_prose_of_the_sections_named() {
        let doc = "\
## Metrics

### Controller

| metric | type | labels | meaning |
|---|---|---|---|
| `a_total` | counter | `kind` | `not_a_name_here` is in a later cell |

| label | values |
|---|---|
| `some_label` | `x` |

Not exported: `gone_total` (read by nobody).

### Process metrics (both)

Read at scrape time: `process_cpu_seconds_total` (counter), `process_threads`.

```console
`in_code_total`
```

### Webhook

| metric | type |
|---|---|
| `b_total` | counter |

## Other

`after_total`
";
        assert_eq!(
            documented_names(doc, &[], &["Process metrics (both)"]),
            BTreeSet::from(["process_cpu_seconds_total", "process_threads"].map(str::to_owned))
        );
        assert_eq!(
            documented_names(doc, &["Webhook"], &[]),
            BTreeSet::from(["b_total".to_owned()])
        );
        // Only metric tables: not the label table, not the "Not exported" sentence.
        assert_eq!(
            documented_names(doc, &["Controller"], &[]),
            BTreeSet::from(["a_total".to_owned()])
        );
        // Read as prose, the sentence counts.
        assert!(documented_names(doc, &[], &["Controller"]).contains("gone_total"));
    }
}
