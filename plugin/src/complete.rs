//! kubectl's completion of plugins: `kubectl projection <TAB>` runs `kubectl_complete-projection`
//! with the words typed so far (the last one being completed) and reads one candidate per line, then
//! `:<directive>` (cobra's protocol). Linked or copied under that name, this binary answers from its
//! own command line definition.

use clap::Command;

/// cobra's directive: no file names.
pub const NO_FILES: u8 = 4;
/// cobra's directive: the shell's default (file names).
const DEFAULT: u8 = 0;

/// Candidates only the cluster or the kubeconfig can give.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The value of `-n`/`--namespace`: the cluster's namespaces.
    Namespaces,
    /// The value of `--context`: the kubeconfig's contexts.
    Contexts,
    /// A CR named `<prefix>NAME` (`projection/`, `proj/`, `clusterprojection/`, `cproj/`, as typed)
    /// for `suspend`, `resume` and `sync`: the names of that kind.
    Crs {
        /// What was typed before the name, kept in every candidate.
        prefix: String,
        /// ClusterProjections rather than Projections.
        cluster: bool,
    },
}

/// What the word being completed needs from the cluster or the kubeconfig, if anything.
pub fn lookup(words: &[String]) -> Option<Lookup> {
    let (partial, typed) = words.split_last()?;
    match typed.last().map(String::as_str) {
        Some("-n" | "--namespace") => return Some(Lookup::Namespaces),
        Some("--context") => return Some(Lookup::Contexts),
        _ => {}
    }
    let lifecycle = typed
        .iter()
        .any(|w| matches!(w.as_str(), "suspend" | "resume" | "sync"));
    let (kind, _) = partial.split_once('/')?;
    let cluster = match kind {
        "projection" | "projections" | "proj" => false,
        "clusterprojection" | "clusterprojections" | "cproj" => true,
        _ => return None,
    };
    lifecycle.then(|| Lookup::Crs {
        prefix: format!("{kind}/"),
        cluster,
    })
}

/// The value of the global flag `long` (or `short`) among the words typed, for the lookups to use
/// the same kubeconfig, context and namespace as the command would.
pub fn flag_value<'a>(words: &'a [String], long: &str, short: Option<&str>) -> Option<&'a str> {
    words.windows(2).find_map(|pair| {
        let name = pair[0].as_str();
        (name == long || Some(name) == short).then_some(pair[1].as_str())
    })
}

/// The candidates for the last of `words` (the words after `kubectl projection`), and the directive.
pub fn candidates(command: &Command, words: &[String]) -> (Vec<String>, u8) {
    let (partial, typed) = match words.split_last() {
        Some((partial, typed)) => (partial.as_str(), typed),
        None => ("", &[][..]),
    };
    // The deepest subcommand named so far.
    let mut current = command;
    for word in typed {
        if let Some(sub) = current.find_subcommand(word) {
            current = sub;
        }
    }
    // A flag that takes a file: the shell completes file names.
    if typed
        .last()
        .is_some_and(|w| matches!(w.as_str(), "-f" | "--filename" | "--kubeconfig"))
    {
        return (Vec::new(), DEFAULT);
    }
    let mut out = Vec::new();
    if partial.starts_with('-') {
        for arg in current
            .get_arguments()
            .chain(command.get_arguments().filter(|a| a.is_global_set()))
        {
            if let Some(long) = arg.get_long() {
                out.push(format!("--{long}"));
            }
            if let Some(short) = arg.get_short() {
                out.push(format!("-{short}"));
            }
        }
    } else {
        out.extend(
            current
                .get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .map(|s| s.get_name().to_owned()),
        );
    }
    out.retain(|c| c.starts_with(partial));
    out.sort();
    out.dedup();
    (out, NO_FILES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn complete(words: &[&str]) -> (Vec<String>, u8) {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        candidates(&Cli::command(), &words)
    }

    #[test]
    fn kubectl_completes_subcommands_flags_and_files() {
        let (all, directive) = complete(&[""]);
        assert_eq!(
            all,
            [
                "check",
                "completion",
                "preview",
                "resume",
                "sources",
                "status",
                "suspend",
                "sync",
                "why"
            ]
        );
        assert_eq!(directive, NO_FILES);
        assert_eq!(complete(&["s"]).0, ["sources", "status", "suspend", "sync"]);
        let (flags, _) = complete(&["sync", "--w"]);
        assert_eq!(flags, ["--wait"]);
        let (flags, _) = complete(&["why", "--c"]);
        assert_eq!(flags, ["--context"], "global flags too");
        assert_eq!(complete(&["preview", "-f", ""]), (Vec::new(), DEFAULT));
    }

    #[test]
    fn namespaces_contexts_and_cr_names_are_looked_up() {
        let words = |w: &[&str]| w.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        assert_eq!(lookup(&words(&["status", "-n", "te"])), Some(Lookup::Namespaces));
        assert_eq!(lookup(&words(&["--namespace", ""])), Some(Lookup::Namespaces));
        assert_eq!(lookup(&words(&["why", "--context", ""])), Some(Lookup::Contexts));
        assert_eq!(
            lookup(&words(&["suspend", "proj/se"])),
            Some(Lookup::Crs {
                prefix: "proj/".into(),
                cluster: false
            })
        );
        assert_eq!(
            lookup(&words(&["-n", "a", "sync", "clusterprojection/"])),
            Some(Lookup::Crs {
                prefix: "clusterprojection/".into(),
                cluster: true
            })
        );
        assert_eq!(lookup(&words(&["why", "proj/x"])), None, "why takes any kind");
        assert_eq!(lookup(&words(&["suspend", "deployment/x"])), None);
        assert_eq!(lookup(&words(&["st"])), None);
        let typed = words(&["--context", "eu", "-n", "team-a", "status", ""]);
        assert_eq!(flag_value(&typed, "--namespace", Some("-n")), Some("team-a"));
        assert_eq!(flag_value(&typed, "--context", None), Some("eu"));
        assert_eq!(flag_value(&typed, "--kubeconfig", None), None);
    }
}
