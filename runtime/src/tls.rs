//! A served certificate, hot-reloaded: the webhook's admission server and, when asked, the metrics
//! endpoints of both services. A resolver hands every new TLS handshake the current certificate
//! from an `ArcSwap`, fed either by the webhook's self-managed Secret or by files: a poller
//! re-reads them and swaps in a new pair when their content changes. Reading through the paths on
//! every poll follows Kubernetes' atomic `..data` symlink swaps of mounted Secrets (which inotify
//! on the files misses). A pair that fails to parse, or whose key does not match the certificate (a
//! rotation caught half-written), is not used: the previous certificate keeps serving until the
//! files are consistent.

use arc_swap::ArcSwapOption;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier, danger::ClientCertVerifier},
    sign::CertifiedKey,
};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};
use thiserror::Error;

/// Why a certificate could not be (re)loaded; the previous one stays in use.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The PEM holds no certificate or no usable key.
    #[error("parsing PEM: {0}")]
    Pem(String),
    /// The key is not one rustls can sign with, or does not belong to the certificate.
    #[error("certificate and key unusable together: {0}")]
    Key(#[source] rustls::Error),
}

impl TlsError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read",
            Self::Pem(_) => "pem",
            Self::Key(_) => "key",
        }
    }
}

/// Labels of a certificate's reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success`, or why the new pair was not used (`read`, `pem`, `key`).
    pub result: &'static str,
}

/// The two metrics of one served certificate: its reloads and its expiry.
#[derive(Clone, Debug, Default)]
pub struct CertMetrics {
    /// Reloads after a change on disk, by result.
    pub reloads_total: Family<ReloadLabels, Counter>,
    /// Expiry (Unix seconds) of the certificate in use, whatever its source.
    pub expiry_timestamp_seconds: Gauge<f64, AtomicU64>,
}

impl CertMetrics {
    /// Registers both as `<prefix>_certificate_reloads` and
    /// `<prefix>_certificate_expiry_timestamp_seconds`; `what` names the certificate in their help.
    pub fn register(&self, registry: &mut Registry, prefix: &str, what: &str) {
        registry.register(
            format!("{prefix}_certificate_reloads"),
            format!("{what} certificate reloads after a change on disk, by result"),
            self.reloads_total.clone(),
        );
        registry.register(
            format!("{prefix}_certificate_expiry_timestamp_seconds"),
            format!(
                "Expiry of the {} certificate in use, in seconds since the Unix epoch",
                what.to_lowercase()
            ),
            self.expiry_timestamp_seconds.clone(),
        );
    }

    /// The metrics of a service's metrics endpoint certificate (`--metrics-cert-file`), registered
    /// as `<service>_metrics_certificate_reloads` and `..._expiry_timestamp_seconds`.
    pub fn of_metrics_endpoint(registry: &mut Registry, service: &str) -> Self {
        let metrics = Self::default();
        metrics.register(registry, &format!("{service}_metrics"), "Metrics endpoint's");
        metrics
    }
}

/// The current serving certificate, handed to every new TLS handshake. Empty until a first pair is
/// installed (handshakes fail until then; the webhook is not ready either).
pub struct CertStore {
    current: ArcSwapOption<CertifiedKey>,
    provider: Arc<CryptoProvider>,
    metrics: CertMetrics,
    loaded: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("loaded", &self.is_loaded())
            .finish_non_exhaustive()
    }
}

