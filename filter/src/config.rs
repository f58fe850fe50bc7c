//! The two configurations the module reads: the plugin's (`{"role": "<name>", ...role
//! fields}`, in `on_configure`) and the VM's (`vm_config.configuration`, in `on_vm_start`).
//! Unknown roles and unknown fields are errors, so a typo is caught when Envoy loads the
//! configuration (its canary rejects it) instead of silently doing nothing.

use serde::Deserialize;

use crate::body_ops::BodyOperation;
use crate::header_ops::HeaderOperation;
use crate::rate_limit::RateLimit;
use crate::stats::StatsConfig;
use crate::tcp_count::TcpCounter;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PluginConfig {
    HttpHeaderOperation(HeaderOperation),
    HttpBodyOperation(BodyOperation),
    TcpTotalDataSizeCounter(TcpCounter),
    RateLimit(RateLimit),
    StatsAggregator(StatsConfig),
}

impl PluginConfig {
    pub fn role(&self) -> &'static str {
        match self {
            Self::HttpHeaderOperation(_) => "http-header-operation",
            Self::HttpBodyOperation(_) => "http-body-operation",
            Self::TcpTotalDataSizeCounter(_) => "tcp-total-data-size-counter",
            Self::RateLimit(_) => "rate-limit",
            Self::StatsAggregator(_) => "stats-aggregator",
        }
    }

    /// Parses and validates; the error names the field and the problem in one line.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err("the plugin configuration is empty: expected JSON such as {\"role\": \"http-header-operation\", ...}".into());
        }
        let mut config: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        match &mut config {
            Self::HttpHeaderOperation(c) => c.validate()?,
            Self::HttpBodyOperation(c) => c.validate()?,
            Self::TcpTotalDataSizeCounter(_) => {}
            Self::RateLimit(c) => c.validate()?,
            Self::StatsAggregator(c) => c.validate()?,
        }
        Ok(config)
    }
}

/// Log levels as proxy-wasm numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

/// VM-wide settings, shared by every plugin of the VM (every plugin naming the same `vm_id`
/// and code must give the same `vm_config`, or Envoy starts a separate VM for it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Lines below this level are not even formatted.
    #[serde(default = "default_log_level")]
    pub log_level: LogLevel,
    /// The shared queue HTTP streams put stats records on and the aggregator drains.
    #[serde(default = "default_queue_name")]
    pub queue_name: String,
    /// Prepended to every shared-data key, so two modules sharing a `vm_id` cannot collide.
    #[serde(default = "default_prefix")]
    pub shared_data_prefix: String,
}

fn default_log_level() -> LogLevel {
    LogLevel::Info
}
fn default_queue_name() -> String {
    "wasm-filter.stats".into()
}
fn default_prefix() -> String {
    "wasm-filter/".into()
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            log_level: default_log_level(),
            queue_name: default_queue_name(),
            shared_data_prefix: default_prefix(),
        }
    }
}

impl VmConfig {
    /// An empty configuration means the defaults (most deployments set none).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let config: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if config.queue_name.is_empty() {
            return Err("queue_name: must not be empty".into());
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_role() {
        let c = PluginConfig::parse(
            br#"{"role":"http-header-operation","request":{"remove":["X-A"]}}"#,
        )
        .unwrap();
        assert_eq!(c.role(), "http-header-operation");
        for role in [
            "http-body-operation",
            "tcp-total-data-size-counter",
            "stats-aggregator",
        ] {
            let c = PluginConfig::parse(format!(r#"{{"role":"{role}"}}"#).as_bytes()).unwrap();
            assert_eq!(c.role(), role);
        }
    }

    #[test]
    fn rejects_empty_unknown_role_and_unknown_field() {
        assert!(PluginConfig::parse(b"  ").unwrap_err().contains("empty"));
        assert!(PluginConfig::parse(br#"{"role":"nope"}"#)
            .unwrap_err()
            .contains("unknown variant `nope`"));
        let e =
            PluginConfig::parse(br#"{"role":"http-header-operation","reqest":{}}"#).unwrap_err();
        assert!(e.contains("unknown field `reqest`"), "{e}");
        let e = PluginConfig::parse(br#"{"role":"http-header-operation","request":{"sett":[]}}"#)
            .unwrap_err();
        assert!(e.contains("unknown field `sett`"), "{e}");
        let e =
            PluginConfig::parse(br#"{"role":"tcp-total-data-size-counter","x":1}"#).unwrap_err();
        assert!(e.contains("unknown field `x`"), "{e}");
        assert!(PluginConfig::parse(b"{not json")
            .unwrap_err()
            .contains("key must be a string"));
    }

    #[test]
    fn vm_config_defaults_and_errors() {
        assert_eq!(VmConfig::parse(b"").unwrap(), VmConfig::default());
        let c = VmConfig::parse(br#"{"log_level":"warn","queue_name":"q"}"#).unwrap();
        assert_eq!(c.log_level, LogLevel::Warn);
        assert_eq!(c.queue_name, "q");
        assert_eq!(c.shared_data_prefix, "wasm-filter/");
        let e = VmConfig::parse(br#"{"log_levl":"warn"}"#).unwrap_err();
        assert!(e.contains("unknown field `log_levl`"), "{e}");
        let e = VmConfig::parse(br#"{"log_level":"loud"}"#).unwrap_err();
        assert!(e.contains("unknown variant `loud`"), "{e}");
        let e = VmConfig::parse(br#"{"queue_name":""}"#).unwrap_err();
        assert!(e.contains("queue_name"), "{e}");
        assert!(VmConfig::parse(b"[").is_err());
    }
}
