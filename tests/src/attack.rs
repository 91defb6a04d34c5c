//! An attempt to exhaust a webhook server, bounded in count and time: HTTP/2 connections each
//! sending many concurrent 4 MiB admission reviews, connections that stall (TCP without a TLS
//! handshake, HTTP/2 with half a header block), and meanwhile a legitimate review at a steady pace
//! whose answer time is recorded. It stops by itself at `duration`. Shared by the exhaustion test
//! (`webhook/tests/exhaustion.rs`, against a webhook process on 127.0.0.1), the chart's test of a
//! webhook pod under attack (`tests/e2e/chart_node.rs`) and the `webhook-exhaust` binary (against
//! any address, e.g. a pod's).

use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::{io::AsyncWriteExt, net::TcpStream, task::JoinSet};
use tokio_rustls::TlsConnector;

/// What to throw at the server.
#[derive(Clone, Debug)]
pub struct Attack {
    /// The webhook's address.
    pub address: SocketAddr,
    /// The name its certificate is checked against.
    pub server_name: String,
    /// HTTP/2 connections sending large reviews.
    pub connections: usize,
    /// Concurrent large reviews per connection, each sent again as soon as it is answered.
    pub streams_per_connection: usize,
    /// Size of each large review's body.
    pub body_bytes: usize,
    /// What fills it.
    pub body_kind: BodyKind,
    /// Connections that open TCP and send nothing.
    pub silent: usize,
    /// Connections that complete TLS and send half an HTTP/2 header block (reopened when closed).
    pub half_headers: usize,
    /// How long the attack lasts.
    pub duration: Duration,
    /// The pace of the legitimate reviews.
    pub probe_every: Duration,
}

/// What fills a large review.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// One long annotation: the body, and one string as large in its parsed form.
    Padding,
    /// An array of zeros in the object: the parsed form is many times the body (a JSON value per
    /// two bytes), the most memory a body of this size can cost the parser.
    Dense,
}

/// What happened.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Large reviews answered, by HTTP status.
    pub large_answered: Vec<(u16, usize)>,
    /// Large reviews that got no answer (reset, connection closed, refused).
    pub large_failed: usize,
    /// Stalled connections the server closed.
    pub stalled_closed: usize,
    /// The legitimate reviews: HTTP status (0 for no answer) and time to answer.
    pub probes: Vec<(u16, Duration)>,
}

impl Outcome {
    /// The slowest legitimate answer, and whether every legitimate review was answered with a
    /// well-formed AdmissionReview.
    pub fn slowest_probe(&self) -> Option<Duration> {
        self.probes.iter().map(|(_, took)| *took).max()
    }
}

/// A valid review of a Projection whose object is filled up to `bytes` as `kind` says.
pub fn large_review(bytes: usize, kind: BodyKind) -> Bytes {
    let mut review = small_review_value();
    let room = bytes.saturating_sub(review.to_string().len() + 64);
    match kind {
        BodyKind::Padding => {
            review["request"]["object"]["metadata"]["annotations"] =
                json!({"example.com/padding": "x".repeat(room)});
        }
        BodyKind::Dense => {
            review["request"]["object"]["padding"] = Value::Array(vec![json!(0); room / 2]);
        }
    }
    Bytes::from(review.to_string())
}

/// A small, valid review the webhook admits (a ConfigMap source, no cluster read needed to answer
/// without client authentication).
pub fn small_review() -> Bytes {
    Bytes::from(small_review_value().to_string())
}

fn small_review_value() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000001",
            "kind": {"group": "projection.sh", "version": "v1", "kind": "Projection"},
            "resource": {"group": "projection.sh", "version": "v1", "resource": "projections"},
            "name": "probe",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "probe", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "projection.sh/v1",
                "kind": "Projection",
                "metadata": {"name": "probe", "namespace": "default"},
                "spec": {"source": {"kind": "ConfigMap", "namespace": "platform", "name": "settings"}}
            },
            "oldObject": null,
            "dryRun": false
        }
    })
}

