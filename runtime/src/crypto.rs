//! The one rustls crypto provider of the workspace.

/// Installs ring as the one rustls crypto provider of the process. Must run first in `main`,
/// before any TLS client or server is built.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
