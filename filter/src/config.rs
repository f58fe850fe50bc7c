//! The two configurations the module reads: the plugin's (`{"role": "<name>", ...role
//! fields}`, in `on_configure`) and the VM's (`vm_config.configuration`, in `on_vm_start`).
//! Unknown roles and unknown fields are errors, so a typo is caught when Envoy loads the
//! configuration (its canary rejects it) instead of silently doing nothing.

use serde::Deserialize;

use crate::body_ops::BodyOperation;
use crate::de::{self, Entries};
use crate::header_ops::HeaderOperation;
use crate::rate_limit::RateLimit;
use crate::stats::StatsConfig;
use crate::tcp_count::TcpCounter;

pub use crate::de::MAX_CONFIG_BYTES;

/// The roles, in [`PluginConfig`]'s order.
const ROLES: [&str; 5] = [
    "http-header-operation",
    "http-body-operation",
    "tcp-total-data-size-counter",
    "rate-limit",
    "stats-aggregator",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginConfig {
    HttpHeaderOperation(HeaderOperation),
    HttpBodyOperation(BodyOperation),
    TcpTotalDataSizeCounter(TcpCounter),
    RateLimit(RateLimit),
    StatsAggregator(StatsConfig),
}

impl PluginConfig {
    pub fn role(&self) -> &'static str {
        let i = match self {
            Self::HttpHeaderOperation(_) => 0,
            Self::HttpBodyOperation(_) => 1,
            Self::TcpTotalDataSizeCounter(_) => 2,
            Self::RateLimit(_) => 3,
            Self::StatsAggregator(_) => 4,
        };
        ROLES.get(i).copied().unwrap_or_default()
    }

    /// Parses and validates; the error names the field and the problem in one line.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err("the plugin configuration is empty: expected JSON such as {\"role\": \"http-header-operation\", ...}".into());
        }
        de::check_size(bytes)?;
        // serde's internally tagged enums read the whole object into a buffer of their own
        // first, which loses each value's path: the tag is read here, then the rest as the
        // role's struct.
        let top = Entries::read(bytes, "internally tagged enum PluginConfig", &["role"])?;
        let role: String = match top.get("role") {
            Some(v) => de::field(v, "role")?,
            None => return Err("missing field `role`".into()),
        };
        let Some(i) = ROLES.iter().position(|r| *r == role) else {
            let e: serde_json::Error = serde::de::Error::unknown_variant(&role, &ROLES);
            return Err(format!("{e} at role"));
        };
        let rest = top.without("role")?;
        let rest = rest.as_bytes();
        let mut config = match i {
            0 => Self::HttpHeaderOperation(de::from_slice(rest)?),
            1 => Self::HttpBodyOperation(de::from_slice(rest)?),
            2 => Self::TcpTotalDataSizeCounter(de::from_slice(rest)?),
            3 => Self::RateLimit(de::from_slice(rest)?),
            _ => Self::StatsAggregator(de::from_slice(rest)?),
        };
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
        let config: Self = de::from_slice(bytes)?;
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
    fn the_document_is_bounded_and_read_as_serde_read_it() {
        let big = format!(
            r#"{{"role":"http-header-operation","request":{{"remove":["{}"]}}}}"#,
            "x".repeat(MAX_CONFIG_BYTES)
        );
        let e = PluginConfig::parse(big.as_bytes()).unwrap_err();
        assert!(e.ends_with("bytes, over the 1048576-byte limit"), "{e}");
        for (json, want) in [
            (
                "[]",
                "invalid type: sequence, expected internally tagged enum PluginConfig",
            ),
            (
                r#"{"role":5}"#,
                "invalid type: integer `5`, expected a string at role",
            ),
            (
                r#"{"role":"rate-limit","role":"rate-limit"}"#,
                "duplicate field `role`",
            ),
            (
                r#"{"role":"http-header-operation","request":{"add":[{"name":"a","value":"b","name":"c"}]}}"#,
                "duplicate field `name` at request.add[0]",
            ),
            (
                r#"{"role":"http-body-operation","request":{"replace":{}}}"#,
                "invalid type: map, expected a sequence at request.replace",
            ),
            (
                r#"{"role":"http-header-operation"} {}"#,
                "trailing characters at line 1 column 34",
            ),
        ] {
            assert_eq!(
                PluginConfig::parse(json.as_bytes()).unwrap_err(),
                want,
                "{json}"
            );
        }
        let e = VmConfig::parse(br#"{"log_level":"loud"}"#).unwrap_err();
        assert_eq!(
            e,
            "unknown variant `loud`, expected one of `trace`, `debug`, `info`, `warn`, `error`, `critical` at log_level"
        );
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

    #[test]
    fn a_refill_rate_with_an_exponent_near_the_i64_limit_is_refused_as_out_of_bounds() {
        for exp in [
            "9223372036854775807",
            "9223372036854775805",
            "+9223372036854775807",
        ] {
            let json = format!(
                r#"{{"role":"rate-limit","key":"client-address","burst":1,"refill_per_second":1e{exp}}}"#
            );
            assert_eq!(
                PluginConfig::parse(json.as_bytes()).unwrap_err(),
                format!("refill_per_second 1e{exp}: must be between 0.001 and 1000000")
            );
        }
    }
}