/// Runs `attack` with `connector` (which must trust the server, and offer h2) until its duration
/// is over; every task it started has ended when it returns.
pub async fn run(attack: &Attack, connector: TlsConnector) -> Outcome {
    let deadline = Instant::now() + attack.duration;
    let large = large_review(attack.body_bytes, attack.body_kind);
    let answered: Arc<std::sync::Mutex<std::collections::BTreeMap<u16, usize>>> = Arc::default();
    let failed = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();

    for _ in 0..attack.silent {
        let (address, closed) = (attack.address, closed.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let Ok(mut tcp) = TcpStream::connect(address).await else {
                    break;
                };
                if read_until_closed(&mut tcp, deadline).await {
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    for _ in 0..attack.half_headers {
        let (attack, connector, closed) = (attack.clone(), connector.clone(), closed.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let Some(mut tls) = handshake(&attack, &connector, deadline).await else {
                    continue;
                };
                let mut frames = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
                frames.extend_from_slice(&[0, 0, 3, 0x1, 0, 0, 0, 0, 1, 0x83, 0x87, 0x84]);
                if tls.write_all(&frames).await.is_err() || tls.flush().await.is_err() {
                    continue;
                }
                if read_until_closed(&mut tls, deadline).await {
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    for _ in 0..attack.connections {
        let (attack, connector) = (attack.clone(), connector.clone());
        let (large, answered, failed) = (large.clone(), answered.clone(), failed.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let Some(tls) = handshake(&attack, &connector, deadline).await else {
                    continue;
                };
                let Ok((sender, connection)) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
                else {
                    continue;
                };
                let connection = tokio::spawn(connection);
                let mut streams = JoinSet::new();
                for _ in 0..attack.streams_per_connection {
                    let (mut sender, large) = (sender.clone(), large.clone());
                    let (answered, failed) = (answered.clone(), failed.clone());
                    streams.spawn(async move {
                        while Instant::now() < deadline {
                            if sender.ready().await.is_err() {
                                return;
                            }
                            let request = Request::post("https://webhook/validate")
                                .header("content-type", "application/json")
                                .header("content-length", large.len())
                                .body(Full::new(large.clone()))
                                .expect("request");
                            let within = deadline.saturating_duration_since(Instant::now());
                            match tokio::time::timeout(within, sender.send_request(request)).await {
                                Ok(Ok(response)) => {
                                    let status = response.status().as_u16();
                                    let _ = response.into_body().collect().await;
                                    *answered.lock().expect("lock").entry(status).or_default() += 1;
                                }
                                Ok(Err(_)) => {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                    return;
                                }
                                Err(_) => return,
                            }
                        }
                    });
                }
                while streams.join_next().await.is_some() {}
                drop(sender);
                connection.abort();
            }
        });
    }

    // The legitimate reviews, each over a new connection as an apiserver after a restart would.
    let mut probes = Vec::new();
    let small = small_review();
    while Instant::now() < deadline {
        let started = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(10), probe(attack, &connector, small.clone()))
            .await
            .ok()
            .flatten()
            .map_or(0, |s| s.as_u16());
        probes.push((status, started.elapsed()));
        tokio::time::sleep(attack.probe_every).await;
    }
    // Everything ends at the deadline; stragglers are stopped.
    let stop = Instant::now() + Duration::from_secs(15);
    while let Ok(Some(_)) = tokio::time::timeout_at(stop.into(), tasks.join_next()).await {}
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}

    let large_answered = answered
        .lock()
        .expect("lock")
        .iter()
        .map(|(s, n)| (*s, *n))
        .collect();
    Outcome {
        large_answered,
        large_failed: failed.load(Ordering::Relaxed),
        stalled_closed: closed.load(Ordering::Relaxed),
        probes,
    }
}

/// A TLS connection, or `None` if it failed or the deadline passed first.
async fn handshake(
    attack: &Attack,
    connector: &TlsConnector,
    deadline: Instant,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let within = deadline.saturating_duration_since(Instant::now());
    let name = ServerName::try_from(attack.server_name.clone()).ok()?;
    tokio::time::timeout(within, async {
        let tcp = TcpStream::connect(attack.address).await.ok()?;
        connector.connect(name, tcp).await.ok()
    })
    .await
    .ok()
    .flatten()
}

/// Reads and drops until the peer closes (true) or the deadline passes (false).
async fn read_until_closed(stream: &mut (impl tokio::io::AsyncRead + Unpin), deadline: Instant) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 4096];
    loop {
        let within = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// One legitimate review over a new HTTP/2 connection: its status if answered with a well-formed
/// AdmissionReview.
async fn probe(attack: &Attack, connector: &TlsConnector, body: Bytes) -> Option<StatusCode> {
    let tls = handshake(attack, connector, Instant::now() + Duration::from_secs(10)).await?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .ok()?;
    let connection = tokio::spawn(connection);
    let request = Request::post("https://webhook/validate")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status();
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    connection.abort();
    let review: Value = serde_json::from_slice(&bytes).ok()?;
    (review["kind"] == "AdmissionReview" && review["response"].is_object()).then_some(status)
}

/// The webhook a load tool talks to: its flags, the same in every tool.
#[derive(clap::Args, Debug)]
pub struct WebhookTarget {
    /// The webhook's address (IP:port).
    #[arg(long)]
    pub address: std::net::SocketAddr,
    /// The name the webhook's certificate is checked against.
    #[arg(long, default_value = "localhost")]
    pub server_name: String,
    /// PEM CA bundle that signed the webhook's certificate.
    #[arg(long)]
    pub ca_file: std::path::PathBuf,
}

/// The TLS client of the load tools: HTTP/2 to a server whose certificate chains to the CA in
/// `ca_file`, with the client certificate and key in `client_auth` when given (the apiserver's,
/// for the authenticated path).
pub fn h2_client_config(
    ca_file: &std::path::Path,
    client_auth: Option<(&std::path::Path, &std::path::Path)>,
) -> anyhow::Result<rustls::ClientConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file)? {
        roots.add(cert?)?;
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    let mut client = match client_auth {
        Some((cert, key)) => builder.with_client_auth_cert(
            CertificateDer::pem_file_iter(cert)?.collect::<Result<_, _>>()?,
            PrivateKeyDer::from_pem_file(key)?,
        )?,
        None => builder.with_no_client_auth(),
    };
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(client)
}

/// A TCP connection to `address` from `source` (any port), or from the default address.
pub async fn connect_from(
    source: Option<std::net::IpAddr>,
    address: SocketAddr,
) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(address).await;
    };
    let socket = if source.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(address).await
}

