//! The two exposition formats of `/metrics`: OpenMetrics (what the metrics library writes) for the
//! scrapers that ask for it, the classic Prometheus text format (version 0.0.4) for every other.
//! Pure: content negotiation and the conversion, both tested here.

/// The content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic Prometheus text format.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scraper's `Accept` header asks for OpenMetrics: one of its media ranges is
/// `application/openmetrics-text` with a non-zero quality. Anything else (no header, `*/*`,
/// `text/plain`) gets the classic format, as client_golang answers.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("application/openmetrics-text")
                && !parts.any(|param| {
                    let (key, value) = param.split_once('=').unwrap_or((param, ""));
                    key.trim().eq_ignore_ascii_case("q")
                        && value.trim().parse::<f64>().is_ok_and(|q| q <= 0.0)
                })
        })
    })
}

/// How a family's type and sample names read in the classic format.
struct Family {
    /// The name its `# HELP` and `# TYPE` lines carry there.
    classic_name: String,
    /// Its type there.
    classic_type: &'static str,
    /// The OpenMetrics name of the family, to drop its `_created` samples, which the classic
    /// format does not have.
    created_sample: Option<String>,
}

fn family(name: &str, openmetrics_type: &str) -> Family {
    let (classic_name, classic_type) = match openmetrics_type {
        "counter" => (format!("{name}_total"), "counter"),
        "gauge" => (name.to_owned(), "gauge"),
        "histogram" => (name.to_owned(), "histogram"),
        "summary" => (name.to_owned(), "summary"),
        "info" => (format!("{name}_info"), "gauge"),
        "stateset" => (name.to_owned(), "gauge"),
        _ => (name.to_owned(), "untyped"),
    };
    let created_sample =
        matches!(openmetrics_type, "counter" | "histogram" | "summary").then(|| format!("{name}_created"));
    Family {
        classic_name,
        classic_type,
        created_sample,
    }
}

/// Converts OpenMetrics text to the classic Prometheus text format: counters' `# HELP`/`# TYPE`
/// lines carry the `_total` sample name, `unknown` becomes `untyped` (`info` and `stateset` become
/// gauges), `# UNIT`, `# EOF`, `_created` samples and exemplars go, timestamps turn from seconds
/// into milliseconds.
pub fn openmetrics_to_classic(openmetrics: &str) -> String {
    // `# HELP` comes before `# TYPE` in a family: read every type first.
    let types: std::collections::HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name, kind.trim()))
        .collect();
    let describe = |name: &str| family(name, types.get(name).copied().unwrap_or("unknown"));
    let mut out = String::with_capacity(openmetrics.len());
    let mut current: Option<Family> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let family = describe(name);
            // OpenMetrics escapes `"` in help text; the classic format does not.
            let help = help.replace("\\\"", "\"");
            out.push_str(&format!("# HELP {} {help}\n", family.classic_name));
            current = Some(family);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(name, _)| name);
            let family = describe(name);
            out.push_str(&format!(
                "# TYPE {} {}\n",
                family.classic_name, family.classic_type
            ));
            current = Some(family);
        } else if line.starts_with('#') || line.trim().is_empty() {
            // `# UNIT`, `# EOF` and other comments have no classic counterpart.
        } else if let Some(sample) = classic_sample(line, current.as_ref()) {
            out.push_str(&sample);
            out.push('\n');
        }
    }
    out
}

/// One sample line in the classic format, or `None` for a `_created` sample.
fn classic_sample(line: &str, family: Option<&Family>) -> Option<String> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if family.and_then(|f| f.created_sample.as_deref()) == Some(name) {
        return None;
    }
    let labels_end = if line[name_end..].starts_with('{') {
        name_end + labels_length(&line[name_end..])
    } else {
        name_end
    };
    let (series, rest) = line.split_at(labels_end);
    // After the value: an optional timestamp, then an optional exemplar (` # {…} value`).
    let rest = rest.split(" # ").next().unwrap_or_default();
    let mut fields = rest.split_whitespace();
    let value = fields.next().unwrap_or_default();
    Some(match fields.next().and_then(|t| t.parse::<f64>().ok()) {
        Some(seconds) => format!("{series} {value} {}", (seconds * 1000.0).round() as i64),
        None => format!("{series} {value}"),
    })
}

