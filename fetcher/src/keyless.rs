//! Keyless trust as the operator pins it: a Sigstore trusted root (`trusted_root.json`, the
//! public instance's or a private one's) and the identity a module's signing certificate must
//! name (issuer plus subject, exact or by pattern, as cosign's `--certificate-identity[-regexp]`
//! and `--certificate-oidc-issuer[-regexp]`). What is checked against lives here, read and
//! bounded as `keys` reads a verify key; the checking is `oci::cosign::keyless`'s. Nothing here
//! reaches a network: the root is the file, and no TUF repository is consulted.

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use serde::Deserialize;

use crate::digest::Sha256;
use crate::error::FetchError;
use crate::shown::shown;

/// A trusted root is a few KiB (the public instance's, with every rotated key, is about 10).
pub const TRUSTED_ROOT_LIMIT: u64 = 1 << 20;
/// The trusted-root media types read. The protobuf spec names a v0.2 too; the Go and Python
/// clients take only v0.1, and so does this.
pub const TRUSTED_ROOT_MEDIA_TYPE: &str =
    "application/vnd.dev.sigstore.trustedroot+json;version=0.1";
/// Logs, CT logs and CAs in one root (the public root lists a handful of each).
const ENTRIES_LIMIT: usize = 64;
/// Certificates in one CA's chain.
const CHAIN_LIMIT: usize = 8;
/// A regular expression compiles within this many bytes of program: a policy is a line.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// A log's or a CT log's key, with the id entries name it by and the time it may be used.
#[derive(Clone)]
pub struct LogKey {
    /// `logId.keyId`: SHA-256 of the key's DER SubjectPublicKeyInfo for Rekor v1 and CT.
    pub id: [u8; 32],
    pub key: PublicKey,
    pub window: Window,
}

/// A public key from a trusted root: ECDSA on P-256 or P-384, or Ed25519, which is what
/// Sigstore's logs, CT logs and signing keys use (`keyDetails` of the protobuf spec).
#[derive(Clone)]
pub struct PublicKey {
    alg: KeyAlg,
    /// The subjectPublicKey bits: the EC point or the Ed25519 key.
    point: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyAlg {
    P256,
    P384,
    Ed25519,
}

/// The hash an ECDSA signature was made over (Ed25519 has its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl PublicKey {
    /// A DER SubjectPublicKeyInfo.
    pub fn from_spki(der: &[u8]) -> Result<Self, String> {
        use p256::pkcs8::der::Decode;
        let spki = p256::pkcs8::spki::SubjectPublicKeyInfoRef::from_der(der)
            .map_err(|e| format!("not a DER SubjectPublicKeyInfo ({e})"))?;
        let oid = spki.algorithm.oid.to_string();
        let alg = match oid.as_str() {
            "1.2.840.10045.2.1" => match spki
                .algorithm
                .parameters_oid()
                .map(|c| c.to_string())
                .ok()
                .as_deref()
            {
                Some("1.2.840.10045.3.1.7") => KeyAlg::P256,
                Some("1.3.132.0.34") => KeyAlg::P384,
                other => {
                    return Err(format!(
                        "an EC key on curve {}, where P-256 and P-384 are read",
                        other.unwrap_or("(none named)")
                    ))
                }
            },
            "1.3.101.112" => KeyAlg::Ed25519,
            _ => {
                return Err(format!(
                    "a key of algorithm OID {oid}, where ECDSA P-256, P-384 and Ed25519 are read"
                ))
            }
        };
        let point = spki
            .subject_public_key
            .as_bytes()
            .ok_or("the key's bits are not whole bytes")?
            .to_vec();
        Ok(Self { alg, point })
    }

    /// Whether `signature` (DER for ECDSA) is this key's over `message`, hashed with `hash`.
    pub fn verifies(&self, hash: Hash, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature as s;
        let alg: &dyn s::VerificationAlgorithm = match (self.alg, hash) {
            (KeyAlg::P256, Hash::Sha256) => &s::ECDSA_P256_SHA256_ASN1,
            (KeyAlg::P256, Hash::Sha384) => &s::ECDSA_P256_SHA384_ASN1,
            (KeyAlg::P384, Hash::Sha256) => &s::ECDSA_P384_SHA256_ASN1,
            (KeyAlg::P384, Hash::Sha384) => &s::ECDSA_P384_SHA384_ASN1,
            (KeyAlg::Ed25519, _) => &s::ED25519,
        };
        s::UnparsedPublicKey::new(alg, &self.point)
            .verify(message, signature)
            .is_ok()
    }
}

/// A `validFor` window, in Unix seconds; an open end is unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub start: Option<i64>,
    pub end: Option<i64>,
}

