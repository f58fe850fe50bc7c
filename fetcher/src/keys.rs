//! The keys: a public key to verify with, a private key to sign with, both PEM files.

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};

use crate::error::FetchError;

/// A PEM key file is a few hundred bytes.
pub const KEY_FILE_LIMIT: u64 = 64 << 10;

/// A public key a module's signature must verify with: PEM `PUBLIC KEY` (SPKI), ECDSA P-256,
/// as `cosign generate-key-pair` and `openssl ec -pubout` write it.
#[derive(Clone)]
pub struct VerifyKey {
    key: VerifyingKey,
    /// `sha256:` of the key's SPKI DER, its first 16 hex characters: how messages name it.
    id: Arc<str>,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({})", self.id)
    }
}

impl PartialEq for VerifyKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl VerifyKey {
    pub fn from_pem(text: &str) -> Result<Self, String> {
        if !text.contains("-----BEGIN PUBLIC KEY-----") {
            return Err(
                "expected a PEM public key (-----BEGIN PUBLIC KEY-----, ECDSA P-256), such as cosign.pub"
                    .into(),
            );
        }
        let key = VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| {
            format!("not an ECDSA P-256 public key ({e}); only P-256 keys are verified")
        })?;
        let der = key
            .to_public_key_der()
            .map_err(|e| format!("cannot encode the key: {e}"))?;
        let id = format!(
            "sha256:{}",
            &crate::digest::Sha256::of(der.as_bytes()).hex()[..16]
        );
        Ok(Self { key, id: id.into() })
    }

    /// `--verify-key` or `WASM_VERIFY_KEY`: a regular file of at most 64 KiB.
    pub fn read(path: &Path, what: &'static str) -> Result<Self, FetchError> {
        let text = read_pem(path, what)?;
        Self::from_pem(&text).map_err(|reason| FetchError::Read {
            what,
            path: path.to_path_buf(),
            reason,
        })
    }

    /// How messages name the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn key(&self) -> &VerifyingKey {
        &self.key
    }

    /// The key as PEM (SPKI).
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap_or_default()
    }
}

/// A private key `push --sign-key` signs with: PEM PKCS#8 (`PRIVATE KEY`), ECDSA P-256, as
/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes it.
#[derive(Clone)]
pub struct SignKey(SigningKey);

impl std::fmt::Debug for SignKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignKey(..)")
    }
}

impl SignKey {
    #[cfg(test)]
    pub(crate) fn from_scalar(bytes: &[u8; 32]) -> Self {
        Self(SigningKey::from_slice(bytes).expect("a valid scalar"))
    }

    pub fn from_pem(text: &str) -> Result<Self, String> {
        if text.contains("ENCRYPTED COSIGN PRIVATE KEY") || text.contains("ENCRYPTED SIGSTORE") {
            return Err("a cosign-encrypted key, which is not read: export an unencrypted PKCS#8 P-256 key (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256), or sign with `cosign sign --key`".into());
        }
        if !text.contains("-----BEGIN PRIVATE KEY-----") {
            return Err("expected a PEM PKCS#8 private key (-----BEGIN PRIVATE KEY-----, ECDSA P-256), as `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes".into());
        }
        SigningKey::from_pkcs8_pem(text.trim())
            .map(Self)
            .map_err(|e| format!("not an ECDSA P-256 private key ({e})"))
    }

    /// `--sign-key`: a regular file of at most 64 KiB.
    pub fn read(path: &Path) -> Result<Self, FetchError> {
        let text = read_pem(path, "--sign-key")?;
        Self::from_pem(&text).map_err(|reason| FetchError::Read {
            what: "--sign-key",
            path: path.to_path_buf(),
            reason,
        })
    }

    /// The public half, for `--verify-key`.
    pub fn verify_key(&self) -> Result<VerifyKey, String> {
        let pem = self
            .0
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .map_err(|e| e.to_string())?;
        VerifyKey::from_pem(&pem)
    }

    /// The DER signature of `payload` (SHA-256, deterministic nonce), in base64.
    pub fn sign(&self, payload: &[u8]) -> String {
        let signature: Signature = self.0.sign(payload);
        base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes())
    }
}

fn read_pem(path: &Path, what: &'static str) -> Result<String, FetchError> {
    let bytes = crate::regular_file::read_input(path, what, KEY_FILE_LIMIT)?;
    String::from_utf8(bytes).map_err(|_| FetchError::Read {
        what,
        path: path.to_path_buf(),
        reason: "not PEM text (not UTF-8)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SignKey {
        SignKey::from_scalar(&[n; 32])
    }

    #[test]
    fn keys_are_read_from_the_pem_they_are_documented_as() {
        let signer = key(5);
        let pem = signer
            .0
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        assert!(VerifyKey::from_pem(&pem).is_ok());
        let private =
            p256::pkcs8::EncodePrivateKey::to_pkcs8_pem(&signer.0, p256::pkcs8::LineEnding::LF)
                .unwrap();
        assert!(SignKey::from_pem(&private).is_ok());
        let e = VerifyKey::from_pem(&private).unwrap_err();
        assert!(e.contains("PUBLIC KEY"), "{e}");
        let e = SignKey::from_pem(&pem).unwrap_err();
        assert!(e.contains("PKCS#8"), "{e}");
        let e = SignKey::from_pem("-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\nx\n").unwrap_err();
        assert!(e.contains("cosign-encrypted"), "{e}");
        let garbage = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(VerifyKey::from_pem(garbage).is_err());
    }
}
