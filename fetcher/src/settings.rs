//! Settings from the environment, with Istio's names and defaults. Durations use Go's syntax
//! (`90s`, `1.5h`, `1h30m`, `500ms`) because these variables are shared with Istio's agent.

use std::time::Duration;

use crate::error::FetchError;

#[derive(Debug, Clone)]
pub struct Settings {
    /// `WASM_HTTP_REQUEST_TIMEOUT`: each HTTP attempt.
    pub http_timeout: Duration,
    /// `WASM_HTTP_REQUEST_MAX_RETRIES`: the number of attempts.
    pub http_attempts: u32,
    /// `ISTIO_WASM_MAX_BINARY_SIZE_BYTES`.
    pub max_size: u64,
    /// `WASM_MODULE_EXPIRY`: a module unused this long is purged.
    pub module_expiry: Duration,
    /// `WASM_PURGE_INTERVAL`: how often a long-running fetcher purges.
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
}

impl Settings {
    /// Trusts the PEM certificates of `--ca-file` for HTTPS sources and registries.
    pub fn add_ca_pem(&mut self, pem: Vec<u8>) {
        self.extra_roots.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: pem,
        });
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
        }
    }
}

impl Settings {
    pub fn from_env() -> Result<Self, FetchError> {
        let mut s = Self::default();
        if let Some(v) = var("WASM_HTTP_REQUEST_TIMEOUT") {
            s.http_timeout = parse_duration(&v).map_err(|reason| FetchError::Setting {
                name: "WASM_HTTP_REQUEST_TIMEOUT",
                value: v.clone(),
                reason,
            })?;
        }
        for (name, slot) in [
            ("WASM_MODULE_EXPIRY", &mut s.module_expiry),
            ("WASM_PURGE_INTERVAL", &mut s.purge_interval),
        ] {
            if let Some(v) = var(name) {
                *slot = parse_duration(&v).map_err(|reason| FetchError::Setting {
                    name,
                    value: v.clone(),
                    reason,
                })?;
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
        Ok(s)
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers with units ns, us (µs), ms, s, m, h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: missing unit (use ns, us, ms, s, m or h)"))?;
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?}: invalid number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per = match &rest[..unit_len] {
            "ns" => 1e0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            u => {
                return Err(format!(
                    "{s:?}: unknown unit {u:?} (use ns, us, ms, s, m or h)"
                ))
            }
        };
        total += number * nanos_per;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("10").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
    }
}
