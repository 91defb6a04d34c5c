//! The serving certificate, hot-reloaded. A resolver hands every new TLS handshake the current
//! certificate from an `ArcSwap`; a poller re-reads the files and swaps in a new pair when their
//! content changes. Reading through the paths on every poll follows Kubernetes' atomic `..data`
//! symlink swaps of mounted Secrets (which inotify on the files misses). A pair that fails to parse,
//! or whose key does not match the certificate (a rotation caught half-written), is not used: the
//! previous certificate keeps serving until the files are consistent.

use crate::{
    error::TlsError,
    metrics::{Metrics, ReloadLabels},
};
use arc_swap::ArcSwap;
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

/// The current serving certificate and where it comes from.
#[derive(Debug)]
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
}

/// The bytes of a certificate and key file pair, to notice changes.
type FilePair = (Vec<u8>, Vec<u8>);

impl CertStore {
    /// Loads the pair once; fails if it is unusable (the server cannot start without one).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let files = read_pair(cert_path, key_path)?;
        let key = certified_key(&files, &provider)?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(key),
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            provider,
        }))
    }

    /// A TLS 1.2/1.3 server configuration (ALPN h2 and http/1.1) serving the current certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Re-reads the files every `interval` until `stop` resolves, swapping in a changed pair once it
    /// loads.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        metrics: Arc<Metrics>,
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
            let result = match certified_key(&files, &self.provider) {
                Ok(key) => {
                    self.current.store(Arc::new(key));
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                    "success"
                }
                Err(e) => {
                    tracing::warn!(error = %e, "new certificate files unusable; keeping the previous certificate");
                    e.category()
                }
            };
            metrics
                .cert_reloads_total
                .get_or_create(&ReloadLabels { result })
                .inc();
            last = Some(files);
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<FilePair, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
}

fn certified_key(
    (cert_pem, key_pem): &FilePair,
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
