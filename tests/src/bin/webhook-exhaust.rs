//! The exhaustion tests' attacks against any webhook address, e.g. a pod's on the local node:
//!
//! ```text
//! cargo run -p projection-tests --bin webhook-exhaust -- --address 198.18.0.7:9443 \
//!   --server-name projection-webhook.projection-system.svc --ca-file ca.crt --duration 30s
//! ```
//!
//! `--mode large` (the default) sends large reviews and stalled connections; `--mode slow-bodies`
//! opens `--connections` HTTP/2 connections of `--streams-per-connection` reviews whose small body
//! trickles a byte every `--byte-every`; `--mode idle` holds `--per-source` idle connections from
//! each of `--sources` (local addresses; none: the default one).
//!
//! Prints what happened, and as its last line the same as one JSON object (what
//! `tests/e2e/chart_node.rs` reads when it runs this from another pod's network namespace); watch
//! the pod's memory meanwhile (its container's `VmHWM` or memory cgroup from the node, or its
//! `process_resident_memory_bytes`). Bounded in count and time; it stops by itself. Only point it at
//! a webhook you run.

use clap::Parser;
use projection_tests::attack;
use serde_json::json;
use std::{sync::Arc, time::Duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Large reviews over many streams, silent and half-header connections.
    Large,
    /// Small reviews whose body trickles.
    SlowBodies,
    /// Connections that send one review, then nothing.
    Idle,
}

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    target: projection_tests::attack::WebhookTarget,
    #[arg(long, value_enum, default_value = "large")]
    mode: Mode,
    /// slow-bodies: one byte of a body per this.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    byte_every: Duration,
    /// idle: the local addresses the connections come from (comma-separated).
    #[arg(long, value_delimiter = ',')]
    sources: Vec<std::net::IpAddr>,
    /// idle: connections held from each source.
    #[arg(long, default_value_t = 64)]
    per_source: usize,
    #[arg(long, default_value_t = 16)]
    connections: usize,
    #[arg(long, default_value_t = 8)]
    streams_per_connection: usize,
    #[arg(long, default_value_t = 4 * 1024 * 1024 - 4096)]
    body_bytes: usize,
    /// Fill the bodies with an array of zeros (the parser's worst case) instead of one string.
    #[arg(long)]
    dense: bool,
    #[arg(long, default_value_t = 50)]
    silent: usize,
    #[arg(long, default_value_t = 50)]
    half_headers: usize,
    /// At most 10 minutes.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The pace of the legitimate reviews sent alongside.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    probe_every: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.duration <= Duration::from_secs(600),
        "--duration is at most 10m"
    );
    let client = attack::h2_client_config(&args.target.ca_file, None)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    match args.mode {
        Mode::Large => {}
        Mode::SlowBodies => {
            let attack = attack::SlowBodies {
                address: args.target.address,
                server_name: args.target.server_name,
                source: None,
                connections: args.connections,
                streams_per_connection: args.streams_per_connection,
                byte_every: args.byte_every,
                duration: args.duration,
                progress: Arc::default(),
            };
            let outcome = attack::slow_bodies(&attack, connector).await;
            println!("{outcome:#?}");
            let answered: serde_json::Map<String, serde_json::Value> = outcome
                .answered
                .iter()
                .map(|(status, n)| (status.to_string(), json!(n)))
                .collect();
            println!(
                "{}",
                json!({"started": outcome.started, "answered": answered, "failed": outcome.failed})
            );
            return Ok(());
        }
        Mode::Idle => {
            let sources = if args.sources.is_empty() {
                vec![None]
            } else {
                args.sources.iter().copied().map(Some).collect()
            };
            let attack = attack::IdleConnections {
                address: args.target.address,
                server_name: args.target.server_name,
                sources,
                per_source: args.per_source,
                duration: args.duration,
                progress: Arc::default(),
            };
            let outcome = attack::idle_connections(&attack, connector).await;
            println!("{outcome:#?}");
            println!(
                "{}",
                json!({"held": outcome.held, "refused": outcome.refused, "closed_by_server": outcome.closed_by_server})
            );
            return Ok(());
        }
    }
    let attack = attack::Attack {
        address: args.target.address,
        server_name: args.target.server_name,
        connections: args.connections,
        streams_per_connection: args.streams_per_connection,
        body_bytes: args.body_bytes,
        body_kind: if args.dense {
            attack::BodyKind::Dense
        } else {
            attack::BodyKind::Padding
        },
        silent: args.silent,
        half_headers: args.half_headers,
        duration: args.duration,
        probe_every: args.probe_every,
    };
    let outcome = attack::run(&attack, connector).await;
    println!("{outcome:#?}");
    println!("slowest legitimate answer: {:?}", outcome.slowest_probe());
    let by_status = |pairs: &mut dyn Iterator<Item = u16>| {
        pairs.fold(serde_json::Map::new(), |mut m, s| {
            let n = m.entry(s.to_string()).or_insert(json!(0));
            *n = json!(n.as_u64().unwrap_or(0) + 1);
            m
        })
    };
    let large: serde_json::Map<String, serde_json::Value> = outcome
        .large_answered
        .iter()
        .map(|(status, n)| (status.to_string(), json!(n)))
        .collect();
    println!(
        "{}",
        json!({
            "large_answered": large,
            "large_failed": outcome.large_failed,
            "stalled_closed": outcome.stalled_closed,
            "probes": by_status(&mut outcome.probes.iter().map(|(s, _)| *s)),
            "slowest_probe_ms": outcome.slowest_probe().map(|d| d.as_millis()),
        })
    );
    Ok(())
}
