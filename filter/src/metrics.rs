//! Names of the metrics every role defines in Envoy. Envoy puts a Wasm module's metrics under
//! its `wasmcustom.` namespace and has no tags of its own for them, so the plugin's name and
//! the role travel in the name, each behind a fixed word, for Envoy's tag extraction
//! (`stats_config.stats_tags`, as `envoy-config/bootstrap.yaml` and docs/filter.md have
//! them) to take out:
//!
//! `wasmcustom.wasm_filter.plugin.<plugin>.role.<role>.<metric>` becomes
//! `wasm_filter_<metric>{plugin="<plugin>",role="<role>"}` on `/stats/prometheus` (Envoy
//! writes custom-namespace metrics without its `envoy_` prefix and without the namespace).

/// The name a role's metric is defined under (Envoy adds `wasmcustom.`). Characters Envoy's
/// stat names or the tag regexes treat specially (`.`, `:`, space...) in the plugin's name
/// become `_` (an Istio plugin is named `<namespace>.<name>`: `istio-system_my-plugin`).
pub fn metric_name(plugin: &str, role: &str, metric: &str) -> String {
    let mut plugin_part = String::new();
    for c in plugin.chars().take(MAX_PLUGIN_CHARS) {
        let keep = c.is_ascii_alphanumeric() || c == '-' || c == '_';
        plugin_part.push(if keep { c } else { '_' });
    }
    let plugin = plugin_part;
    let plugin = if plugin.is_empty() { "_" } else { &plugin };
    format!("wasm_filter.plugin.{plugin}.role.{role}.{metric}")
}

/// Plugin names are cut to this many characters in metric names.
const MAX_PLUGIN_CHARS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_plugin_and_role_behind_fixed_words() {
        assert_eq!(
            metric_name("rate-limit", "rate-limit", "limited_total"),
            "wasm_filter.plugin.rate-limit.role.rate-limit.limited_total"
        );
        assert_eq!(
            metric_name(
                "istio-system.my plugin:1",
                "http-header-operation",
                "requests_total"
            ),
            "wasm_filter.plugin.istio-system_my_plugin_1.role.http-header-operation.requests_total"
        );
        assert_eq!(metric_name("", "r", "m"), "wasm_filter.plugin._.role.r.m");
        assert!(metric_name(&"p".repeat(500), "r", "m").len() < 100);
    }
}
