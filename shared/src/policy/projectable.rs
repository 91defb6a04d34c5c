//! Projectability: whether a source's owner lets it be mirrored. The controller and the webhook apply
//! the same rule, with the Go operator's reasons and messages.

use crate::{api::keys::PROJECTABLE, api::reason::Reason};
use std::{collections::BTreeMap, fmt, str::FromStr};

/// Which sources may be projected (`--source-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourceMode {
    /// Only sources annotated `projection.sh/projectable: "true"` (the default).
    #[default]
    Allowlist,
    /// Every source except those annotated `projection.sh/projectable: "false"`.
    Permissive,
}

impl FromStr for SourceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allowlist" => Ok(Self::Allowlist),
            "permissive" => Ok(Self::Permissive),
            other => Err(format!(
                "unknown source mode {other:?}: expected allowlist or permissive"
            )),
        }
    }
}

impl fmt::Display for SourceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allowlist => "allowlist",
            Self::Permissive => "permissive",
        })
    }
}

/// Why a source may not be projected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// `SourceOptedOut` or `SourceNotProjectable`.
    pub reason: Reason,
    /// What the source's owner (or the mode) says, and how to opt in.
    pub message: String,
}

/// Checks the source's `projection.sh/projectable` annotation against the mode. `"false"` vetoes in
/// every mode; in allowlist mode anything but `"true"` blocks.
pub fn check_projectable(
    mode: SourceMode,
    annotations: Option<&BTreeMap<String, String>>,
    namespace: &str,
    name: &str,
) -> Result<(), Blocked> {
    let value = annotations.and_then(|a| a.get(PROJECTABLE)).map(String::as_str);
    match (value, mode) {
        (Some("false"), _) => Err(Blocked {
            reason: Reason::SourceOptedOut,
            message: format!(
                "source {namespace}/{name} has {PROJECTABLE}=\"false\"; owner has opted out of projection"
            ),
        }),
        (Some("true"), _) | (_, SourceMode::Permissive) => Ok(()),
        (_, SourceMode::Allowlist) => Err(Blocked {
            reason: Reason::SourceNotProjectable,
            message: format!(
                "source-mode=allowlist requires annotation {PROJECTABLE}=\"true\" on source {namespace}/{name}"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(PROJECTABLE.to_owned(), value.to_owned())])
    }

    #[test]
    fn false_wins_in_every_mode() {
        for mode in [SourceMode::Allowlist, SourceMode::Permissive] {
            let blocked = check_projectable(mode, Some(&annotated("false")), "a", "b").unwrap_err();
            assert_eq!(blocked.reason, Reason::SourceOptedOut);
            assert_eq!(
                blocked.message,
                r#"source a/b has projection.sh/projectable="false"; owner has opted out of projection"#
            );
        }
    }

    #[test]
    fn allowlist_needs_true() {
        assert_eq!(
            check_projectable(SourceMode::Allowlist, Some(&annotated("true")), "a", "b"),
            Ok(())
        );
        for annotations in [None, Some(annotated("yes")), Some(annotated(""))] {
            let blocked =
                check_projectable(SourceMode::Allowlist, annotations.as_ref(), "a", "b").unwrap_err();
            assert_eq!(blocked.reason, Reason::SourceNotProjectable);
            assert_eq!(
                blocked.message,
                r#"source-mode=allowlist requires annotation projection.sh/projectable="true" on source a/b"#
            );
        }
    }

    #[test]
    fn permissive_allows_all_but_false() {
        assert_eq!(check_projectable(SourceMode::Permissive, None, "a", "b"), Ok(()));
        assert_eq!(
            check_projectable(SourceMode::Permissive, Some(&annotated("maybe")), "a", "b"),
            Ok(())
        );
    }

    #[test]
    fn modes_parse_and_print() {
        assert_eq!("allowlist".parse(), Ok(SourceMode::Allowlist));
        assert_eq!(
            "permissive".parse::<SourceMode>().unwrap().to_string(),
            "permissive"
        );
        assert!(
            "open"
                .parse::<SourceMode>()
                .unwrap_err()
                .contains("allowlist or permissive")
        );
    }
}
