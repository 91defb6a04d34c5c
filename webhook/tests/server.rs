//! The admission server over real TLS connections, HTTP/2 and HTTP/1.1 (what the apiserver
//! negotiates): input it refuses still gets its HTTP answer, not a reset stream; TLS garbage and
//! clients that stall mid-handshake or mid-request neither crash it nor keep others waiting.

use clap::Parser as _;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::{
    Request, StatusCode,
    body::{Bytes, Frame},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::discovery::ApiResource;
use rustls::pki_types::ServerName;
use serde_json::Value;
use shared::crd::SourceRef;
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use webhook::{
    cluster_view::{ClusterView, KindScope, UserInfo},
    error::PolicyError,
    handler::MAX_BODY_BYTES,
    metrics::Metrics,
    server::serve_tls,
    tls::CertStore,
};

mod common;
use common::{admission_router, default_settings};

/// A cluster that knows nothing: the bodies here never get as far as asking it.
struct EmptyCluster;

impl ClusterView for EmptyCluster {
    async fn resolve(&self, _: &SourceRef) -> Result<KindScope, PolicyError> {
        Ok(KindScope::Unknown)
    }

    async fn can_get(&self, _: &UserInfo, _: &ApiResource, _: &str, _: &str) -> Result<bool, PolicyError> {
        Ok(false)
    }

    async fn annotations(
        &self,
        _: &ApiResource,
        _: &str,
        _: &str,
    ) -> Result<Option<BTreeMap<String, String>>, PolicyError> {
        Ok(None)
    }
}

/// Starts the server on a loopback port with a fresh self-signed certificate for `localhost`;
/// returns its address and a TLS client configuration that trusts it.
async fn start_server(alpn: &[u8]) -> (SocketAddr, TlsConnector) {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
    let metrics = Arc::new(Metrics::unregistered());
    let store = CertStore::new(metrics.clone());
    store
        .install(
            generated.cert.pem().as_bytes(),
            generated.signing_key.serialize_pem().as_bytes(),
        )
        .expect("the generated pair installs");
    let app = admission_router(EmptyCluster, default_settings(false), metrics);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let tls = store.server_config().expect("server TLS config");
    tokio::spawn(serve_tls(
        listener,
        tls,
        webhook::cli::Args::parse_from(["projection-webhook"]).server_limits(),
        app,
        std::future::pending(),
        Duration::from_secs(1),
    ));

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(generated.cert.der().clone())
        .expect("trust the certificate");
    let mut client =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    (addr, TlsConnector::from(Arc::new(client)))
}

/// POSTs `body` to `/validate` of a new server over one new connection speaking `alpn`; the status
/// and the body.
async fn post<B>(alpn: &[u8], body: B) -> (StatusCode, Value)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (addr, connector) = start_server(alpn).await;
    post_to(addr, &connector, alpn, body).await
}

/// POSTs `body` to `/validate` of the server at `addr` over one new connection speaking `alpn`.
async fn post_to<B>(addr: SocketAddr, connector: &TlsConnector, alpn: &[u8], body: B) -> (StatusCode, Value)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn), "negotiated protocol");
    let mut request = Request::post("https://localhost/validate").header("content-type", "application/json");
    if let Some(length) = body.size_hint().exact() {
        request = request.header("content-length", length);
    }
    let request = request.body(body).expect("request");
    let response = if alpn == b"h2" {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(connection);
        sender.send_request(request).await
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(connection);
        sender.send_request(request).await
    };
    let response =
        response.unwrap_or_else(|e| panic!("no HTTP answer over {}: {e:?}", String::from_utf8_lossy(alpn)));
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, body)
}

fn assert_refused_as_too_large(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["kind"], "AdmissionReview", "{body}");
    assert_eq!(body["response"]["allowed"], false, "{body}");
    let message = body["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("larger than"), "{message}");
}

/// A body of `chunks` chunks of 64 KiB that counts how many of them the client got to send.
fn counted_body(
    chunks: usize,
) -> (
    impl hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Send + Unpin,
    Arc<AtomicUsize>,
) {
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let frames = futures::stream::iter(0..chunks).map(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(Frame::data(Bytes::from(vec![b'x'; CHUNK])))
    });
    let body = StreamBody::new(frames);
    (body, sent)
}

const CHUNK: usize = 64 * 1024;

