//! How a watch receives the objects that exist when it starts.
//!
//! Streamed (`sendInitialEvents=true`, the apiserver's `WatchList` feature: on by default in
//! Kubernetes 1.32 and from 1.34, off in 1.33 and before 1.32), they arrive as watch events and are
//! decoded one at a time. Listed, they arrive in one response that is held and decoded whole: with
//! 20,000 Secrets and ConfigMaps the controller does not keep, that response's decoding left
//! 3.3 MiB of freed memory the allocator did not return (docs/scale.md).
//!
//! `Auto` streams and falls back to a list, for that watch only, when the apiserver refuses the
//! streamed form: a cluster with the feature gate off, or an aggregated API that does not serve it.

use std::fmt;
use std::str::FromStr;

/// The `--initial-list` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialList {
    /// Stream, and list where the apiserver refuses to stream.
    #[default]
    Auto,
    /// Always stream: a watch the apiserver refuses keeps retrying (and reports it).
    Stream,
    /// Always list, in one response.
    List,
}

impl InitialList {
    /// Whether a watch that asked for a stream and got this answer (HTTP code and message) should
    /// list instead.
    pub fn falls_back(self, code: u16, message: &str) -> bool {
        self == Self::Auto && refuses_streaming(code, message)
    }
}

/// Whether the apiserver's answer to a watch with `sendInitialEvents=true` says it does not serve
/// that parameter. With the `WatchList` gate off, validation answers 422 Invalid, naming the
/// parameter (`sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the
/// WatchList feature gate is enabled`); some aggregated APIs answer 400. Any other answer (403,
/// 404, 5xx) is about the kind or the server, and the same for a list.
pub fn refuses_streaming(code: u16, message: &str) -> bool {
    matches!(code, 400 | 422) && message.contains("sendInitialEvents")
}

impl FromStr for InitialList {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "auto" => Ok(Self::Auto),
            "stream" => Ok(Self::Stream),
            "list" => Ok(Self::List),
            other => Err(format!(
                "invalid value {other:?} for --initial-list (use auto, stream or list)"
            )),
        }
    }
}

impl fmt::Display for InitialList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Stream => "stream",
            Self::List => "list",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATE_OFF: &str = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: \
                            sendInitialEvents is forbidden for watch unless the WatchList feature \
                            gate is enabled";

    #[test]
    fn only_auto_falls_back_and_only_when_the_parameter_is_refused() {
        assert!(InitialList::Auto.falls_back(422, GATE_OFF));
        assert!(InitialList::Auto.falls_back(400, "unknown parameter sendInitialEvents"));
        assert!(!InitialList::Stream.falls_back(422, GATE_OFF));
        assert!(!InitialList::List.falls_back(422, GATE_OFF));
        // Refusals that a list would get as well are not a reason to list.
        assert!(!InitialList::Auto.falls_back(403, "secrets is forbidden"));
        assert!(!InitialList::Auto.falls_back(404, "the server could not find the requested resource"));
        assert!(!InitialList::Auto.falls_back(500, "sendInitialEvents: internal error"));
        assert!(!InitialList::Auto.falls_back(422, "labelSelector: Invalid value"));
    }

    #[test]
    fn the_flag_parses_its_three_values_and_names_itself_otherwise() {
        for value in [InitialList::Auto, InitialList::Stream, InitialList::List] {
            assert_eq!(value.to_string().parse::<InitialList>(), Ok(value));
        }
        assert_eq!(InitialList::default(), InitialList::Auto);
        let error = "Stream".parse::<InitialList>().unwrap_err();
        assert!(
            error.contains("--initial-list") && error.contains("\"Stream\""),
            "{error}"
        );
    }
}
