//! kubectl-projection: the `kubectl projection` plugin. Every decision it shows is `shared`'s (the
//! controller's and the webhook's own); this binary only reads the cluster around them, and writes
//! only what `suspend`, `resume` and `sync` set on the CRs.

mod access;
mod check;
mod cli;
mod cluster;
mod complete;
mod copies;
mod crs;
mod exit;
mod lifecycle;
mod output;
mod preview;
mod sources;
mod status;
mod why;

use clap::{CommandFactory, Parser};
use cli::{Cli, Command, Shell};
use exit::{Code, Failure};
use std::process::ExitCode;

fn main() -> ExitCode {
    runtime::crypto::install_crypto_provider();
    // Run as `kubectl_complete-projection` (a link to this binary): kubectl asks for completions.
    let mut args = std::env::args();
    let invoked = args.next().unwrap_or_default();
    if invoked.rsplit('/').next() == Some("kubectl_complete-projection") {
        let words: Vec<String> = args.collect();
        let (candidates, directive) = complete::candidates(&Cli::command(), &words);
        for candidate in candidates {
            println!("{candidate}");
        }
        println!(":{directive}");
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::from(Code::Error as u8);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => {
            let (code, line) = failure.report();
            eprintln!("{line}");
            code
        }
    };
    ExitCode::from(code as u8)
}

async fn run(cli: Cli) -> Result<Code, Failure> {
    let global = &cli.global;
    match cli.command {
        Command::Why {
            reference,
            events,
            source_context,
        } => why::run(global, &reference, events, source_context.as_deref()).await,
        Command::Sources { reference } => sources::run(global, &reference).await,
        Command::Preview {
            files,
            source_mode,
            allow_power_kinds,
            author_access,
            as_author,
        } => {
            let settings = preview::Settings {
                source_mode,
                allow_power_kinds,
                author_checked: author_access == cli::AuthorAccess::Enforce,
                as_author,
            };
            preview::run(global, &files, &settings).await
        }
        Command::Status { selector } => status::run(global, selector.as_deref()).await,
        Command::Check => check::run(global).await,
        Command::Suspend(select) => lifecycle::set_suspend(global, &select, true).await,
        Command::Resume(select) => lifecycle::set_suspend(global, &select, false).await,
        Command::Sync {
            select,
            wait,
            timeout,
        } => lifecycle::sync(global, &select, wait, timeout).await,
        Command::Completion { shell } => {
            let mut command = Cli::command();
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            // Completes `kubectl-projection`; kubectl completes plugins through
            // `kubectl_complete-projection` (docs/kubectl-plugin.md).
            clap_complete::generate(shell, &mut command, "kubectl-projection", &mut std::io::stdout());
            Ok(Code::Ok)
        }
    }
}
