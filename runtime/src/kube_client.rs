//! The Kubernetes client both services (and the benchmark) use: kube's, with `TCP_NODELAY` on its
//! connections. kube's default connector leaves Nagle's algorithm on, and a request written in
//! more than one segment then waits for the server's delayed acknowledgement (about 40 ms on Linux)
//! before its last segment leaves: every write would cost that much latency.
//!
//! Building the stack ourselves must not lose what `kube::Client::try_from` gives: socket timeouts,
//! the retry of 429/503/504 (kube's own policy) and a trace span per request. On top of kube's
//! defaults it bounds the wait for an answer, so a connection that accepts and never answers (a
//! half-open path, a black-holed peer) fails the request instead of hanging it forever, and it speaks
//! HTTP/2 to the apiserver when offered (as client-go does), pinging a connection that stays
//! silent: a dead path is noticed within the ping interval and timeout, not only when a watch's
//! read timeout runs out.

use crate::rest_client_metrics::RestClientMetrics;
use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    Client, Config,
    client::{Body, ConfigExt, retry::RetryPolicy},
};
use std::time::Duration;
use tower::{BoxError, ServiceBuilder, retry::RetryLayer, timeout::TimeoutLayer};
use tower_http::trace::{DefaultMakeSpan, DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

/// How long the client waits on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Until a connection is up, TLS handshake included.
    pub connect: Duration,
    /// Until the response's head arrives. The apiserver ends every request that is not a watch
    /// after 60 s (`--request-timeout`) and answers a watch's head at once, so waiting longer only
    /// ever waits on a dead path.
    pub response: Duration,
    /// Between two reads of a response body, counted again from each write. A watch is never
    /// silent that long: the apiserver sends a bookmark to every watch about once a minute (kube's
    /// watcher asks for them).
    pub read: Duration,
    /// For a write to the socket to complete.
    pub write: Duration,
    /// After this long without a frame from the apiserver, an HTTP/2 connection is pinged
    /// (client-go: 30 s).
    pub ping_interval: Duration,
    /// How long a ping may go unanswered before the connection and every request and watch on it
    /// fail (client-go: 15 s).
    pub ping_timeout: Duration,
}

impl Timeouts {
    /// The defaults, with kube's connect and write timeouts when `config` sets them.
    pub fn for_config(config: &Config) -> Self {
        Self {
            connect: config.connect_timeout.unwrap_or(Duration::from_secs(30)),
            response: Duration::from_secs(65),
            read: config.read_timeout.unwrap_or(Duration::from_secs(150)),
            write: config.write_timeout.unwrap_or(Duration::from_secs(295)),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(15),
        }
    }
}

/// A `Config` for a cluster given by its parts only (no kubeconfig loader runs, so nothing else of
/// a kubeconfig can reach it): its `https://` server, the CA certificates (PEM) its certificate is
/// checked against (`None`: the system's roots), the name checked in that certificate when not
/// the server's host, and a kubeconfig `user` entry of inline credentials.
pub fn config_from_parts(
    server: &str,
    certificate_authority: Option<&[u8]>,
    tls_server_name: Option<String>,
    user: serde_json::Value,
) -> Result<Config, String> {
    let url = server.parse().map_err(|e| format!("server {server:?}: {e}"))?;
    let mut config = Config::new(url);
    config.tls_server_name = tls_server_name;
    if let Some(pem) = certificate_authority {
        let certificates = pem::parse_many(pem).map_err(|e| format!("certificate-authority-data: {e}"))?;
        if certificates.is_empty() {
            return Err("certificate-authority-data holds no PEM certificate".into());
        }
        config.root_cert = Some(certificates.into_iter().map(|c| c.into_contents()).collect());
    }
    config.auth_info = serde_json::from_value(user).map_err(|e| e.to_string())?;
    Ok(config)
}

/// A client for `config` whose connections send small requests at once, with the default
/// [`Timeouts`].
pub fn client_for(config: Config) -> Result<Client, kube::Error> {
    let timeouts = Timeouts::for_config(&config);
    client_with_timeouts(config, timeouts)
}

/// A client for `config` with the given timeouts (tests and the fault harness shorten them).
pub fn client_with_timeouts(config: Config, timeouts: Timeouts) -> Result<Client, kube::Error> {
    client_counted(config, timeouts, None)
}

/// As [`client_with_timeouts`], each request (each retry too) counted in `requests` when given,
/// under the apiserver's `host:port`.
pub fn client_counted(
    config: Config,
    timeouts: Timeouts,
    requests: Option<&RestClientMetrics>,
) -> Result<Client, kube::Error> {
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    client_counted_as(config, timeouts, requests.map(|r| (r, host)))
}

