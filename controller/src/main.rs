//! projection-controller: reconciles `Projection`s (and serves metrics and probes), optionally as
//! one of several replicas behind a leader Lease.

mod author_access;
mod author_recheck;
mod cache;
mod cli;
mod context;
mod discovery;
mod error;
mod events;
mod impersonation;
mod index;
mod initial_list;
mod leader;
mod metrics;
mod namespace_watch;
mod pass;
mod queue_metrics;
mod relevance;
mod remote;
mod replica;
mod shard;
mod shard_watch;
mod wake;
mod warm;
mod watch_errors;
mod watches;
mod write_journal;

use clap::Parser;
use prometheus_client::registry::Registry;
use replica::Replica;
use runtime::http;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runtime::crypto::install_crypto_provider();
    let args = cli::Args::parse();
    runtime::logs::init_logs().map_err(anyhow::Error::msg)?;
    let metrics_addr = http::bind_address(&args.metrics_bind_address)?;
    let probe_addr = http::bind_address(&args.health_probe_bind_address)?;
    tracing::info!(
        source_mode = %args.source_mode,
        requeue_interval = ?args.requeue_interval,
        selector_write_concurrency = args.selector_write_concurrency,
        max_concurrent_reconciles = args.max_concurrent_reconciles,
        metrics = metrics_addr.map(|a| a.to_string()).unwrap_or_default(),
        health = probe_addr.map(|a| a.to_string()).unwrap_or_default(),
        leader_elect = args.leader_elect,
        initial_list = %args.initial_list,
        "projection-controller starting"
    );

    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let signal = runtime::signals::shutdown_signal().await;
        tracing::info!(signal, "projection-controller shutting down");
        on_signal.cancel();
    });
    let stopped = {
        let stop = stop.clone();
        move || stop.clone().cancelled_owned()
    };

    let mut registry = Registry::default();
    let metrics = Arc::new(metrics::Metrics::register(&mut registry));
    let metrics_tls = args.metrics_tls.server_config(
        (metrics_addr, probe_addr),
        (&mut registry, metrics::SERVICE),
        stopped(),
    )?;
    let readiness = http::Readiness::default();
    let server = tokio::spawn(
        http::serve(
            (metrics_addr, metrics_tls),
            probe_addr,
            Arc::new(registry),
            readiness.clone(),
            stopped(),
        )
        .await?,
    );

    let client = runtime::kube_client::infer_with(
        |timeouts| {
            timeouts.response = args.api_response_timeout.unwrap_or(timeouts.response);
            timeouts.read = args.api_read_timeout.unwrap_or(timeouts.read);
        },
        Some(&metrics.rest_client),
    )
    .await?;
    let copy_writer = choose_copy_writer(&client, &args).await?;
    metrics
        .copy_writer
        .get_or_create(&metrics::WriterLabels {
            writer: copy_writer.as_str(),
        })
        .set(1);
    let settings = context::Settings {
        source_mode: args.source_mode,
        requeue_cap: args.requeue_interval,
        write_concurrency: usize::from(args.selector_write_concurrency),
        reconcile_concurrency: args.max_concurrent_reconciles,
        initial_list: args.initial_list,
        author_access: args.author_access,
        author_recheck_interval: args.author_recheck_interval,
        author_grant_ttl: args.author_grant_ttl,
        allowed_power_kinds: args.allow_power_kinds.clone(),
        recreate_on_immutable: args.recreate_on_immutable.clone(),
        copy_writer,
        controller_namespace: args.controller_namespace.clone(),
        lease_duration: args.leader_election_lease_duration,
    };
    // With --shard-by-lease every replica reconciles its part of the CRs; its identity is its pod's
    // name, so a restarted container keeps its place in the ring.
    let shard = args.shard_by_lease.then(|| {
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("projection-controller-{}", std::process::id()));
        shard::Shard::new(
            &identity,
            &args.leader_election_namespace,
            args.leader_election_lease_duration,
            &metrics,
        )
    });
    let membership = shard.clone().map(|shard| {
        let (response, read, requests) = (
            args.api_response_timeout,
            args.api_read_timeout,
            metrics.rest_client.clone(),
        );
        let connect = move || async move {
            runtime::kube_client::infer_with(
                |timeouts| {
                    timeouts.response = response.unwrap_or(timeouts.response);
                    timeouts.read = read.unwrap_or(timeouts.read);
                },
                Some(&requests),
            )
            .await
        };
        shard.start(connect, stop.clone())
    });
    // Every replica watches and indexes from the start; only the reconcilers wait for the lease.
    let replica = Replica::start(client.clone(), metrics, settings, readiness.clone(), shard);
    let mut leadership = None;
    if args.leader_elect {
        let namespace = args.leader_election_namespace.clone();
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .map(|h| format!("{h}-{}", std::process::id()))
            .unwrap_or_else(|_| format!("projection-controller-{}", std::process::id()));
        tokio::select! {
            acquired = leader::Leadership::acquire(client.clone(), &namespace, &identity, args.leader_election_lease_duration) => {
                leadership = Some(acquired?);
            }
            () = stopped() => {
                replica.stop();
                server.await??;
                return Ok(());
            }
        }
    }

    let run = replica.lead(stop);
    let lost = async {
        match leadership.as_mut() {
            Some(l) => l.lost().await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        () = run => Ok(()),
        () = lost => Err(anyhow::anyhow!("lost the leader lease; exiting so a standby takes over")),
    };
    readiness.set(false);
    // Each step of a stop says when it is done, so a stop that hangs says where.
    tracing::info!("reconcilers stopped");
    if let Some(l) = leadership {
        l.release().await;
    }
    if let Some(membership) = membership {
        // Its Lease deleted, so the others take its CRs at once.
        let _ = membership.await;
    }
    if result.is_ok() {
        server.await??;
    }
    result
}

/// Who writes the copies (`--write-copies-as`), probing the apiserver when that decides it; logged
/// once. An error stops the start: copies asked to be written as their author cannot be.
async fn choose_copy_writer(
    client: &kube::Client,
    args: &cli::Args,
) -> anyhow::Result<shared::policy::write_as::CopyWriter> {
    use shared::policy::write_as::{Probe, choose, needs_probe};
    let enforced = args.author_access == author_access::AuthorAccessMode::Enforce;
    let probe = if needs_probe(args.write_copies_as, enforced) {
        Some(impersonation::probe(client).await)
    } else {
        None
    };
    let writer = choose(args.write_copies_as, enforced, probe.as_ref()).map_err(anyhow::Error::msg)?;
    let refused = match &probe {
        Some(Probe::Refused(why)) => Some(why.as_str()),
        _ => None,
    };
    tracing::info!(
        writer = %writer,
        requested = args.write_copies_as.as_str(),
        impersonation_refused = refused,
        "copies are written by {}",
        writer.describe()
    );
    Ok(writer)
}