impl Window {
    pub fn contains(&self, t: i64) -> bool {
        self.start.is_none_or(|s| s <= t) && self.end.is_none_or(|e| t <= e)
    }
}

/// A certificate authority (Fulcio): its chain, leaf-most first and the trust anchor last.
#[derive(Clone)]
pub struct Authority {
    pub uri: String,
    pub chain: Vec<Vec<u8>>,
    pub window: Window,
}

/// A parsed `trusted_root.json`.
#[derive(Clone)]
pub struct TrustedRoot {
    pub tlogs: Vec<LogKey>,
    pub ctlogs: Vec<LogKey>,
    pub authorities: Vec<Authority>,
    /// SHA-256 of the file: a policy's id changes with the root it trusts.
    digest: Sha256,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootFile {
    media_type: String,
    #[serde(default)]
    tlogs: Vec<LogFile>,
    #[serde(default)]
    certificate_authorities: Vec<CaFile>,
    #[serde(default)]
    ctlogs: Vec<LogFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogFile {
    public_key: KeyFile,
    log_id: LogIdFile,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyFile {
    raw_bytes: String,
    #[serde(default)]
    valid_for: Option<WindowFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdFile {
    key_id: String,
}

#[derive(Deserialize)]
struct WindowFile {
    start: Option<String>,
    end: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaFile {
    #[serde(default)]
    uri: String,
    cert_chain: ChainFile,
    #[serde(default)]
    valid_for: Option<WindowFile>,
}

#[derive(Deserialize)]
struct ChainFile {
    certificates: Vec<RawFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFile {
    raw_bytes: String,
}

fn b64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("{what} is not base64 ({e})"))
}

fn window(w: Option<&WindowFile>, what: &str) -> Result<Window, String> {
    let time = |t: Option<&String>, end: &str| -> Result<Option<i64>, String> {
        t.map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|d| d.timestamp())
                .map_err(|e| {
                    format!(
                        "{what}.validFor.{end} {:?} is not an RFC 3339 time ({e})",
                        shown(t)
                    )
                })
        })
        .transpose()
    };
    Ok(match w {
        Some(w) => Window {
            start: time(w.start.as_ref(), "start")?,
            end: time(w.end.as_ref(), "end")?,
        },
        None => Window::default(),
    })
}

fn log_keys(logs: &[LogFile], what: &str) -> Result<Vec<LogKey>, String> {
    if logs.is_empty() || logs.len() > ENTRIES_LIMIT {
        return Err(format!(
            "{what} lists {} keys, where 1 to {ENTRIES_LIMIT} are read",
            logs.len()
        ));
    }
    logs.iter()
        .enumerate()
        .map(|(i, l)| {
            let at = format!("{what}[{i}]");
            let der = b64(&l.public_key.raw_bytes, &format!("{at}.publicKey.rawBytes"))?;
            let key = PublicKey::from_spki(&der).map_err(|e| format!("{at}.publicKey: {e}"))?;
            let id: [u8; 32] = b64(&l.log_id.key_id, &format!("{at}.logId.keyId"))?
                .try_into()
                .map_err(|_| format!("{at}.logId.keyId is not 32 bytes"))?;
            Ok(LogKey {
                id,
                key,
                window: window(l.public_key.valid_for.as_ref(), &format!("{at}.publicKey"))?,
            })
        })
        .collect()
}

impl std::fmt::Debug for TrustedRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrustedRoot(sha256:{})", self.digest.hex())
    }
}