impl CertStore {
    /// An empty store.
    pub fn new(metrics: CertMetrics) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwapOption::empty(),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            metrics,
            loaded: tokio::sync::watch::channel(false).0,
        })
    }

    /// Serves the PEM pair from now on, if it parses and the key belongs to the certificate;
    /// otherwise the previous pair stays. Sets the expiry metric.
    pub fn install(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let key = certified_key(cert_pem, key_pem, &self.provider)?;
        let expiry = key
            .cert
            .first()
            .and_then(|leaf| x509_parser::parse_x509_certificate(leaf).ok())
            .map(|(_, cert)| cert.validity().not_after.timestamp());
        self.current.store(Some(Arc::new(key)));
        if let Some(expiry) = expiry {
            // Unix seconds fit an f64 exactly for millions of years.
            #[allow(clippy::cast_precision_loss)]
            self.metrics.expiry_timestamp_seconds.set(expiry as f64);
        }
        self.loaded.send_replace(true);
        Ok(())
    }

    /// Whether a pair is being served.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Resolves once a pair is being served.
    pub async fn wait_loaded(&self) {
        let mut loaded = self.loaded.subscribe();
        // The sender lives as long as `self`, so this only ends when a pair is installed.
        let _ = loaded.wait_for(|loaded| *loaded).await;
    }

    /// The DER of the certificate being served.
    pub fn served_certificate(&self) -> Option<Vec<u8>> {
        self.current
            .load_full()
            .and_then(|key| key.cert.first().map(|c| c.to_vec()))
    }

    /// A TLS 1.2/1.3 server configuration (ALPN h2 and http/1.1) serving the current certificate;
    /// with `client_ca`, a client must present a certificate chained to it (see
    /// [`client_verifier`]), otherwise no client certificate is asked for.
    pub fn server_config(
        self: &Arc<Self>,
        client_ca: Option<Arc<dyn ClientCertVerifier>>,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let authenticating = client_ca.is_some();
        let builder = match client_ca {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.clone());
        if authenticating {
            // A resumed session skips the client certificate: a client whose CA was replaced
            // would keep its access until its session expired. Every handshake is a full one
            // (the apiserver keeps its connections, so this costs little).
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A verifier that requires every client to present a certificate chained to one of the CAs in
/// `ca_pem` (PEM, one or more certificates; during a CA rotation, old and new), valid now and for
/// client authentication: the apiserver's admission client certificate. Built from the provider of
/// the serving side, so the workspace keeps one crypto provider.
pub fn client_verifier(ca_pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| TlsError::Pem(format!("client CA: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| TlsError::Pem(format!("client CA: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem("no certificate in the client CA file".into()));
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| TlsError::Pem(format!("client CA: {e}")))
}

/// The client CA of `--client-ca-file`, re-read to follow a rotation (a mounted ConfigMap): every
/// handshake is verified by the verifier of the file's current content. A file that no longer
/// parses keeps the previous CA in use.
#[derive(Debug)]
pub struct ClientCa {
    current: arc_swap::ArcSwap<CurrentVerifier>,
    path: PathBuf,
}

/// What the `ArcSwap` holds (it needs a sized type).
#[derive(Debug)]
struct CurrentVerifier(Arc<dyn ClientCertVerifier>);

impl ClientCa {
    /// The CA in `path`; fails if the file is unreadable or holds no usable CA (the server does not
    /// start without one).
    pub fn load(path: &Path) -> Result<Arc<Self>, TlsError> {
        let pem = read_file(path)?;
        Ok(Arc::new(Self {
            current: arc_swap::ArcSwap::from_pointee(CurrentVerifier(client_verifier(&pem)?)),
            path: path.to_owned(),
        }))
    }

    /// Re-reads the file every `interval` until `stop` resolves, verifying new handshakes with a
    /// changed CA once it parses.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut last = read_file(&self.path).ok();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut stop => return,
            }
            // Mid-swap the file can be briefly missing; the next tick sees the new one.
            let Ok(pem) = read_file(&self.path) else { continue };
            if last.as_ref() == Some(&pem) {
                continue;
            }
            match client_verifier(&pem) {
                Ok(verifier) => {
                    self.current.store(Arc::new(CurrentVerifier(verifier)));
                    tracing::info!(path = %self.path.display(), "client CA reloaded");
                }
                Err(e) => tracing::warn!(error = %e, "new client CA unusable; keeping the previous one"),
            }
            last = Some(pem);
        }
    }

    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.load().0.clone()
    }
}

impl ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would have to outlive a reload. An empty list lets the client send the
    /// certificate it has (the apiserver has one).
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.verifier().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.verifier().supported_verify_schemes()
    }
}

/// A certificate and key file pair (a mounted Secret), re-read to follow rotations.
#[derive(Clone, Debug)]
pub struct CertFiles {
    cert_path: PathBuf,
    key_path: PathBuf,
}

