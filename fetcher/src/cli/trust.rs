//! The flags that say what a module's signature must meet, shared by every command that
//! pulls: a key (`--verify-key`), or a keyless identity under a trusted root (cosign's
//! `--certificate-identity[-regexp]` and `--certificate-oidc-issuer[-regexp]`).

use std::path::PathBuf;
use std::sync::Arc;

use wasm_fetcher::keyless::{no_root, PolicyNames, TrustedRoot, FLAG_NAMES};
use wasm_fetcher::{Settings, VerifyKey};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct TrustArgs {
    /// A PEM public key (ECDSA P-256, as cosign.pub): every module must be an oci:// image
    /// carrying a cosign signature by it, checked before anything is cached
    /// [default: $WASM_VERIFY_KEY].
    #[arg(long, value_name = "FILE")]
    pub verify_key: Option<PathBuf>,
    /// Sigstore's trusted_root.json (the public instance's, or a private one's): keyless
    /// signatures are checked against its CAs, CT logs and transparency logs, offline
    /// [default: $WASM_TRUSTED_ROOT].
    #[arg(long, value_name = "FILE")]
    pub trusted_root: Option<PathBuf>,
    /// Every module must carry a keyless signature whose certificate names this identity
    /// (an email or a URI, such as a workflow's) [default: $WASM_CERTIFICATE_IDENTITY].
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "certificate_identity_regexp"
    )]
    pub certificate_identity: Option<String>,
    /// As --certificate-identity, by a regular expression that must match the whole name
    /// [default: $WASM_CERTIFICATE_IDENTITY_REGEXP].
    #[arg(long, value_name = "REGEXP")]
    pub certificate_identity_regexp: Option<String>,
    /// The OIDC issuer that certified the identity, as the certificate names it
    /// (https://token.actions.githubusercontent.com, https://accounts.google.com, ...)
    /// [default: $WASM_CERTIFICATE_OIDC_ISSUER].
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "certificate_oidc_issuer_regexp"
    )]
    pub certificate_oidc_issuer: Option<String>,
    /// As --certificate-oidc-issuer, by a regular expression that must match the whole URL
    /// [default: $WASM_CERTIFICATE_OIDC_ISSUER_REGEXP].
    #[arg(long, value_name = "REGEXP")]
    pub certificate_oidc_issuer_regexp: Option<String>,
}

impl TrustArgs {
    /// Puts what the flags name into `settings`, over what the environment named.
    pub fn apply(&self, settings: &mut Settings) -> anyhow::Result<()> {
        if let Some(key) = &self.verify_key {
            settings.verify_key = Some(VerifyKey::read(key, "--verify-key")?);
        }
        if let Some(root) = &self.trusted_root {
            settings.trusted_root = Some(Arc::new(TrustedRoot::read(root, "--trusted-root")?));
        }
        let names = PolicyNames {
            identity: self.certificate_identity.as_deref(),
            identity_regexp: self.certificate_identity_regexp.as_deref(),
            issuer: self.certificate_oidc_issuer.as_deref(),
            issuer_regexp: self.certificate_oidc_issuer_regexp.as_deref(),
        };
        if names.any() {
            settings.verify_identity = names.policy(FLAG_NAMES).map_err(anyhow::Error::msg)?;
        }
        if settings.verify_identity.is_some() && settings.trusted_root.is_none() {
            anyhow::bail!(no_root("--trusted-root (WASM_TRUSTED_ROOT)"));
        }
        Ok(())
    }
}