#[tokio::test]
async fn an_oversized_body_gets_a_413_over_http2_after_the_client_has_sent_it() {
    // Over the limit by half; streamed, so the server only learns the size by reading.
    let chunks = MAX_BODY_BYTES * 3 / 2 / CHUNK;
    let (body, sent) = counted_body(chunks);
    let (status, body) = post(b"h2", body).await;
    assert_refused_as_too_large(status, &body);
    // Answered before the end of the request, the stream would be reset while the client is still
    // sending: curl, for one, then reports only the reset.
    assert_eq!(
        sent.load(Ordering::SeqCst),
        chunks,
        "the client could not send its whole request"
    );
}

#[tokio::test]
async fn an_oversized_body_announced_by_its_length_gets_a_413_over_http2() {
    let (status, body) = post(b"h2", Full::new(Bytes::from(vec![b'x'; 2 * MAX_BODY_BYTES]))).await;
    assert_refused_as_too_large(status, &body);
}

#[tokio::test]
async fn an_oversized_body_gets_a_413_over_http1() {
    let (status, body) = post(
        b"http/1.1",
        Full::new(Bytes::from(vec![b'x'; MAX_BODY_BYTES + 1])),
    )
    .await;
    assert_refused_as_too_large(status, &body);
}

#[tokio::test]
async fn a_mangled_body_gets_a_400_over_http2() {
    let mangled = b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"Adm";
    let (status, body) = post(b"h2", Full::new(Bytes::from_static(mangled))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["kind"], "AdmissionReview", "{body}");
}

/// The same client configuration offering only `alpn`.
fn speaking(connector: &TlsConnector, alpn: &[u8]) -> TlsConnector {
    let mut config = (**connector.config()).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// Reads until the server closes the connection (or resets it); `None` if it is still open after
/// `limit`.
async fn closed_by_server(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> Option<usize> {
    use tokio::io::AsyncReadExt;
    let mut received = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut received)).await {
        Ok(_) => Some(received.len()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn tls_garbage_and_stalled_clients_neither_crash_the_server_nor_keep_others_waiting() {
    use tokio::io::AsyncWriteExt;
    let (addr, connector) = start_server(b"h2").await;
    let answered = |(status, body): (StatusCode, Value)| {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["kind"], "AdmissionReview", "{body}");
    };

    // Garbage where a TLS ClientHello belongs: each connection is dropped, the server goes on.
    let mut noise: u64 = 0x2545_F491_4F6C_DD1D;
    for round in 0..50 {
        let garbage: Vec<u8> = (0..(round * 97 % 4096 + 1))
            .map(|_| {
                noise ^= noise << 13;
                noise ^= noise >> 7;
                noise ^= noise << 17;
                noise as u8
            })
            .collect();
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        // The server may close before all of it is written.
        let _ = tcp.write_all(&garbage).await;
        assert!(
            closed_by_server(&mut tcp, Duration::from_secs(5)).await.is_some(),
            "round {round}: a connection that sent garbage is still open"
        );
    }
    answered(post_to(addr, &connector, b"h2", Full::new(Bytes::from_static(b"{}"))).await);

    // Clients that stall: before the handshake, and after it with half a request's headers.
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let mut half_requests = Vec::new();
    for _ in 0..50 {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let mut tls = speaking(&connector, b"http/1.1")
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("TLS handshake");
        tls.write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-")
            .await
            .expect("half a request");
        tls.flush().await.expect("flush");
        half_requests.push(tls);
    }
    // Everyone else is answered meanwhile, over both protocols.
    for _ in 0..10 {
        answered(post_to(addr, &connector, b"h2", Full::new(Bytes::from_static(b"{}"))).await);
    }
    let http1 = speaking(&connector, b"http/1.1");
    for _ in 0..10 {
        answered(post_to(addr, &http1, b"http/1.1", Full::new(Bytes::from_static(b"{}"))).await);
    }
    // And the stalled ones give their slots back: the handshake and header timeouts close them.
    assert!(
        closed_by_server(&mut silent[0], Duration::from_secs(20))
            .await
            .is_some(),
        "a client that never starts its handshake is never let go"
    );
    assert!(
        closed_by_server(&mut half_requests[0], Duration::from_secs(20))
            .await
            .is_some(),
        "a client that never finishes its headers is never let go"
    );
}