impl TrustedRoot {
    /// A `trusted_root.json`'s bytes; every key and certificate is decoded here, so a root
    /// that loads is one every check can use.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let file: RootFile = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a Sigstore trusted root ({})", shown(&e.to_string())))?;
        if file.media_type != TRUSTED_ROOT_MEDIA_TYPE {
            return Err(format!(
                "mediaType is {:?}, not {TRUSTED_ROOT_MEDIA_TYPE}",
                shown(&file.media_type)
            ));
        }
        let tlogs = log_keys(&file.tlogs, "tlogs")?;
        let ctlogs = log_keys(&file.ctlogs, "ctlogs")?;
        let cas = &file.certificate_authorities;
        if cas.is_empty() || cas.len() > ENTRIES_LIMIT {
            return Err(format!(
                "certificateAuthorities lists {}, where 1 to {ENTRIES_LIMIT} are read",
                cas.len()
            ));
        }
        let authorities = cas
            .iter()
            .enumerate()
            .map(|(i, ca)| {
                let at = format!("certificateAuthorities[{i}]");
                let certs = &ca.cert_chain.certificates;
                if certs.is_empty() || certs.len() > CHAIN_LIMIT {
                    return Err(format!(
                        "{at}.certChain holds {} certificates, where 1 to {CHAIN_LIMIT} are read",
                        certs.len()
                    ));
                }
                let chain = certs
                    .iter()
                    .enumerate()
                    .map(|(j, c)| {
                        let der = b64(&c.raw_bytes, &format!("{at}.certChain.certificates[{j}]"))?;
                        use x509_cert::der::Decode;
                        x509_cert::Certificate::from_der(&der).map_err(|e| {
                            format!(
                                "{at}.certChain.certificates[{j}] is not a DER certificate ({e})"
                            )
                        })?;
                        Ok(der)
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(Authority {
                    uri: ca.uri.clone(),
                    chain,
                    window: window(ca.valid_for.as_ref(), &at)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            tlogs,
            ctlogs,
            authorities,
            digest: Sha256::of(bytes),
        })
    }

    /// `--trusted-root` or `WASM_TRUSTED_ROOT`: a regular file of at most 1 MiB.
    pub fn read(path: &Path, what: &'static str) -> Result<Self, FetchError> {
        let bytes = crate::regular_file::read_input(path, what, TRUSTED_ROOT_LIMIT)?;
        Self::from_json(&bytes).map_err(|reason| FetchError::Read {
            what,
            path: path.to_path_buf(),
            reason: format!(
                "{reason}; give Sigstore's trusted_root.json (as `cosign trusted-root create` or the TUF repository's writes it)"
            ),
        })
    }
}

/// One side of an identity policy: a value that must be equal, or a pattern that must match
/// all of it (anchored, unlike cosign's Go `MatchString`, so `https://github.com/org/.*` cannot
/// be met by `https://evil.example/https://github.com/org/x`).
#[derive(Clone, Debug)]
pub enum Matcher {
    Exact(String),
    Pattern(regex::Regex),
}

impl Matcher {
    /// From a flag pair: exactly one of the value and the pattern.
    pub fn from_pair(
        exact: Option<&str>,
        pattern: Option<&str>,
        names: (&str, &str),
    ) -> Result<Self, String> {
        match (exact, pattern) {
            (Some(e), None) if !e.is_empty() => Ok(Self::Exact(e.to_string())),
            (None, Some(p)) => {
                // The pattern must stand alone before it is anchored: `a)|(?:.*` would
                // otherwise close the anchoring group and match anything.
                let build = |p: &str| {
                    regex::RegexBuilder::new(p)
                        .size_limit(PATTERN_SIZE_LIMIT)
                        .build()
                        .map_err(|e| {
                            format!(
                                "{} is not a regular expression ({})",
                                names.1,
                                shown(&e.to_string())
                            )
                        })
                };
                build(p)?;
                build(&format!("^(?:{p})$")).map(Self::Pattern)
            }
            (Some(_), Some(_)) => Err(format!("give {} or {}, not both", names.0, names.1)),
            _ => Err(format!("{} or {} is needed", names.0, names.1)),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Exact(_) => "exact",
            Self::Pattern(_) => "pattern",
        }
    }

    /// The value, or the pattern as given (without its anchors).
    fn text(&self) -> &str {
        match self {
            Self::Exact(e) => e,
            Self::Pattern(p) => {
                let s = p.as_str();
                s.strip_prefix("^(?:")
                    .and_then(|s| s.strip_suffix(")$"))
                    .unwrap_or(s)
            }
        }
    }

    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(e) => e == value,
            Self::Pattern(p) => p.is_match(value),
        }
    }
}

impl std::fmt::Display for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(e) => write!(f, "{:?}", shown(e)),
            Self::Pattern(_) => write!(f, "/{}/", shown(self.text())),
        }
    }
}

/// A keyless policy: who must have signed (issuer and subject), under which trusted root.
#[derive(Clone)]
pub struct Identity {
    pub root: Arc<TrustedRoot>,
    pub subject: Matcher,
    pub issuer: Matcher,
    /// `identity:sha256:` of the root and both matchers: what the index remembers.
    id: Arc<str>,
}

impl Identity {
    pub fn new(root: Arc<TrustedRoot>, subject: Matcher, issuer: Matcher) -> Self {
        // A JSON array, so no text inside a matcher can move a separator.
        let described = serde_json::json!([
            root.digest.hex(),
            subject.kind(),
            subject.text(),
            issuer.kind(),
            issuer.text(),
        ])
        .to_string();
        let id = format!("identity:sha256:{}", Sha256::of(described.as_bytes()).hex());
        Self {
            root,
            subject,
            issuer,
            id: id.into(),
        }
    }

    /// How the index and `--json` name this policy.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "subject {} issued by {}", self.subject, self.issuer)
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({self})")
    }
}

