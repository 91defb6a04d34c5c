//! kubectl-projection: the `kubectl projection` plugin. Every decision it shows is `shared`'s (the
//! controller's and the webhook's own); this binary only reads the cluster around them, and writes
//! only what `suspend`, `resume` and `sync` set on the CRs.

mod access;
mod check;
mod check_api;
mod cli;
mod cluster;
mod complete;
mod copies;
mod crs;
mod exit;
mod lifecycle;
mod other_cluster;
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
        let (candidates, directive) = match complete::lookup(&words) {
            // Completion never fails aloud: what cannot be read offers nothing.
            Some(lookup) => (looked_up(&words, &lookup), complete::NO_FILES),
            None => complete::candidates(&Cli::command(), &words),
        };
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

/// The namespaces, contexts or CR names a completion asks for, read with the kubeconfig, context
/// and namespace typed so far; those starting with what is being typed.
fn looked_up(words: &[String], lookup: &complete::Lookup) -> Vec<String> {
    let partial = words.last().map(String::as_str).unwrap_or_default();
    let global = cli::Global {
        kubeconfig: complete::flag_value(words, "--kubeconfig", None).map(Into::into),
        context: complete::flag_value(words, "--context", None).map(str::to_owned),
        namespace: complete::flag_value(words, "--namespace", Some("-n")).map(str::to_owned),
        all_namespaces: false,
        output: cli::Output::Table,
        as_user: complete::flag_value(words, "--as", None).map(str::to_owned),
        as_groups: Vec::new(),
        request_timeout: Some(std::time::Duration::from_secs(5)),
    };
    let names = match lookup {
        complete::Lookup::Contexts => {
            let config = match &global.kubeconfig {
                Some(path) => kube::config::Kubeconfig::read_from(path),
                None => kube::config::Kubeconfig::read(),
            };
            config
                .map(|c| c.contexts.into_iter().map(|c| c.name).collect())
                .unwrap_or_default()
        }
        other => {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return Vec::new();
            };
            runtime
                .block_on(cluster_names(&global, other))
                .unwrap_or_default()
        }
    };
    let mut names: Vec<String> = names.into_iter().filter(|n| n.starts_with(partial)).collect();
    names.sort();
    names
}

async fn cluster_names(global: &cli::Global, lookup: &complete::Lookup) -> Option<Vec<String>> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::Api;
    use shared::api::crd::{ClusterProjection, Projection};
    let cluster = cluster::Cluster::connect(global).await.ok()?;
    let client = cluster.client.clone();
    let (names, prefix) = match lookup {
        complete::Lookup::Namespaces => (names_of(Api::<Namespace>::all(client)).await?, ""),
        complete::Lookup::Crs {
            prefix,
            cluster: true,
        } => (
            names_of(Api::<ClusterProjection>::all(client)).await?,
            prefix.as_str(),
        ),
        complete::Lookup::Crs {
            prefix,
            cluster: false,
        } => (
            names_of(Api::<Projection>::namespaced(client, &cluster.namespace)).await?,
            prefix.as_str(),
        ),
        complete::Lookup::Contexts => return None,
    };
    Some(names.into_iter().map(|n| format!("{prefix}{n}")).collect())
}

/// The names of the objects `api` lists (their metadata only).
async fn names_of<K>(api: kube::Api<K>) -> Option<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list_metadata(&kube::api::ListParams::default()).await.ok()?;
    Some(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
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
            controller_namespace,
        } => {
            let settings = preview::Settings {
                source_mode,
                allow_power_kinds,
                author_checked: author_access == cli::AuthorAccess::Enforce,
                as_author,
                controller_namespace,
            };
            preview::run(global, &files, &settings).await
        }
        Command::Status {
            selector,
            controller_namespace,
        } => status::run(global, selector.as_deref(), &controller_namespace).await,
        Command::Check { what: None } => check::run(global).await,
        Command::Check {
            what:
                Some(cli::CheckWhat::Api {
                    wait,
                    controller_namespace,
                }),
        } => check_api::run(global, wait, &controller_namespace).await,
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