/// As [`client_counted`], the requests counted under the `host` label given (another cluster's
/// alias, when its URL must not become a label).
pub fn client_counted_as(
    config: Config,
    timeouts: Timeouts,
    requests: Option<(&RestClientMetrics, String)>,
) -> Result<Client, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let mut connector = TimeoutConnector::new(https_connector(&config, tcp)?);
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_read_timeout(Some(timeouts.read));
    connector.set_write_timeout(Some(timeouts.write));
    // Otherwise the time a pooled connection sat idle would count against the next request.
    connector.set_reset_reader_on_write(true);
    let http: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(timeouts.ping_interval)
            .http2_keep_alive_timeout(timeouts.ping_timeout)
            .http2_keep_alive_while_idle(true)
            .build(connector);
    // Failures are the callers' to report (with what they were doing): the trace layer logs them at
    // debug level only, like every request.
    let trace = TraceLayer::new_for_http()
        .make_span_with(DefaultMakeSpan::new().level(Level::DEBUG))
        .on_response(DefaultOnResponse::new().level(Level::DEBUG))
        .on_failure(DefaultOnFailure::new().level(Level::DEBUG));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        // Inside the retry: each attempt is a request, as client-go counts them.
        .option_layer(requests.map(|(r, host)| r.layer(host)))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(trace)
        // Inside the retry: each attempt gets the whole response timeout.
        .layer(TimeoutLayer::new(timeouts.response))
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

/// kube's TLS connector (its rustls configuration from the kubeconfig, its server name override),
/// offering HTTP/2 as well as HTTP/1.1 in ALPN: kube's own offers HTTP/1.1 only.
fn https_connector(
    config: &Config,
    tcp: HttpConnector,
) -> Result<hyper_rustls::HttpsConnector<HttpConnector>, kube::Error> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| kube::Error::Service(Box::new(e)))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    Ok(builder.enable_http1().enable_http2().wrap_connector(tcp))
}

/// The client from the environment (in-cluster ServiceAccount, `KUBECONFIG` or `~/.kube/config`).
pub async fn infer() -> anyhow::Result<Client> {
    infer_with(|_| {}, None).await
}

/// As [`infer`], with the default [`Timeouts`] changed by `adjust` (the controller's flags), and
/// the requests counted in `requests` when given.
pub async fn infer_with(
    adjust: impl FnOnce(&mut Timeouts),
    requests: Option<&RestClientMetrics>,
) -> anyhow::Result<Client> {
    let config = Config::infer().await?;
    let mut timeouts = Timeouts::for_config(&config);
    adjust(&mut timeouts);
    Ok(client_counted(config, timeouts, requests)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    const VERSION: &str = r#"{"major":"1","minor":"36","gitVersion":"v1.36.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;

    /// An HTTP server that answers each request with the next status of `statuses` (200 with a
    /// version body once they run out), counting requests.
    async fn server(statuses: &'static [u16]) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = conn.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        // GET requests only: a request ends with its head.
                        while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                            request.drain(..end + 4);
                            let i = count.fetch_add(1, Ordering::SeqCst);
                            let (status, body) = match statuses.get(i) {
                                Some(status) => (*status, ""),
                                None => (200, VERSION),
                            };
                            let response = format!(
                                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if conn.write_all(response.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, served)
    }

    fn client(url: &str) -> Client {
        client_for(Config::new(url.parse().unwrap())).unwrap()
    }

    #[tokio::test]
    async fn throttled_and_unavailable_answers_are_retried() {
        let (url, served) = server(&[429, 503, 504]).await;
        let version = client(&url)
            .apiserver_version()
            .await
            .expect("retried to success");
        assert_eq!(version.minor, "36");
        assert_eq!(served.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn other_errors_are_not_retried() {
        let (url, served) = server(&[500]).await;
        assert!(client(&url).apiserver_version().await.is_err());
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn every_request_is_counted_by_its_answer_each_retry_included() {
        let (url, _) = server(&[503]).await;
        let mut registry = prometheus_client::registry::Registry::default();
        let requests = RestClientMetrics::register(&mut registry);
        let config = Config::new(url.parse().unwrap());
        let timeouts = Timeouts::for_config(&config);
        let client = client_counted(config, timeouts, Some(&requests)).unwrap();
        client.apiserver_version().await.expect("retried to success");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let host = url.trim_start_matches("http://");
        for code in ["503", "200"] {
            let line = format!(r#"rest_client_requests_total{{code="{code}",host="{host}",method="GET"}} 1"#);
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
    }
}
