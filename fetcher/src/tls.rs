//! The TLS crypto provider (ring), installed once before any HTTP client is built: reqwest and
//! oci-client are built without a provider of their own (see the workspace Cargo.toml for why).

/// Idempotent; a provider the embedding program installed first is kept.
pub fn ensure_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
