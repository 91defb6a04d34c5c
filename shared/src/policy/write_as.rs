//! Whose identity creates and updates the copies: the CR's recorded author, by the apiserver's
//! constrained impersonation (KEP-5284, beta and on by default from Kubernetes v1.36), or the
//! controller itself after the SubjectAccessReviews of `author` allowed it.
//!
//! Written as the author, every create and update of a copy is decided by the apiserver at the moment
//! it is made: the author's own RBAC, and every admission policy (a ValidatingAdmissionPolicy,
//! Kyverno, Gatekeeper, Capsule) sees the author as the requesting user; audit logs show both the
//! author and the controller that impersonated it. The controller's own RBAC then needs no `create`
//! on the projected kinds, only the impersonation verbs for them (`impersonate-on:user-info:create`
//! and `:patch`, `impersonate-on:serviceaccount:create` and `:patch`), which the apiserver grants for
//! nothing else. Deleting and releasing our own copies stays the controller's own act (an author who
//! lost access must not keep copies because it may not delete them).
//!
//! Which writer runs is decided once at start-up (`--write-copies-as`): `auto` probes the
//! apiserver (a SelfSubjectReview made as a probe user: answered with that user only when the cluster
//! serves constrained impersonation and the controller is granted it) and falls back to the
//! controller's own writes; `author` refuses to start without it; `controller` never impersonates.

use std::{fmt, str::FromStr};

/// The user the start-up probe impersonates: no such account exists, and it is never granted
/// anything, so the probe proves that impersonation works and nothing else.
pub const PROBE_USER: &str = "projection.sh:impersonation-probe";
/// The group the probe impersonates with it (group impersonation is granted separately).
pub const PROBE_GROUP: &str = "projection.sh:impersonation-probe";

/// `--write-copies-as`: what the platform asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WriteCopiesAs {
    /// The author where the cluster lets the controller impersonate it, else the controller.
    #[default]
    Auto,
    /// The author; the controller does not start when the cluster refuses.
    Author,
    /// The controller, after its SubjectAccessReviews of the author.
    Controller,
}

impl WriteCopiesAs {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Author => "author",
            Self::Controller => "controller",
        }
    }
}

impl FromStr for WriteCopiesAs {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "auto" => Ok(Self::Auto),
            "author" => Ok(Self::Author),
            "controller" => Ok(Self::Controller),
            other => Err(format!(
                "--write-copies-as must be auto, author or controller, not {other:?}"
            )),
        }
    }
}

/// Who writes the copies, as decided at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyWriter {
    /// The recorded author, impersonated.
    Author,
    /// The controller's own account.
    Controller,
}

impl CopyWriter {
    /// The label value of `projection_copy_writer_info` and the word in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Author => "author",
            Self::Controller => "controller",
        }
    }
}

impl CopyWriter {
    /// Who writes, for the start-up log line.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Author => "their author, impersonated",
            Self::Controller => "the controller's own account",
        }
    }
}

impl fmt::Display for CopyWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the start-up probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The apiserver answered as the probe user: impersonation works.
    Impersonated,
    /// It did not, for the reason given (the apiserver's refusal, or who it answered as).
    Refused(String),
}

impl Probe {
    /// The probe's outcome from the user the SelfSubjectReview answered with.
    pub fn answered_as(username: &str) -> Self {
        if username == PROBE_USER {
            Self::Impersonated
        } else {
            Self::Refused(format!(
                "the apiserver answered as {username:?}, not as the impersonated {PROBE_USER:?}"
            ))
        }
    }
}

/// Whether the probe must run: only when authors are checked (with `--author-access=trusted` the
/// copies are the controller's own, as in the Go operator) and the choice is not forced.
pub fn needs_probe(requested: WriteCopiesAs, authors_checked: bool) -> bool {
    authors_checked && requested != WriteCopiesAs::Controller
}

/// Who writes the copies, from what was asked and what the probe found (`None`: not probed, see
/// [`needs_probe`]). An error is a reason not to start.
pub fn choose(
    requested: WriteCopiesAs,
    authors_checked: bool,
    probe: Option<&Probe>,
) -> Result<CopyWriter, String> {
    if !needs_probe(requested, authors_checked) {
        return Ok(CopyWriter::Controller);
    }
    match (requested, probe) {
        (_, Some(Probe::Impersonated)) => Ok(CopyWriter::Author),
        (WriteCopiesAs::Author, Some(Probe::Refused(why))) => Err(format!(
            "--write-copies-as=author, but the apiserver does not let this controller impersonate \
             authors ({why}); it needs Kubernetes v1.36 or later with ConstrainedImpersonation on, and \
             the chart's impersonation rules; or set --write-copies-as=controller (chart value \
             controller.writeCopiesAs: controller), which also grants the controller create"
        )),
        (WriteCopiesAs::Author, None) => Err("--write-copies-as=author needs the probe".to_owned()),
        _ => Ok(CopyWriter::Controller),
    }
}

/// What `kubectl projection check` can tell of a controller from outside: who will write its copies,
/// from its flags, the cluster's version and whether RBAC grants it impersonation (`None`: the
/// person asking may not ask that), and what to say about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Who writes the copies, when that can be told.
    pub writer: Option<CopyWriter>,
    /// Why, for a person.
    pub note: String,
    /// Whether the controller cannot run as asked (it refuses to start).
    pub broken: bool,
}