/// The bytes of a certificate and key file pair, to notice changes.
type FilePair = (Vec<u8>, Vec<u8>);

impl CertFiles {
    /// The pair at these paths.
    pub fn new(cert_path: &Path, key_path: &Path) -> Self {
        Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
        }
    }

    /// Loads the pair into `store` once; fails if it is unusable (the server cannot start without
    /// one).
    pub fn load_into(&self, store: &CertStore) -> Result<(), TlsError> {
        let (cert, key) = read_pair(&self.cert_path, &self.key_path)?;
        store.install(&cert, &key)
    }

    /// Re-reads the files every `interval` until `stop` resolves, swapping in a changed pair once it
    /// loads.
    pub async fn watch(
        self,
        store: Arc<CertStore>,
        interval: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut last = read_pair(&self.cert_path, &self.key_path).ok();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut stop => return,
            }
            let files = match read_pair(&self.cert_path, &self.key_path) {
                Ok(files) => files,
                Err(e) => {
                    // Mid-swap a file can be briefly missing; the next tick sees the new pair.
                    tracing::debug!(error = %e, "certificate files not readable");
                    continue;
                }
            };
            if last.as_ref() == Some(&files) {
                continue;
            }
            let result = match store.install(&files.0, &files.1) {
                Ok(()) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                    "success"
                }
                Err(e) => {
                    tracing::warn!(error = %e, "new certificate files unusable; keeping the previous certificate");
                    e.category()
                }
            };
            store
                .metrics
                .reloads_total
                .get_or_create(&ReloadLabels { result })
                .inc();
            last = Some(files);
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<FilePair, TlsError> {
    Ok((read_file(cert)?, read_file(key)?))
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(format!("certificate: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::Pem("no certificate in the certificate file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem(format!("key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider).map_err(TlsError::Key)
}

/// The flags of a metrics endpoint served over HTTPS, the same in both services.
#[derive(clap::Args, Clone, Debug)]
pub struct MetricsTlsArgs {
    /// Serve /metrics over HTTPS with this certificate (PEM, chain first; with
    /// --metrics-key-file), re-read as it rotates. Unset: plain HTTP. The probes stay plain HTTP
    /// (the kubelet's), so the metrics need an address of their own.
    #[arg(long, value_name = "PATH", requires = "metrics_key_file")]
    pub metrics_cert_file: Option<PathBuf>,
    /// The key of --metrics-cert-file (PEM).
    #[arg(long, value_name = "PATH", requires = "metrics_cert_file")]
    pub metrics_key_file: Option<PathBuf>,
    /// How often the metrics certificate files are re-read to pick up a rotation.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub metrics_cert_reload_interval: Duration,
}

impl MetricsTlsArgs {
    /// The TLS configuration of the metrics endpoint at `addresses` (the metrics' and the probes'),
    /// or `None` for plain HTTP: the pair is loaded now (the process does not start with an
    /// unusable one, nor with metrics that have no address of their own) and re-read every interval
    /// until `stop`, its reloads and expiry registered in `registry` under `service`'s prefix
    /// ([`CertMetrics::of_metrics_endpoint`]; only then: no expiry of a certificate that is not
    /// there).
    pub fn server_config(
        &self,
        (metrics_addr, probe_addr): (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
        (registry, service): (&mut Registry, &str),
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<Option<Arc<ServerConfig>>> {
        let (Some(cert), Some(key)) = (&self.metrics_cert_file, &self.metrics_key_file) else {
            return Ok(None);
        };
        crate::http::check_https_metrics_address(metrics_addr, probe_addr)?;
        let store = CertStore::new(CertMetrics::of_metrics_endpoint(registry, service));
        let files = CertFiles::new(cert, key);
        files
            .load_into(&store)
            .map_err(|e| anyhow::anyhow!("--metrics-cert-file/--metrics-key-file: {e}"))?;
        let config = store.server_config(None)?;
        tokio::spawn(files.watch(store, self.metrics_cert_reload_interval, stop));
        Ok(Some(config))
    }
}
