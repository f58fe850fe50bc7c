//! One error type for the library. Each message starts with stable words scripts can match
//! (`checksum mismatch`, `not a Wasm module`, `HTTP 404`, `no such file`, ...); the CLI prints
//! it after the URL.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("checksum mismatch (expected sha256 {expected}, got {actual}): the module changed or the pin is wrong")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("not a Wasm module ({reason})")]
    NotWasm { reason: String },
    #[error("not an Envoy dynamic module for {platform} ({reason}); push a lib<name>.so built for that platform")]
    NotDynamicModule { platform: String, reason: String },
    #[error("not loadable by Envoy {envoy_version}: {reason}")]
    NotLoadable {
        envoy_version: String,
        reason: String,
    },
    #[error("Envoy admin {addr}: {reason}; check --envoy-admin names the admin address (HOST:PORT) of the Envoy served")]
    EnvoyAdmin { addr: String, reason: String },
    #[error("unsigned dynamic module refused: a dynamic module runs unsandboxed inside Envoy, so without the operator's verify key or keyless identity none is taken; set --verify-key (WASM_VERIFY_KEY) to its publisher's public key, or --trusted-root with --certificate-identity and --certificate-oidc-issuer to its publisher's identity, or pass --allow-unsigned-dynamic-modules to take it unsigned")]
    UnsignedDynamicModule,
    #[error("exceeds size limit of {limit} bytes (ISTIO_WASM_MAX_BINARY_SIZE_BYTES)")]
    TooLarge { limit: u64 },
    #[error("unsupported scheme {scheme:?}: use file://, http:// or https://")]
    UnsupportedScheme { scheme: String },
    #[error("invalid URL: {reason}")]
    BadUrl { reason: String },
    #[error("no such file: {path}")]
    NoSuchFile { path: PathBuf },
    #[error("HTTP {status}{}", if reason.is_empty() { String::new() } else { format!(" {reason}") })]
    HttpStatus { status: u16, reason: String },
    #[error(
        "timed out after {attempts} attempt(s) of {per_attempt:?} each (WASM_HTTP_REQUEST_TIMEOUT)"
    )]
    TimedOut {
        attempts: u32,
        per_attempt: std::time::Duration,
    },
    #[error("truncated download: got {got} of {expected} bytes")]
    Truncated { got: u64, expected: u64 },
    #[error("network error after {attempts} attempt(s): {message}")]
    Network { attempts: u32, message: String },
    #[error("cache error at {path}: {message}")]
    Cache { path: PathBuf, message: String },
    #[error("invalid setting {name}={value:?}: {reason}")]
    Setting {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("unauthorized: registry {registry} refused the credentials (or asked for some); pass --pull-secret with a Docker config JSON that has an entry for {registry}")]
    Unauthorized { registry: String },
    #[error("not found: {what}")]
    NotFound { what: String },
    #[error("unsupported layout: the image's layers have media types [{}]; accepted: one layer of application/wasm, application/vnd.wasm.content.layer.v1+wasm or application/vnd.module.wasm.content.layer.v1+wasm, Istio's 2-layer artifact, or an image whose last layer is a tar.gz holding plugin.wasm", a_few(found))]
    UnsupportedLayout { found: Vec<String> },
    #[error("not in cache: pull policy Never forbids fetching, and no cached module matches; pre-pull it with `wasm-fetcher pull` and policy IfNotPresent")]
    NotInCache,
    #[error("untrusted certificate from {host} ({detail}); pass --ca-file with the CA that signed it, or list {host} in WASM_INSECURE_REGISTRIES to skip verification")]
    UntrustedCertificate { host: String, detail: String },
    #[error("registry error: {message}")]
    Registry { message: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The address guard stopped a connection or a redirect before anything was sent.
    #[error(transparent)]
    Refused(#[from] crate::guard::Refusal),
    #[error("redirect without Location: {from} answered HTTP {status} and no Location header")]
    RedirectWithoutLocation { from: String, status: u16 },
    /// A manifest, index, token or other response read into memory was over its limit.
    #[error("exceeds size limit: the {what} is larger than {limit} bytes")]
    ResponseTooLarge { what: &'static str, limit: usize },
    #[error("too long: the server sent more than the {expected} bytes it declared")]
    TooLong { expected: u64 },
    #[error("unsafe bearer realm {realm:?}: {reason}")]
    UnsafeRealm { realm: String, reason: String },
    /// A local input (a `file://` module, `--pull-secret`, `--ca-file`, a bootstrap) that
    /// cannot be used as given.
    #[error("cannot read {what} {}: {reason}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// A verify key is set and the module's cosign signature is missing or refused.
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// The cache refused a write (read-only filesystem, no permission): it can still serve
    /// what it holds.
    #[error("cache error at {path}: cannot write ({message}); a cache this process cannot write serves only the modules it holds (--pull-policy Never)")]
    CacheReadOnly { path: PathBuf, message: String },
    /// A Docker credential helper (`credHelpers`, `credsStore`) gave no usable answer.
    #[error("credential helper {program}: {reason}")]
    CredentialHelper { program: String, reason: String },
}

/// At most a few items of a list that a server controls, and how many more there were.
fn a_few(items: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = items
        .iter()
        .take(SHOWN)
        .map(|s| s.chars().take(100).collect::<String>())
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(", and {} more", items.len() - SHOWN));
    }
    text
}