impl PartialEq for Identity {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

/// An identity policy as flags or environment variables name it (cosign's four flags).
#[derive(Debug, Default, Clone, Copy)]
pub struct PolicyNames<'a> {
    pub identity: Option<&'a str>,
    pub identity_regexp: Option<&'a str>,
    pub issuer: Option<&'a str>,
    pub issuer_regexp: Option<&'a str>,
}

/// The names a refusal quotes: the flags', or the environment's.
pub const FLAG_NAMES: [&str; 4] = [
    "--certificate-identity",
    "--certificate-identity-regexp",
    "--certificate-oidc-issuer",
    "--certificate-oidc-issuer-regexp",
];

impl PolicyNames<'_> {
    pub fn any(&self) -> bool {
        self.identity.is_some()
            || self.identity_regexp.is_some()
            || self.issuer.is_some()
            || self.issuer_regexp.is_some()
    }

    /// The policy these name; `None` when they name nothing. Both halves are needed: a
    /// subject without its issuer would take anyone who holds that name at any OIDC provider
    /// the CA trusts.
    pub fn policy(&self, names: [&str; 4]) -> Result<Option<IdentityPolicy>, String> {
        if !self.any() {
            return Ok(None);
        }
        Ok(Some(IdentityPolicy {
            subject: Matcher::from_pair(self.identity, self.identity_regexp, (names[0], names[1]))?,
            issuer: Matcher::from_pair(self.issuer, self.issuer_regexp, (names[2], names[3]))?,
        }))
    }
}

/// Why an identity without a trusted root cannot be checked.
pub fn no_root(root_name: &str) -> String {
    format!("a keyless identity is checked against a trusted root: give {root_name} (Sigstore's trusted_root.json)")
}

/// An identity without its trusted root: what a WasmPlugin names (the root stays the
/// operator's).
#[derive(Clone, Debug)]
pub struct IdentityPolicy {
    pub subject: Matcher,
    pub issuer: Matcher,
}

impl IdentityPolicy {
    pub fn under(&self, root: Arc<TrustedRoot>) -> Identity {
        Identity::new(root, self.subject.clone(), self.issuer.clone())
    }
}

impl PartialEq for IdentityPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.subject.to_string() == other.subject.to_string()
            && self.issuer.to_string() == other.issuer.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_the_whole_value_only() {
        let m = Matcher::from_pair(None, Some("https://github.com/org/.*"), ("a", "b")).unwrap();
        assert!(m.matches("https://github.com/org/repo/.github/workflows/x.yml@refs/heads/main"));
        assert!(!m.matches("https://evil.example/https://github.com/org/x"));
        assert_eq!(m.to_string(), "/https://github.com/org/.*/");
        let e = Matcher::from_pair(Some("x"), Some("y"), ("--a", "--b")).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = Matcher::from_pair(None, None, ("--a", "--b")).unwrap_err();
        assert!(e.contains("--a or --b is needed"), "{e}");
        let e = Matcher::from_pair(None, Some("("), ("--a", "--b")).unwrap_err();
        assert!(e.contains("--b is not a regular expression"), "{e}");
        // A pattern that would close the anchoring group is not one on its own.
        let e = Matcher::from_pair(None, Some("https://a/.*)|(?:.*"), ("--a", "--b")).unwrap_err();
        assert!(e.contains("--b is not a regular expression"), "{e}");
        let e = Matcher::from_pair(None, Some("x\n\u{1b}[31m("), ("--a", "--b")).unwrap_err();
        assert!(!e.contains('\u{1b}') && !e.contains('\n'), "{e:?}");
    }

    #[test]
    fn windows_are_inclusive_and_open_ends_unbounded() {
        let w = Window {
            start: Some(10),
            end: Some(20),
        };
        assert!(w.contains(10) && w.contains(20) && !w.contains(9) && !w.contains(21));
        assert!(Window::default().contains(i64::MIN));
    }

    #[test]
    fn a_root_that_is_not_one_says_what_is_wrong() {
        let e = TrustedRoot::from_json(b"{\"mediaType\":\"x\"}")
            .err()
            .unwrap();
        assert!(e.contains("mediaType"), "{e}");
        let e = TrustedRoot::from_json(b"[]").err().unwrap();
        assert!(e.contains("not a Sigstore trusted root"), "{e}");
        let empty = format!("{{\"mediaType\":\"{TRUSTED_ROOT_MEDIA_TYPE}\"}}");
        let e = TrustedRoot::from_json(empty.as_bytes()).err().unwrap();
        assert!(e.contains("tlogs lists 0 keys"), "{e}");
    }
}
