//! The RBAC filters Istio's agent puts in place of a Wasm filter whose module cannot be
//! fetched, and which `wasm-fetcher convert` / `render` / `serve` write the same way: with no
//! `rules` it allows everything (fail open); with empty `rules` (`ALLOW` no policy) it denies
//! everything, an HTTP request with 403 `RBAC: access denied`. Those two are emulated exactly;
//! any other RBAC configuration is refused, naming the field.

use serde_json::Value;

use super::model::{invalid, BootstrapError, RbacFallback};

/// Which fallback the RBAC `typed_config` at `at` is; `stat_field` is the stats prefix field
/// its kind has (`rules_stat_prefix` for HTTP, `stat_prefix` for a network filter).
pub(super) fn fallback(
    at: &str,
    typed: &Value,
    stat_field: &str,
) -> Result<RbacFallback, BootstrapError> {
    let at = format!("{at}.typed_config");
    for (key, _) in typed.as_object().into_iter().flatten() {
        if key != "@type" && key != "rules" && key != stat_field {
            return Err(unemulated(&format!("{at}.{key}")));
        }
    }
    let Some(rules) = typed.get("rules").filter(|r| !r.is_null()) else {
        return Ok(RbacFallback::AllowAll);
    };
    for (key, value) in rules.as_object().into_iter().flatten() {
        let empty = match key.as_str() {
            "action" => value.as_str() == Some("ALLOW") || value.as_u64() == Some(0),
            "policies" => value.as_object().is_some_and(|p| p.is_empty()),
            _ => false,
        };
        if !empty {
            return Err(unemulated(&format!("{at}.rules.{key}")));
        }
    }
    Ok(RbacFallback::DenyAll)
}

fn unemulated(at: &str) -> BootstrapError {
    invalid(
        at,
        "not emulated: the harness runs only the RBAC filters that stand in for a Wasm filter (no rules: allow all; empty rules: deny all)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_wasm_fallbacks_are_read() {
        let allow = json!({"@type": "x", "rules_stat_prefix": "wasm-default-allow"});
        let deny = json!({"@type": "x", "rules_stat_prefix": "wasm-default-deny", "rules": {}});
        assert_eq!(
            fallback("f", &allow, "rules_stat_prefix").unwrap(),
            RbacFallback::AllowAll
        );
        assert_eq!(
            fallback("f", &deny, "rules_stat_prefix").unwrap(),
            RbacFallback::DenyAll
        );
        let rules = json!({"@type": "x", "rules": {"policies": {"p": {}}}});
        let e = fallback("f", &rules, "rules_stat_prefix").unwrap_err();
        assert!(
            e.to_string().contains("f.typed_config.rules.policies"),
            "{e}"
        );
        let shadow = json!({"@type": "x", "shadow_rules": {}});
        assert!(fallback("f", &shadow, "rules_stat_prefix").is_err());
    }
}