/// An error and all its sources on one line: reqwest and rustls put the useful part last.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

/// The TLS error inside a transport error, wherever the layers put it: hyper and tokio wrap it
/// in an `io::Error`, whose `source` skips what it holds.
pub fn tls_error_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let held = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    held.and_then(tls_error_in)
        .or_else(|| e.source().and_then(tls_error_in))
}

/// A certificate verification failure in an error chain, as its own error naming the way out.
pub fn untrusted_certificate(
    host: &str,
    e: &(dyn std::error::Error + 'static),
) -> Option<FetchError> {
    match tls_error_in(e)? {
        tls @ rustls::Error::InvalidCertificate(_) => Some(FetchError::UntrustedCertificate {
            host: host.to_string(),
            detail: tls.to_string(),
        }),
        _ => None,
    }
}

/// Why a module's signature was refused. Each starts with `signature` and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature missing: {repository} has no cosign signature for {digest} (no Sigstore bundle among its referrers in {searched}, no manifest tagged {tag}); sign it with `wasm-fetcher push --sign-key` or `cosign sign --key`, or pull without a verify key")]
    Missing {
        repository: String,
        digest: String,
        /// Where referrers were looked for: the referrers API, or its fallback tag.
        searched: String,
        tag: String,
    },
    #[error("signature malformed: {tag}: {reason}; sign the module again (`wasm-fetcher push --sign-key` or `cosign sign --key`)")]
    Malformed { tag: String, reason: String },
    #[error("signature oversized: {tag}: the {what} is {size} bytes, over the limit of {limit}; a cosign signature is far smaller, so this is not one: sign the module again")]
    Oversized {
        tag: String,
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("signature wrong: no signature in {tag} verifies with the verify key {key} (signed with another key, or its payload altered); check --verify-key (WASM_VERIFY_KEY) names the signer's public key")]
    WrongKey { tag: String, key: String },
    #[error("signature for another image: {tag} is validly signed but names {signed}, not {digest}; the signature was copied from another image: sign this one")]
    OtherDigest {
        tag: String,
        signed: String,
        digest: String,
    },
    #[error("signature untrusted: {tag}: {reason}; the module is refused: sign it again, or, if it was signed through another Sigstore instance, give that instance's trusted root (--trusted-root, WASM_TRUSTED_ROOT)")]
    Untrusted { tag: String, reason: String },
    #[error("signature by another identity: {tag} is signed keyless by {found}, where the policy asks for {wanted}; check --certificate-identity and --certificate-oidc-issuer (or their -regexp forms, or the WasmPlugin's wasm-fetcher.dev/certificate-* annotations)")]
    OtherIdentity {
        tag: String,
        found: String,
        wanted: String,
    },
    #[error("signature cannot be checked: {url} is not oci://, and only an OCI registry holds a cosign signature; serve the module from a registry, or pin it by sha256 without a verify key")]
    NoLocation { url: String },
    #[error("signature cannot be checked under pull policy Never: the signature is in the registry, which Never does not reach; pull with IfNotPresent or Always")]
    Offline,
}