/// The length of a label set `{…}` at the start of `text`, quotes and escapes respected.
fn labels_length(text: &str) -> usize {
    let mut in_quotes = false;
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return index + 1,
            _ => {}
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_accept_naming_openmetrics_gets_openmetrics() {
        // Prometheus's own scrape header.
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(wants_openmetrics(Some("Application/OpenMetrics-Text")));
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text; q=0, text/plain"
        )));
    }

    #[test]
    fn counters_take_their_sample_name_and_the_rest_stays() {
        let openmetrics = "\
# HELP projection_reconcile Reconciles that reached an outcome.
# TYPE projection_reconcile counter
projection_reconcile_total{kind=\"Projection\",result=\"success\"} 3
projection_reconcile_created{kind=\"Projection\",result=\"success\"} 1700000000.5
# HELP workqueue_depth Current depth of workqueue.
# TYPE workqueue_depth gauge
workqueue_depth{name=\"projection\",controller=\"projection\",priority=\"\"} 0
# HELP reconcile_time_seconds Length of \\\"time\\\".
# TYPE reconcile_time_seconds histogram
# UNIT reconcile_time_seconds seconds
reconcile_time_seconds_sum{controller=\"projection\"} 0.25
reconcile_time_seconds_count{controller=\"projection\"} 2
reconcile_time_seconds_bucket{le=\"0.005\",controller=\"projection\"} 1
reconcile_time_seconds_bucket{le=\"+Inf\",controller=\"projection\"} 2 # {trace_id=\"a # b\"} 0.2 1700000000.0
# HELP build Build information.
# TYPE build info
build_info{version=\"1 } # x\"} 1
# TYPE mystery unknown
mystery 7 1700000000.25
# EOF
";
        let classic = "\
# HELP projection_reconcile_total Reconciles that reached an outcome.
# TYPE projection_reconcile_total counter
projection_reconcile_total{kind=\"Projection\",result=\"success\"} 3
# HELP workqueue_depth Current depth of workqueue.
# TYPE workqueue_depth gauge
workqueue_depth{name=\"projection\",controller=\"projection\",priority=\"\"} 0
# HELP reconcile_time_seconds Length of \"time\".
# TYPE reconcile_time_seconds histogram
reconcile_time_seconds_sum{controller=\"projection\"} 0.25
reconcile_time_seconds_count{controller=\"projection\"} 2
reconcile_time_seconds_bucket{le=\"0.005\",controller=\"projection\"} 1
reconcile_time_seconds_bucket{le=\"+Inf\",controller=\"projection\"} 2
# HELP build_info Build information.
# TYPE build_info gauge
build_info{version=\"1 } # x\"} 1
# TYPE mystery untyped
mystery 7 1700000000250
";
        assert_eq!(openmetrics_to_classic(openmetrics), classic);
    }

    #[test]
    fn the_library_output_converts_to_parseable_classic_text() {
        use prometheus_client::metrics::{counter::Counter, histogram::Histogram};
        let mut registry = prometheus_client::registry::Registry::default();
        let counter = Counter::<u64>::default();
        counter.inc();
        registry.register("things", "Things done", counter);
        registry.register("latency_seconds", "Latency", Histogram::new([0.1, 1.0]));
        let mut openmetrics = String::new();
        prometheus_client::encoding::text::encode(&mut openmetrics, &registry).expect("encodes");
        let classic = openmetrics_to_classic(&openmetrics);
        assert!(
            classic.contains("# TYPE things_total counter\nthings_total 1\n"),
            "{classic}"
        );
        assert!(
            classic.contains("# TYPE latency_seconds histogram\n"),
            "{classic}"
        );
        assert!(
            classic.contains("latency_seconds_bucket{le=\"+Inf\"} 0\n"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF"), "{classic}");
        // Every line is a comment or `series value`.
        for line in classic.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(
                line.rsplit_once(' ').map(|(_, v)| v.parse::<f64>().is_ok()),
                Some(true),
                "{line}"
            );
        }
    }
}