/// Who a controller started with `requested` (`authors_checked`: `--author-access=enforce`) writes
/// copies as, on a cluster that serves constrained impersonation or not (`served`: v1.36 or later,
/// where it is on by default), with RBAC granting it the impersonation verbs or not (`granted`).
/// The controller's own probe decides for sure; this is what its inputs predict.
pub fn expected(
    requested: WriteCopiesAs,
    authors_checked: bool,
    served: bool,
    granted: Option<bool>,
) -> Expected {
    let of = |writer, note: &str, broken| Expected {
        writer,
        note: note.to_owned(),
        broken,
    };
    if !authors_checked {
        return of(
            Some(CopyWriter::Controller),
            "authors are not checked (--author-access=trusted): the controller writes with its own account",
            false,
        );
    }
    if requested == WriteCopiesAs::Controller {
        return of(
            Some(CopyWriter::Controller),
            "asked to: the controller writes after SubjectAccessReviews of each author",
            false,
        );
    }
    match (served, granted) {
        (true, Some(true)) => of(
            Some(CopyWriter::Author),
            "constrained impersonation is served and granted: each copy is written as its author",
            false,
        ),
        (true, None) => of(
            None,
            "constrained impersonation is served; whether the controller is granted it could not be asked (create subjectaccessreviews)",
            false,
        ),
        (served, _) => {
            let why = if served {
                "its RBAC does not grant the impersonation verbs"
            } else {
                "the cluster is older than v1.36 (no constrained impersonation by default)"
            };
            if requested == WriteCopiesAs::Author {
                of(
                    None,
                    &format!("--write-copies-as=author, but {why}: the controller does not start"),
                    true,
                )
            } else {
                of(
                    Some(CopyWriter::Controller),
                    &format!("{why}: the controller writes with its own account"),
                    false,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_its_three_values_and_names_itself_otherwise() {
        assert_eq!("auto".parse(), Ok(WriteCopiesAs::Auto));
        assert_eq!("author".parse(), Ok(WriteCopiesAs::Author));
        assert_eq!("controller".parse(), Ok(WriteCopiesAs::Controller));
        for value in [
            WriteCopiesAs::Auto,
            WriteCopiesAs::Author,
            WriteCopiesAs::Controller,
        ] {
            assert_eq!(value.as_str().parse(), Ok(value));
        }
        let refused = "Author".parse::<WriteCopiesAs>().unwrap_err();
        assert!(refused.contains("--write-copies-as"), "{refused}");
    }

    #[test]
    fn the_author_writes_only_where_the_probe_impersonated() {
        let refused = Probe::Refused("forbidden".to_owned());
        assert_eq!(
            choose(WriteCopiesAs::Auto, true, Some(&Probe::Impersonated)),
            Ok(CopyWriter::Author)
        );
        assert_eq!(
            choose(WriteCopiesAs::Auto, true, Some(&refused)),
            Ok(CopyWriter::Controller)
        );
        assert_eq!(
            choose(WriteCopiesAs::Author, true, Some(&Probe::Impersonated)),
            Ok(CopyWriter::Author)
        );
        let error = choose(WriteCopiesAs::Author, true, Some(&refused)).unwrap_err();
        assert!(
            error.contains("forbidden") && error.contains("controller.writeCopiesAs"),
            "{error}"
        );
        assert_eq!(
            choose(WriteCopiesAs::Controller, true, None),
            Ok(CopyWriter::Controller)
        );
    }

    #[test]
    fn trusted_authors_are_never_impersonated() {
        assert!(!needs_probe(WriteCopiesAs::Author, false));
        assert!(!needs_probe(WriteCopiesAs::Controller, true));
        assert!(needs_probe(WriteCopiesAs::Auto, true));
        assert_eq!(
            choose(WriteCopiesAs::Author, false, None),
            Ok(CopyWriter::Controller)
        );
    }

    #[test]
    fn check_predicts_the_probe_from_flags_version_and_rbac() {
        let author = expected(WriteCopiesAs::Auto, true, true, Some(true));
        assert_eq!((author.writer, author.broken), (Some(CopyWriter::Author), false));
        let old = expected(WriteCopiesAs::Auto, true, false, Some(true));
        assert_eq!(old.writer, Some(CopyWriter::Controller));
        assert!(old.note.contains("older than v1.36"), "{}", old.note);
        let ungranted = expected(WriteCopiesAs::Author, true, true, Some(false));
        assert_eq!((ungranted.writer, ungranted.broken), (None, true));
        assert!(ungranted.note.contains("does not start"), "{}", ungranted.note);
        assert_eq!(expected(WriteCopiesAs::Auto, true, true, None).writer, None);
        let trusted = expected(WriteCopiesAs::Author, false, true, Some(true));
        assert_eq!(trusted.writer, Some(CopyWriter::Controller));
        assert_eq!(
            expected(WriteCopiesAs::Controller, true, true, Some(true)).writer,
            Some(CopyWriter::Controller)
        );
    }

    #[test]
    fn only_the_probe_user_proves_impersonation() {
        assert_eq!(Probe::answered_as(PROBE_USER), Probe::Impersonated);
        assert!(matches!(
            Probe::answered_as("system:serviceaccount:projection:projection-controller"),
            Probe::Refused(_)
        ));
    }
}
