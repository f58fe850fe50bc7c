//! `serve`'s counters, in Prometheus text with the names Istio's agent uses
//! (`pkg/wasm/monitoring.go`), so a dashboard written for Istio reads them. Istio's agent
//! exports them with its exporter's `istio_agent_` namespace in front
//! (`istio_agent_wasm_remote_fetch_count`); that prefix belongs to the agent, not to the metric,
//! so names here are bare unless `--metrics-prefix istio_agent_` asks for Istio's spelling.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::FetchError;

/// `wasm_remote_fetch_count{result}`: how a fetch that went to the network ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchResult {
    Success,
    /// The module's bytes could not be downloaded (HTTP error, blob error, truncated body).
    DownloadFailure,
    /// The registry did not give a usable manifest (Istio: `PrepareFetch` failed).
    ManifestFailure,
    ChecksumMismatched,
    /// What arrived is not a Wasm module.
    FetchFailure,
}

impl FetchResult {
    const ALL: [Self; 5] = [
        Self::Success,
        Self::DownloadFailure,
        Self::ManifestFailure,
        Self::ChecksumMismatched,
        Self::FetchFailure,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::DownloadFailure => "download_failure",
            Self::ManifestFailure => "manifest_failure",
            Self::ChecksumMismatched => "checksum_mismatched",
            Self::FetchFailure => "fetch_failure",
        }
    }

    /// Istio's classification of a failed fetch from `oci` or another source.
    pub fn of_error(e: &FetchError, oci: bool) -> Self {
        match e {
            FetchError::ChecksumMismatch { .. } => Self::ChecksumMismatched,
            FetchError::NotWasm { .. }
            | FetchError::NotDynamicModule { .. }
            | FetchError::NotLoadable { .. } => Self::FetchFailure,
            FetchError::Unauthorized { .. }
            | FetchError::NotFound { .. }
            | FetchError::Registry { .. }
            | FetchError::UnsupportedLayout { .. }
            | FetchError::UntrustedCertificate { .. }
                if oci =>
            {
                Self::ManifestFailure
            }
            _ => Self::DownloadFailure,
        }
    }
}

/// `wasm_config_conversion_count{result}`: how turning one WasmPlugin into an ECDS file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversionResult {
    Success,
    /// The resource could not be read as a WasmPlugin.
    UnmarshalFailure,
    /// The ECDS resource could not be written.
    MarshalFailure,
    /// The module could not be had: the plugin's fallback was written instead.
    FetchFailure,
}

impl ConversionResult {
    const ALL: [Self; 4] = [
        Self::Success,
        Self::UnmarshalFailure,
        Self::MarshalFailure,
        Self::FetchFailure,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::UnmarshalFailure => "unmarshal_failure",
            Self::MarshalFailure => "marshal_failure",
            Self::FetchFailure => "fetch_failure",
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    prefix: String,
    cache_entries: AtomicU64,
    /// `[miss, hit]`.
    lookups: [AtomicU64; 2],
    fetches: [AtomicU64; FetchResult::ALL.len()],
    conversions: [AtomicU64; ConversionResult::ALL.len()],
}

impl Metrics {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            ..Self::default()
        }
    }

    pub fn set_cache_entries(&self, n: usize) {
        self.cache_entries.store(n as u64, Relaxed);
    }

    pub fn lookup(&self, hit: bool) {
        self.lookups[usize::from(hit)].fetch_add(1, Relaxed);
    }

    pub fn fetch(&self, result: FetchResult) {
        self.fetches[result as usize].fetch_add(1, Relaxed);
    }

    pub fn conversion(&self, result: ConversionResult) {
        self.conversions[result as usize].fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition (format 0.0.4). Every label value is written from the
    /// start, zeros included, so a rate over a counter that has not moved yet still works.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.family(
            &mut out,
            ("wasm_cache_entries", "gauge"),
            "number of Wasm modules in the local cache",
            [("", self.cache_entries.load(Relaxed))],
        );
        self.family(
            &mut out,
            ("wasm_cache_lookup_count", "counter"),
            "number of cache lookups, by whether they hit",
            ["false", "true"]
                .iter()
                .zip(&self.lookups)
                .map(|(hit, n)| (format!("hit=\"{hit}\""), n.load(Relaxed))),
        );
        self.family(
            &mut out,
            ("wasm_remote_fetch_count", "counter"),
            "number of remote module fetches, by result",
            FetchResult::ALL
                .iter()
                .zip(&self.fetches)
                .map(|(r, n)| (format!("result=\"{}\"", r.label()), n.load(Relaxed))),
        );
        self.family(
            &mut out,
            ("wasm_config_conversion_count", "counter"),
            "number of WasmPlugin conversions, by result",
            ConversionResult::ALL
                .iter()
                .zip(&self.conversions)
                .map(|(r, n)| (format!("result=\"{}\"", r.label()), n.load(Relaxed))),
        );
        out
    }

    /// One metric: its HELP and TYPE lines, then a sample per label set (`""` for none).
    fn family<L: std::fmt::Display>(
        &self,
        out: &mut String,
        (name, kind): (&str, &str),
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) {
        let p = &self.prefix;
        let _ = writeln!(out, "# HELP {p}{name} {help}\n# TYPE {p}{name} {kind}");
        for (labels, value) in samples {
            let labels = labels.to_string();
            if labels.is_empty() {
                let _ = writeln!(out, "{p}{name} {value}");
            } else {
                let _ = writeln!(out, "{p}{name}{{{labels}}} {value}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_istios_names_and_every_label() {
        let m = Metrics::new("");
        m.set_cache_entries(2);
        m.lookup(true);
        m.lookup(false);
        m.lookup(false);
        m.fetch(FetchResult::ChecksumMismatched);
        m.conversion(ConversionResult::FetchFailure);
        let text = m.render();
        for line in [
            "wasm_cache_entries 2",
            "wasm_cache_lookup_count{hit=\"true\"} 1",
            "wasm_cache_lookup_count{hit=\"false\"} 2",
            "wasm_remote_fetch_count{result=\"checksum_mismatched\"} 1",
            "wasm_remote_fetch_count{result=\"success\"} 0",
            "wasm_config_conversion_count{result=\"fetch_failure\"} 1",
            "# TYPE wasm_cache_entries gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let istio = Metrics::new("istio_agent_").render();
        assert!(istio.contains("\nistio_agent_wasm_remote_fetch_count{result=\"success\"} 0"));
    }
}
