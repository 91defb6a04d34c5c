//! A load generator for the webhook that authenticates as the apiserver does: HTTP/2 over TLS with
//! a client certificate, which wrk cannot present. Each connection sends one AdmissionReview (the
//! file `--body`) after another, as fast as answers come, until `--duration` is over; then it
//! prints the same lines as `webhook/bench/review.lua` (requests, errors, rate, p50/p90/p99 as the
//! client saw them), so `webhook/bench/run.sh` reads either.
//!
//! ```text
//! cargo run --release -p projection-tests --bin webhook-load -- --address 127.0.0.1:19443 \
//!   --ca-file ca.crt --cert client.crt --key client.key --body review.json --duration 20s
//! ```
//!
//! Bounded in time (at most 10 minutes); it stops by itself. Only point it at a webhook you run.

use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{Request, body::Bytes};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    target: projection_tests::attack::WebhookTarget,
    /// The client certificate (PEM) to present, e.g. the apiserver's admission client certificate.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// The AdmissionReview to send.
    #[arg(long)]
    body: PathBuf,
    /// The path reviews are sent to.
    #[arg(long, default_value = "/validate")]
    path: String,
    /// HTTP/2 connections, each with one review in flight at a time.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// At most 10 minutes.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

/// What one connection saw: the time of each answered review, and the reviews that failed.
#[derive(Default)]
struct Lane {
    answered: Vec<Duration>,
    status_errors: usize,
    other_errors: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.duration <= Duration::from_secs(600),
        "--duration is at most 10m"
    );
    let client_auth = args.cert.as_deref().zip(args.key.as_deref());
    let client = projection_tests::attack::h2_client_config(&args.target.ca_file, client_auth)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let body = Bytes::from(std::fs::read(&args.body)?);
    let server_name = ServerName::try_from(args.target.server_name.clone())?;
    let started = Instant::now();
    let deadline = started + args.duration;

    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let (connector, server_name, body) = (connector.clone(), server_name.clone(), body.clone());
        let (address, uri) = (
            args.target.address,
            format!("https://{}{}", args.target.server_name, args.path),
        );
        lanes.spawn(async move {
            let mut lane = Lane::default();
            let tcp = TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
            let connection = tokio::spawn(connection);
            while Instant::now() < deadline {
                let request = Request::post(uri.as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))?;
                let sent = Instant::now();
                let within = deadline.saturating_duration_since(sent) + Duration::from_secs(10);
                match tokio::time::timeout(within, sender.send_request(request)).await {
                    Ok(Ok(response)) => {
                        let ok = response.status().is_success();
                        let whole = response.into_body().collect().await.is_ok();
                        match (ok, whole) {
                            (true, true) => lane.answered.push(sent.elapsed()),
                            (false, _) => lane.status_errors += 1,
                            (true, false) => lane.other_errors += 1,
                        }
                    }
                    _ => {
                        lane.other_errors += 1;
                        break;
                    }
                }
            }
            connection.abort();
            anyhow::Ok(lane)
        });
    }
    let mut answered = Vec::new();
    let (mut status_errors, mut other_errors) = (0, 0);
    while let Some(lane) = lanes.join_next().await {
        match lane? {
            Ok(lane) => {
                answered.extend(lane.answered);
                status_errors += lane.status_errors;
                other_errors += lane.other_errors;
            }
            Err(e) => {
                eprintln!("a connection failed: {e:#}");
                other_errors += 1;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    answered.sort();
    let total = answered.len() + status_errors + other_errors;
    println!(
        "requests {total}, errors {} (status {status_errors}, other {other_errors}), {:.0} req/s",
        status_errors + other_errors,
        total as f64 / elapsed
    );
    for p in [50, 90, 99] {
        // Nearest rank over the answered reviews.
        let rank = (answered.len() * p).div_ceil(100).max(1) - 1;
        let ms = answered.get(rank).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
        println!("p{p} {ms:.2} ms");
    }
    anyhow::ensure!(!answered.is_empty(), "no review was answered");
    Ok(())
}
