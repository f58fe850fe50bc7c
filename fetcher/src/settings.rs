//! Settings from the environment, with Istio's names and defaults. Durations use Go's syntax
//! (`90s`, `1.5h`, `1h30m`, `500ms`) because these variables are shared with Istio's agent,
//! and a zero duration means what it means to Istio's agent: `WASM_HTTP_REQUEST_TIMEOUT=0` is
//! 5s (its HTTP fetcher's fallback), `WASM_MODULE_EXPIRY=0` is 24h and `WASM_PURGE_INTERVAL=0`
//! is 1h (its defaults).

use std::time::Duration;

use crate::error::FetchError;

#[derive(Debug, Clone)]
pub struct Settings {
    /// `WASM_HTTP_REQUEST_TIMEOUT`: each HTTP attempt (0 means 5s, as in Istio).
    pub http_timeout: Duration,
    /// `WASM_HTTP_REQUEST_MAX_RETRIES`: the number of attempts.
    pub http_attempts: u32,
    /// `ISTIO_WASM_MAX_BINARY_SIZE_BYTES`.
    pub max_size: u64,
    /// `WASM_MODULE_EXPIRY`: a module unused this long is purged (0 means the default, 24h).
    pub module_expiry: Duration,
    /// `WASM_PURGE_INTERVAL`: how often a long-running fetcher purges, and how old a temp file
    /// must be before `purge` takes it for a leftover (0 means the default, 1h).
    pub purge_interval: Duration,
    /// `WASM_INSECURE_REGISTRIES`: `host:port` entries, or `*` for all.
    pub insecure_registries: Vec<String>,
    /// Extra trusted roots (`--ca-file`).
    pub extra_roots: Vec<oci_client::client::Certificate>,
    /// `BLOCKED_CIDRS_IN_WASM_FETCH`: ranges refused beside the always-refused link-local and
    /// cloud metadata addresses (`crate::guard`).
    pub blocked_cidrs: Vec<ipnet::IpNet>,
    /// `--allow-foreign-layers`: fetch an image layer from the `urls` its descriptor lists
    /// (through the same guard) before asking the registry. Off: those URLs are never used.
    pub allow_foreign_layers: bool,
    /// `WASM_CACHE_MAX_BYTES`: a purge evicts the least recently used modules no current
    /// config names until the cache's modules fit (unset: no cap).
    pub cache_max_bytes: Option<u64>,
    /// `WASM_VERIFY_KEY` (a PEM public key file) or `--verify-key`: every module must carry a
    /// cosign signature by this key (`crate::oci::cosign`).
    pub verify_key: Option<crate::keys::VerifyKey>,
    /// `WASM_TRUSTED_ROOT` or `--trusted-root`: the Sigstore trusted root keyless signatures
    /// are checked against, the operator's and a WasmPlugin's identity alike.
    pub trusted_root: Option<std::sync::Arc<crate::keyless::TrustedRoot>>,
    /// `WASM_CERTIFICATE_IDENTITY` and `WASM_CERTIFICATE_OIDC_ISSUER` (or their `_REGEXP`
    /// forms, or the flags): every module must carry a keyless signature by this identity.
    /// Checked under `trusted_root`, which a pull attaches: the root may come from a flag
    /// after the environment named the identity.
    pub verify_identity: Option<crate::keyless::IdentityPolicy>,
    /// `WASM_IMAGE_VOLUME_ROOT` or `--image-volume-root`: `oci://` modules are the image
    /// volumes the kubelet mounted under this directory (`crate::pull::source::image_volume`), read
    /// in place (or copied, with `copy_image_volumes`); no registry is asked.
    pub image_volume_root: Option<std::path::PathBuf>,
    /// `serve --copy-image-volumes`: a module read from an image volume is copied into the
    /// cache, which an Envoy in another pod reads, instead of being named in place.
    pub copy_image_volumes: bool,
    /// `WASM_REGISTRY_CONFIG_DIR` or `--registry-config-dir`: containerd's hosts directory
    /// (`DIR/<host>/hosts.toml`), the mirrors to pull through (`crate::oci::hosts`).
    pub registry_config_dir: Option<std::path::PathBuf>,
    /// `--allow-unsigned-dynamic-modules`: without a verify key, a dynamic module is taken
    /// unsigned. Off, a dynamic module is refused unless a verify key checks its signature.
    pub allow_unsigned_dynamic_modules: bool,
    /// `serve --recheck-credentials`: a cached `oci://` module is handed over only once the
    /// registry accepted the asking plugin's credentials for it (`crate::pull::recheck`).
    pub recheck_credentials: bool,
    /// A client certificate and its key (PEM) presented on TLS: a hosts.toml host's `client`,
    /// set for that host alone (`crate::oci::hosts::settings_for`).
    pub client_identity: Option<Vec<u8>>,
}

