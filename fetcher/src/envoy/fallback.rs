//! What stands in for a Wasm filter whose module cannot be fetched, as Istio's agent does it:
//! an RBAC filter of the same kind (HTTP or network), allowing everything when the plugin
//! fails open, denying everything when it fails closed (HTTP 403; a network connection is
//! closed). A proxy never runs a chain with the filter silently missing.

use serde_json::{json, Value};
use wasm_common::envoy_types::url;

/// The two places a Wasm filter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterType {
    Http,
    Network,
}

impl FilterType {
    pub fn wasm_type_url(self) -> &'static str {
        match self {
            Self::Http => url::HTTP_WASM,
            Self::Network => url::NETWORK_WASM,
        }
    }

    pub fn rbac_type_url(self) -> &'static str {
        match self {
            Self::Http => url::HTTP_RBAC,
            Self::Network => url::NETWORK_RBAC,
        }
    }

    /// What a filter's `config_discovery.type_urls` lists: the Wasm filter, and the RBAC
    /// filter that may be swapped in for it.
    pub fn type_urls(self) -> [&'static str; 2] {
        [self.wasm_type_url(), self.rbac_type_url()]
    }
}

impl From<crate::envoy::wasmplugin::PluginType> for FilterType {
    fn from(t: crate::envoy::wasmplugin::PluginType) -> Self {
        match t {
            crate::envoy::wasmplugin::PluginType::Http => Self::Http,
            crate::envoy::wasmplugin::PluginType::Network => Self::Network,
        }
    }
}

/// Which substitute: the plugin's failure policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Fail open: an RBAC filter with no rules, which lets everything through.
    AllowAll,
    /// Fail closed: an RBAC filter with empty rules (`ALLOW` nothing), which refuses all.
    DenyAll,
}

impl Fallback {
    pub fn for_policy(fail_open: bool) -> Self {
        if fail_open {
            Self::AllowAll
        } else {
            Self::DenyAll
        }
    }

    /// Istio's stat prefix for it, which shows in Envoy's RBAC stats.
    pub fn stat_prefix(self) -> &'static str {
        match self {
            Self::AllowAll => "wasm-default-allow",
            Self::DenyAll => "wasm-default-deny",
        }
    }

    /// The substitute filter configuration, as a typed `Any` (JSON with `@type`).
    pub fn config(self, kind: FilterType) -> Value {
        let prefix_field = match kind {
            FilterType::Http => "rules_stat_prefix",
            FilterType::Network => "stat_prefix",
        };
        let mut any = json!({"@type": kind.rbac_type_url(), prefix_field: self.stat_prefix()});
        if self == Self::DenyAll {
            any["rules"] = json!({});
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_match_istios() {
        assert_eq!(
            Fallback::AllowAll.config(FilterType::Http),
            json!({"@type": url::HTTP_RBAC, "rules_stat_prefix": "wasm-default-allow"})
        );
        assert_eq!(
            Fallback::DenyAll.config(FilterType::Network),
            json!({"@type": url::NETWORK_RBAC, "stat_prefix": "wasm-default-deny", "rules": {}})
        );
        assert_eq!(
            FilterType::Http.type_urls(),
            [url::HTTP_WASM, url::HTTP_RBAC]
        );
    }
}
