//! What stands in for a Wasm filter whose module cannot be fetched, as Istio's agent does it:
//! an RBAC filter of the same kind (HTTP or network), allowing everything when the plugin
//! fails open, denying everything when it fails closed (HTTP 403; a network connection is
//! closed). A proxy never runs a chain with the filter silently missing.

use serde_json::{json, Value};

pub const HTTP_WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
pub const NETWORK_WASM: &str = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm";
pub const HTTP_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
pub const NETWORK_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";
/// Istio's (and xDS's) wrapper holding a message as a `Struct` with its type URL beside it.
pub const TYPED_STRUCTS: &[&str] = &[
    "type.googleapis.com/udpa.type.v1.TypedStruct",
    "type.googleapis.com/xds.type.v3.TypedStruct",
];

/// The two places a Wasm filter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterType {
    Http,
    Network,
}

impl FilterType {
    /// The kind of Wasm filter a type URL names, if it names one.
    pub fn of_wasm_type_url(type_url: &str) -> Option<Self> {
        match type_url {
            HTTP_WASM => Some(Self::Http),
            NETWORK_WASM => Some(Self::Network),
            _ => None,
        }
    }

    pub fn wasm_type_url(self) -> &'static str {
        match self {
            Self::Http => HTTP_WASM,
            Self::Network => NETWORK_WASM,
        }
    }

    pub fn rbac_type_url(self) -> &'static str {
        match self {
            Self::Http => HTTP_RBAC,
            Self::Network => NETWORK_RBAC,
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
            json!({"@type": HTTP_RBAC, "rules_stat_prefix": "wasm-default-allow"})
        );
        assert_eq!(
            Fallback::DenyAll.config(FilterType::Network),
            json!({"@type": NETWORK_RBAC, "stat_prefix": "wasm-default-deny", "rules": {}})
        );
        assert_eq!(
            FilterType::of_wasm_type_url(NETWORK_WASM),
            Some(FilterType::Network)
        );
        assert_eq!(FilterType::Http.type_urls(), [HTTP_WASM, HTTP_RBAC]);
    }
}