impl Settings {
    /// Trusts the PEM certificates in `pem` for HTTPS sources and registries. PEM holding no
    /// certificate is refused: trusting nothing new while the user believes otherwise would
    /// surface later as an unexplained TLS failure. Returns how many certificates it holds.
    pub fn add_ca_pem(&mut self, pem: Vec<u8>) -> Result<usize, String> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut count = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            cert.map_err(|e| format!("not PEM ({e})"))?;
            count += 1;
        }
        if count == 0 {
            return Err(
                "no certificate in it (expected PEM blocks: -----BEGIN CERTIFICATE-----)".into(),
            );
        }
        self.extra_roots.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: pem,
        });
        Ok(count)
    }

    /// [`Self::add_ca_pem`] with the PEM of `--ca-file` at `path` (a regular file of at most
    /// 4 MiB).
    pub fn add_ca_file(&mut self, path: &std::path::Path) -> Result<usize, FetchError> {
        use crate::regular_file::{read_input, CA_FILE_LIMIT};
        let pem = read_input(path, "--ca-file", CA_FILE_LIMIT)?;
        self.add_ca_pem(pem).map_err(|reason| FetchError::Read {
            what: "--ca-file",
            path: path.to_path_buf(),
            reason,
        })
    }

    pub fn is_insecure_registry(&self, registry: &str) -> bool {
        self.insecure_registries
            .iter()
            .any(|r| r == "*" || r == registry)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            http_timeout: Duration::from_secs(15),
            http_attempts: 5,
            max_size: 256 << 20,
            module_expiry: Duration::from_secs(24 * 3600),
            purge_interval: Duration::from_secs(3600),
            insecure_registries: Vec::new(),
            extra_roots: Vec::new(),
            blocked_cidrs: Vec::new(),
            allow_foreign_layers: false,
            cache_max_bytes: None,
            verify_key: None,
            trusted_root: None,
            verify_identity: None,
            image_volume_root: None,
            copy_image_volumes: false,
            registry_config_dir: None,
            allow_unsigned_dynamic_modules: false,
            recheck_credentials: false,
            client_identity: None,
        }
    }
}