/// A TLS connection from `source`, or `None` if it failed or `deadline` passed first.
async fn handshake_from(
    address: SocketAddr,
    server_name: &str,
    source: Option<std::net::IpAddr>,
    connector: &TlsConnector,
    deadline: Instant,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let within = deadline.saturating_duration_since(Instant::now());
    let name = ServerName::try_from(server_name.to_owned()).ok()?;
    tokio::time::timeout(within, async {
        let tcp = connect_from(source, address).await.ok()?;
        connector.connect(name, tcp).await.ok()
    })
    .await
    .ok()
    .flatten()
}

/// The slow-small-body attack: HTTP/2 connections each opening many reviews whose body, small and
/// valid, its length announced, trickles one byte at a time. Against a server that takes a review's
/// room when its headers arrive, a few connections hold all of it; each review is opened again when
/// it ends, until `duration`.
#[derive(Clone, Debug)]
pub struct SlowBodies {
    /// The webhook's address.
    pub address: SocketAddr,
    /// The name its certificate is checked against.
    pub server_name: String,
    /// Where the connections come from (`None`: the default address).
    pub source: Option<std::net::IpAddr>,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Reviews each connection keeps open at once (the server may let fewer through at a time:
    /// the rest wait on the client's side for a stream).
    pub streams_per_connection: usize,
    /// The pace of the body: one byte per this.
    pub byte_every: Duration,
    /// How long the attack lasts.
    pub duration: Duration,
    /// Reviews started so far (their request handed to the HTTP/2 client), for a caller to wait
    /// until the attack is in place.
    pub progress: Arc<AtomicUsize>,
}

/// What the slow-small-body attack saw.
#[derive(Debug, Default)]
pub struct SlowOutcome {
    /// Reviews started (their headers sent).
    pub started: usize,
    /// Reviews answered, by HTTP status (408: the body timeout cut it).
    pub answered: std::collections::BTreeMap<u16, usize>,
    /// Reviews that got no answer (reset, connection closed) before the attack's end.
    pub failed: usize,
}

/// Runs the slow-small-body attack with `connector` (which must trust the server and offer h2)
/// until its duration is over; every task it started has ended when it returns.
pub async fn slow_bodies(attack: &SlowBodies, connector: TlsConnector) -> SlowOutcome {
    let deadline = Instant::now() + attack.duration;
    let body = small_review();
    let outcome = Arc::new(std::sync::Mutex::new(SlowOutcome::default()));
    let mut tasks = JoinSet::new();
    for _ in 0..attack.connections {
        let (attack, connector, body, outcome) =
            (attack.clone(), connector.clone(), body.clone(), outcome.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let Some(tls) = handshake_from(
                    attack.address,
                    &attack.server_name,
                    attack.source,
                    &connector,
                    deadline,
                )
                .await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok((sender, connection)) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
                else {
                    continue;
                };
                let connection = tokio::spawn(connection);
                // One whole review first: its answer comes after the server's SETTINGS, so the
                // client knows how many streams it may open and queues the rest (an HTTP/2 client
                // that opened more would have them refused, and the connection closed).
                let mut first = sender.clone();
                let request = Request::post("https://webhook/validate")
                    .header("content-type", "application/json")
                    .body(http_body_util::Either::Left(Full::new(body.clone())))
                    .expect("request");
                if first.send_request(request).await.is_err() {
                    connection.abort();
                    continue;
                }
                let mut streams = JoinSet::new();
                for _ in 0..attack.streams_per_connection {
                    let (mut sender, body, outcome) = (sender.clone(), body.clone(), outcome.clone());
                    let (byte_every, progress) = (attack.byte_every, attack.progress.clone());
                    streams.spawn(async move {
                        while Instant::now() < deadline {
                            if sender.ready().await.is_err() {
                                return;
                            }
                            let whole = body.clone();
                            let trickle = Box::pin(futures::stream::unfold(0, move |sent| {
                                let body = whole.clone();
                                async move {
                                    if sent >= body.len() {
                                        return None;
                                    }
                                    tokio::time::sleep(byte_every).await;
                                    let frame = hyper::body::Frame::data(body.slice(sent..sent + 1));
                                    Some((Ok::<_, std::convert::Infallible>(frame), sent + 1))
                                }
                            }));
                            let request = Request::post("https://webhook/validate")
                                .header("content-type", "application/json")
                                .header("content-length", body.len())
                                .body(http_body_util::Either::Right(http_body_util::StreamBody::new(
                                    trickle,
                                )))
                                .expect("request");
                            outcome.lock().expect("lock").started += 1;
                            progress.fetch_add(1, Ordering::Relaxed);
                            let within = deadline.saturating_duration_since(Instant::now());
                            match tokio::time::timeout(within, sender.send_request(request)).await {
                                Ok(Ok(response)) => {
                                    let status = response.status().as_u16();
                                    let _ = response.into_body().collect().await;
                                    *outcome.lock().expect("lock").answered.entry(status).or_default() += 1;
                                }
                                Ok(Err(_)) => {
                                    outcome.lock().expect("lock").failed += 1;
                                    return;
                                }
                                Err(_) => return,
                            }
                        }
                    });
                }
                while streams.join_next().await.is_some() {}
                drop(sender);
                connection.abort();
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut outcome = outcome.lock().expect("lock");
    std::mem::take(&mut *outcome)
}

/// The many-idle-connections attack: from each of `sources`, `per_source` connections that
/// complete TLS and HTTP/2 and send one small review, then nothing: idle connections a server
/// keeps until its idle timeout. Reopened when closed, until `duration`. From several addresses,
/// they can fill a server's connection cap however small each address's share.
#[derive(Clone, Debug)]
pub struct IdleConnections {
    /// The webhook's address.
    pub address: SocketAddr,
    /// The name its certificate is checked against.
    pub server_name: String,
    /// Where the connections come from (`None`: the default address).
    pub sources: Vec<Option<std::net::IpAddr>>,
    /// Connections held from each source.
    pub per_source: usize,
    /// How long the attack lasts.
    pub duration: Duration,
    /// Connections held idle right now, for a caller to wait until the attack is in place.
    pub progress: Arc<AtomicUsize>,
}

/// What the many-idle-connections attack saw.
#[derive(Debug, Default)]
pub struct IdleOutcome {
    /// Connections that completed TLS and got their review answered: held idle.
    pub held: usize,
    /// Connections that did not get that far (closed at once, or TLS or HTTP/2 failed).
    pub refused: usize,
    /// Held connections the server closed before the attack's end.
    pub closed_by_server: usize,
}

/// Runs the many-idle-connections attack with `connector` until its duration is over; every task
/// it started has ended when it returns.
pub async fn idle_connections(attack: &IdleConnections, connector: TlsConnector) -> IdleOutcome {
    let deadline = Instant::now() + attack.duration;
    let (held, refused, closed) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let body = small_review();
    let mut tasks = JoinSet::new();
    for source in &attack.sources {
        for _ in 0..attack.per_source {
            let (attack, connector, source, body) =
                (attack.clone(), connector.clone(), *source, body.clone());
            let (held, refused, closed) = (held.clone(), refused.clone(), closed.clone());
            tasks.spawn(async move {
                while Instant::now() < deadline {
                    let kept = async {
                        let tls =
                            handshake_from(attack.address, &attack.server_name, source, &connector, deadline)
                                .await?;
                        let (mut sender, connection) =
                            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                                .await
                                .ok()?;
                        let mut connection = tokio::spawn(connection);
                        let request = Request::post("https://webhook/validate")
                            .header("content-type", "application/json")
                            .body(Full::new(body.clone()))
                            .ok()?;
                        let response = tokio::select! {
                            response = sender.send_request(request) => response.ok()?,
                            _ = &mut connection => return None,
                        };
                        let _ = response.into_body().collect().await;
                        Some((sender, connection))
                    };
                    let within = deadline.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(within, kept).await {
                        Ok(Some((sender, connection))) => {
                            held.fetch_add(1, Ordering::Relaxed);
                            attack.progress.fetch_add(1, Ordering::Relaxed);
                            // Nothing more is sent; the connection ends when the server closes it.
                            let within = deadline.saturating_duration_since(Instant::now());
                            if tokio::time::timeout(within, connection).await.is_ok() {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                            attack.progress.fetch_sub(1, Ordering::Relaxed);
                            drop(sender);
                        }
                        Ok(None) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            // Closed at once: try again a little later, not in a tight loop.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(_) => {}
                    }
                }
            });
        }
    }
    let stop = deadline + Duration::from_secs(15);
    while let Ok(Some(_)) = tokio::time::timeout_at(stop.into(), tasks.join_next()).await {}
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    IdleOutcome {
        held: held.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
        closed_by_server: closed.load(Ordering::Relaxed),
    }
}

/// An UPDATE of a Projection that changes its spec (the source's name becomes `settings-<n>`),
/// as the apiserver sends when someone edits one: the webhook admits it.
pub fn spec_change_review(n: usize) -> Bytes {
    let mut review = small_review_value();
    let request = &mut review["request"];
    request["uid"] = json!(format!("00000000-0000-0000-0001-{n:012}"));
    request["operation"] = json!("UPDATE");
    request["oldObject"] = request["object"].clone();
    request["object"]["spec"]["source"]["name"] = json!(format!("settings-{n}"));
    Bytes::from(review.to_string())
}

/// What one genuine review got: its HTTP status (0 for none), whether the AdmissionReview allowed
/// it, and the time to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Genuine {
    /// HTTP status, 0 when there was no answer within the timeout.
    pub status: u16,
    /// The answer's `response.allowed`.
    pub allowed: bool,
    /// From the connection's start to the answer.
    pub took: Duration,
}

/// `count` genuine spec changes to `/validate`, one after another, each over a new HTTP/2
/// connection from `source` (as the apiserver after a restart, the hardest case while connections
/// are scarce), each given `timeout` (the webhook configuration's `timeoutSeconds`).
pub async fn genuine_reviews(
    address: SocketAddr,
    server_name: &str,
    source: Option<std::net::IpAddr>,
    connector: &TlsConnector,
    count: usize,
    timeout: Duration,
) -> Vec<Genuine> {
    let mut answers = Vec::with_capacity(count);
    for n in 0..count {
        let started = Instant::now();
        let review = async {
            let tls = handshake_from(address, server_name, source, connector, started + timeout).await?;
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .ok()?;
            let connection = tokio::spawn(connection);
            let request = Request::post("https://webhook/validate")
                .header("content-type", "application/json")
                .body(Full::new(spec_change_review(n)))
                .ok()?;
            let response = sender.send_request(request).await.ok()?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await.ok()?.to_bytes();
            connection.abort();
            let review: Value = serde_json::from_slice(&bytes).ok()?;
            Some((status, review["response"]["allowed"] == json!(true)))
        };
        let (status, allowed) = tokio::time::timeout(timeout, review)
            .await
            .ok()
            .flatten()
            .unwrap_or((0, false));
        answers.push(Genuine {
            status,
            allowed,
            took: started.elapsed(),
        });
    }
    answers
}
