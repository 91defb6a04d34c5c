//! Logs of both services: JSON records (one `message` key, the rest named fields) for pipelines, or
//! text for a person at a terminal; filtered by `RUST_LOG` on top of the defaults.

use std::io::IsTerminal;
use tracing_subscriber::{EnvFilter, fmt};

/// What is logged when `RUST_LOG` names nothing else: `info`, except kube's watcher below ERROR.
/// Our watch tasks log each watch error once with the apiserver's message; kube's watcher would log
/// the same error again at WARN as a `Debug` dump of the apiserver's answer.
pub const DEFAULT_FILTER: &str = "info,kube_runtime::watcher=error";

/// The global level when `RUST_LOG` sets none.
const DEFAULT_LEVEL: &str = "info";
/// The watcher's directive, kept unless `RUST_LOG` says something about the watcher itself.
const WATCHER_DIRECTIVE: &str = "kube_runtime::watcher=error";

/// The filter for `RUST_LOG` = `env`: its directives added to the defaults, not replacing them. A
/// global level (`debug`) replaces `info`; a directive for `kube_runtime` or its watcher replaces the
/// watcher's; anything else (`projection_controller=debug`) is added to both.
pub fn filter_directives(env: Option<&str>) -> String {
    let given: Vec<&str> = env
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let global = given
        .iter()
        .any(|d| !d.contains('=') && !d.contains("::") && !d.contains('['));
    let about_watcher = given
        .iter()
        .any(|d| d.starts_with("kube_runtime=") || d.starts_with("kube_runtime::watcher"));
    let mut directives = Vec::new();
    if !global {
        directives.push(DEFAULT_LEVEL);
    }
    directives.extend(&given);
    if !about_watcher {
        directives.push(WATCHER_DIRECTIVE);
    }
    directives.join(",")
}

/// How records are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// kubectl-friendly text.
    Text,
}

/// The format `LOG_FORMAT` (`json` or `text`) asks for; unset: text at a terminal, JSON otherwise.
/// Any other value is an error naming the variable.
pub fn log_format(env: Option<&str>, terminal: bool) -> Result<LogFormat, String> {
    match env.map(str::trim) {
        None | Some("") => Ok(if terminal {
            LogFormat::Text
        } else {
            LogFormat::Json
        }),
        Some("json") => Ok(LogFormat::Json),
        Some("text") => Ok(LogFormat::Text),
        Some(other) => Err(format!("LOG_FORMAT must be json or text, not {other:?}")),
    }
}

/// Installs the logs on stderr: `LOG_FORMAT`, `RUST_LOG` added to [`DEFAULT_FILTER`]. A bad
/// `LOG_FORMAT` or `RUST_LOG` is an error, before anything runs.
pub fn init_logs() -> Result<(), String> {
    let format = log_format(
        std::env::var("LOG_FORMAT").ok().as_deref(),
        std::io::stderr().is_terminal(),
    )?;
    let directives = filter_directives(std::env::var("RUST_LOG").ok().as_deref());
    let filter = EnvFilter::try_new(&directives).map_err(|e| format!("RUST_LOG {directives:?}: {e}"))?;
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_adds_to_the_defaults() {
        assert_eq!(filter_directives(None), DEFAULT_FILTER);
        assert_eq!(filter_directives(Some("info")), DEFAULT_FILTER);
        assert_eq!(
            filter_directives(Some("debug")),
            "debug,kube_runtime::watcher=error"
        );
        assert_eq!(
            filter_directives(Some("projection_controller=debug")),
            "info,projection_controller=debug,kube_runtime::watcher=error"
        );
        assert_eq!(
            filter_directives(Some("warn,kube_runtime::watcher=debug")),
            "warn,kube_runtime::watcher=debug"
        );
        for directives in [None, Some("debug"), Some("webhook=trace, kube=warn")] {
            let all = filter_directives(directives);
            assert!(EnvFilter::try_new(&all).is_ok(), "{all}");
        }
    }

    #[test]
    fn the_format_is_json_for_pipelines_and_text_at_a_terminal_unless_asked() {
        assert_eq!(log_format(None, false), Ok(LogFormat::Json));
        assert_eq!(log_format(None, true), Ok(LogFormat::Text));
        assert_eq!(log_format(Some("json"), true), Ok(LogFormat::Json));
        assert_eq!(log_format(Some("text"), false), Ok(LogFormat::Text));
        let refused = log_format(Some("yaml"), false).unwrap_err();
        assert!(refused.contains("LOG_FORMAT"), "{refused}");
    }
}