impl Settings {
    pub fn from_env() -> Result<Self, FetchError> {
        let mut s = Self::default();
        let defaults = Self::default();
        for (name, slot, if_zero) in [
            (
                "WASM_HTTP_REQUEST_TIMEOUT",
                &mut s.http_timeout,
                HTTP_TIMEOUT_IF_ZERO,
            ),
            (
                "WASM_MODULE_EXPIRY",
                &mut s.module_expiry,
                defaults.module_expiry,
            ),
            (
                "WASM_PURGE_INTERVAL",
                &mut s.purge_interval,
                defaults.purge_interval,
            ),
        ] {
            if let Some(v) = var(name) {
                let d = wasm_common::duration::parse(&v).map_err(|reason| FetchError::Setting {
                    name,
                    value: v.clone(),
                    reason,
                })?;
                *slot = if d.is_zero() { if_zero } else { d };
            }
        }
        if let Some(v) = var("WASM_HTTP_REQUEST_MAX_RETRIES") {
            s.http_attempts = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| FetchError::Setting {
                    name: "WASM_HTTP_REQUEST_MAX_RETRIES",
                    value: v.clone(),
                    reason: "expected a positive whole number of attempts".into(),
                })?;
        }
        if let Some(v) = var("ISTIO_WASM_MAX_BINARY_SIZE_BYTES") {
            s.max_size = v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| FetchError::Setting {
                    name: "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
                    value: v.clone(),
                    reason: "expected a positive number of bytes".into(),
                })?;
        }
        if let Some(v) = var("WASM_CACHE_MAX_BYTES") {
            s.cache_max_bytes = Some(v.trim().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(
                || FetchError::Setting {
                    name: "WASM_CACHE_MAX_BYTES",
                    value: v.clone(),
                    reason: "expected a positive number of bytes (unset it for no cap)".into(),
                },
            )?);
        }
        if let Some(v) = var("BLOCKED_CIDRS_IN_WASM_FETCH") {
            s.blocked_cidrs =
                crate::guard::parse_cidrs(&v).map_err(|reason| FetchError::Setting {
                    name: "BLOCKED_CIDRS_IN_WASM_FETCH",
                    value: v.clone(),
                    reason,
                })?;
        }
        if let Some(v) = var("WASM_INSECURE_REGISTRIES") {
            s.insecure_registries = v
                .split(',')
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty())
                .collect();
        }
        if let Some(v) = var("WASM_VERIFY_KEY").filter(|v| !v.is_empty()) {
            s.verify_key = Some(crate::keys::VerifyKey::read(v.as_ref(), "WASM_VERIFY_KEY")?);
        }
        if let Some(v) = var("WASM_TRUSTED_ROOT") {
            s.trusted_root = Some(std::sync::Arc::new(crate::keyless::TrustedRoot::read(
                v.as_ref(),
                "WASM_TRUSTED_ROOT",
            )?));
        }
        let env = ENV_POLICY.map(var);
        let names = crate::keyless::PolicyNames {
            identity: env[0].as_deref(),
            identity_regexp: env[1].as_deref(),
            issuer: env[2].as_deref(),
            issuer_regexp: env[3].as_deref(),
        };
        s.verify_identity = names
            .policy(ENV_POLICY)
            .map_err(|reason| FetchError::Setting {
                name: "WASM_CERTIFICATE_IDENTITY",
                value: names
                    .identity
                    .or(names.identity_regexp)
                    .unwrap_or("")
                    .to_string(),
                reason,
            })?;
        if let Some(v) = var("WASM_IMAGE_VOLUME_ROOT") {
            s.image_volume_root = Some(v.into());
        }
        if let Some(v) = var("WASM_REGISTRY_CONFIG_DIR") {
            s.registry_config_dir = Some(v.into());
        }
        Ok(s)
    }
}

/// The environment's names for cosign's four identity flags.
const ENV_POLICY: [&str; 4] = [
    "WASM_CERTIFICATE_IDENTITY",
    "WASM_CERTIFICATE_IDENTITY_REGEXP",
    "WASM_CERTIFICATE_OIDC_ISSUER",
    "WASM_CERTIFICATE_OIDC_ISSUER_REGEXP",
];

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What Istio's HTTP fetcher uses when `WASM_HTTP_REQUEST_TIMEOUT` is 0 (not the 15s default).
pub const HTTP_TIMEOUT_IF_ZERO: Duration = Duration::from_secs(5);

/// `--timeout`: a Go duration that leaves the pull some time. Istio treats a zero timeout as a
/// deadline already passed, which could only ever fail, so 0 is refused here.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = wasm_common::duration::parse(s)?;
    if d.is_zero() {
        return Err("a zero timeout would expire before the pull starts; give a positive duration such as 30s".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_a_positive_go_duration() {
        assert_eq!(parse_timeout("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_timeout("0").unwrap_err().contains("zero"));
        assert!(parse_timeout("10").unwrap_err().contains("missing unit"));
    }

    mod properties {
        use crate::alloc_meter::allocated_by;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any text at all: an answer, never a panic, and an error that does not grow
            /// with the input.
            #[test]
            fn any_text_gets_an_answer(s in "\\PC{0,80}") {
                let (parsed, bytes) = allocated_by(|| wasm_common::duration::parse(&s));
                if let Err(e) = parsed {
                    prop_assert!(e.len() <= 100, "{e}");
                }
                // The most a refusal quotes is 8 characters of an unknown unit, escaped (up to
                // 10 bytes each), built up in growing strings: well under 512 bytes whatever
                // the input's length.
                prop_assert!(bytes <= 512, "{bytes} bytes allocated for {s:?}");
            }
        }
    }
}
