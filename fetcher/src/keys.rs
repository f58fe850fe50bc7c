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
        let key =
            VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| {
                match public_key_kind(text.trim()) {
                    Some(kind) => format!("{kind}: {ONLY_P256}"),
                    None => format!("not a PEM public key ({e}): {ONLY_P256}"),
                }
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

    /// SHA-256 of the key's SPKI DER: a bundle's `publicKey.hint`, a log's key id.
    pub fn spki_sha256(&self) -> [u8; 32] {
        let der = self.key.to_public_key_der();
        der.map(|d| crate::digest::Sha256::of(d.as_bytes()).0)
            .unwrap_or_default()
    }

    /// `sha256:` and the full hex of [`Self::spki_sha256`]: how the index remembers the key.
    pub fn spki_id(&self) -> String {
        format!("sha256:{}", crate::digest::Sha256(self.spki_sha256()).hex())
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
            .map_err(|e| match private_key_kind(text.trim()) {
                Some(kind) => format!("{kind}: only ECDSA P-256 keys sign"),
                None => format!("not a PEM PKCS#8 private key ({e}): only ECDSA P-256 keys sign"),
            })
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

/// Which keys verify, as messages say it.
const ONLY_P256: &str =
    "only ECDSA P-256 keys (as cosign.pub) are verified; Ed25519, RSA and other curves are not";

/// What key a PEM `PUBLIC KEY` holds, in words with its algorithm OID, when it is a
/// well-formed SubjectPublicKeyInfo: what a refusal reports (the key given, not the one wanted).
fn public_key_kind(pem: &str) -> Option<String> {
    use p256::pkcs8::der::{Decode, Document};
    let (_, doc) = Document::from_pem(pem).ok()?;
    let spki = p256::pkcs8::spki::SubjectPublicKeyInfoRef::from_der(doc.as_bytes()).ok()?;
    Some(kind_in_words(&spki.algorithm))
}

/// [`public_key_kind`] for a PEM PKCS#8 `PRIVATE KEY`.
fn private_key_kind(pem: &str) -> Option<String> {
    use p256::pkcs8::der::{Decode, Document};
    let (_, doc) = Document::from_pem(pem).ok()?;
    let info = p256::pkcs8::PrivateKeyInfo::from_der(doc.as_bytes()).ok()?;
    Some(kind_in_words(&info.algorithm))
}

fn kind_in_words(alg: &p256::pkcs8::spki::AlgorithmIdentifierRef<'_>) -> String {
    let oid = alg.oid.to_string();
    let name = match oid.as_str() {
        "1.2.840.10045.2.1" => {
            let curve = alg.parameters_oid().map(|c| c.to_string()).ok();
            return match curve.as_deref() {
                Some("1.2.840.10045.3.1.7") => "an ECDSA P-256 key that does not decode".into(),
                Some("1.3.132.0.34") => "an ECDSA P-384 key (curve OID 1.3.132.0.34)".into(),
                Some("1.3.132.0.35") => "an ECDSA P-521 key (curve OID 1.3.132.0.35)".into(),
                Some("1.3.132.0.10") => "an ECDSA secp256k1 key (curve OID 1.3.132.0.10)".into(),
                Some(c) => format!("an EC key on curve OID {c}"),
                None => "an EC key without a named curve".into(),
            };
        }
        "1.3.101.112" => "an Ed25519 key",
        "1.3.101.113" => "an Ed448 key",
        "1.2.840.113549.1.1.1" => "an RSA key",
        "1.2.840.113549.1.1.10" => "an RSA-PSS key",
        _ => "a key of another kind",
    };
    format!("{name} (algorithm OID {oid})")
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

    /// A key of the wrong type is named as given (its algorithm OID, not P-256's), and the
    /// message says which keys are verified.
    #[test]
    fn a_wrong_key_type_is_reported_as_the_key_given() {
        let ed25519 = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEANKhKhGlyqBXN8vY2GSs3UL5WAMEz+Q9WIhFoNikwUco=\n-----END PUBLIC KEY-----\n";
        let rsa = "-----BEGIN PUBLIC KEY-----\nMIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQC/6tQlrMXvGHZMa0rcr0hyA4iw\nywizlUSXG1SEDcNcFusnQvhfywKAnqHdtrKrKFDKMYIq1ZU2rYIbmMzWqf1BoVhM\nzu7OA10jDhO5EDe+rG5Ko1F3j21FSb1k7jCkVEJFxRYyE8agKhmo2z0fWhcM3GrZ\nfnUyiuMc3ABg89LZDwIDAQAB\n-----END PUBLIC KEY-----\n";
        let p384 = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAE4/WZEqWVQA8+Tko1VUNFFdcXGt8/IRUR\nMprGQyMR/kv0FuGUbJTwcoNGqdwstUwR+N+mK81HYuZc8JZX1J52qw18iuumPANh\nmoeilOPqIhvP/tzSs9WK3Jo4MmKuPvv/\n-----END PUBLIC KEY-----\n";
        for (pem, words, oid) in [
            (ed25519, "an Ed25519 key", "1.3.101.112"),
            (rsa, "an RSA key", "1.2.840.113549.1.1.1"),
            (p384, "an ECDSA P-384 key", "1.3.132.0.34"),
        ] {
            let e = VerifyKey::from_pem(pem).unwrap_err();
            assert!(e.contains(words) && e.contains(oid), "{e}");
            assert!(!e.contains("1.2.840.10045.3.1.7"), "the wanted OID: {e}");
            assert!(e.contains("only ECDSA P-256 keys"), "{e}");
        }
        let ed_private = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIL1uqouT0EyJXJmdHpzUeo7Z77XVe93Z4qGdVC5V9Xkq\n-----END PRIVATE KEY-----\n";
        let e = SignKey::from_pem(ed_private).unwrap_err();
        assert!(
            e.contains("an Ed25519 key (algorithm OID 1.3.101.112)"),
            "{e}"
        );
    }
}
