//! kubectl's completion of plugins: `kubectl projection <TAB>` runs `kubectl_complete-projection`
//! with the words typed so far (the last one being completed) and reads one candidate per line, then
//! `:<directive>` (cobra's protocol). Linked or copied under that name, this binary answers from its
//! own command line definition.

use clap::Command;

/// cobra's directive: no file names.
const NO_FILES: u8 = 4;
/// cobra's directive: the shell's default (file names).
const DEFAULT: u8 = 0;

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
}
