//! The filter as an Envoy dynamic module (`envoy.filters.http.dynamic_modules`, Envoy 1.40):
//! the same plugin configuration JSON, parsed and validated by [`crate::config`], and the same
//! role logic as the Wasm module, behind Envoy's native C ABI instead of proxy-wasm. Built
//! natively, the crate's cdylib is `libwasm_filter.so`, which Envoy finds by the name
//! `wasm_filter` in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.
//!
//! The roles that fit an HTTP filter run here ([`http`]): `http-header-operation`,
//! `http-body-operation` and `rate-limit` (its table in process memory, shared by every
//! worker); `tcp-total-data-size-counter` runs as a network filter
//! (`envoy.filters.network.dynamic_modules`, [`tcp`]). The stats aggregator is refused by
//! name when the configuration is loaded.
//!
//! The `unsafe` is in one room: [`abi`] (the types that cross the boundary, the callbacks
//! Envoy exports, and the hooks it calls, which turn its pointers into owned values and
//! handles) and [`host`] (the safe handles' calls into Envoy). Everything else is safe Rust
//! that never sees a raw Envoy pointer.
//!
//! Nothing unwinds into Envoy: every hook runs under [`guard`], and a panic fails its
//! request closed (a 500 local reply, or a reset once the response has started) while Envoy
//! and every other stream go on. The configuration hook refuses a bad configuration by
//! returning null after logging the reason, which names the field; Envoy then rejects the
//! filter.

#[allow(unsafe_code)]
mod abi;
mod body;
mod headers;
#[allow(unsafe_code)]
mod host;
mod http;
mod metrics;
mod rate_limit;
mod tcp;

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi::Status as Outcome;
use host::log;

use crate::config::PluginConfig;

/// The `filter_name` the module answers to, alone or as `wasm-filter/<plugin>`.
const FILTER_NAME: &str = "wasm-filter";

/// A plugin's name in `filter_name` is at most this long (its metric names cut it shorter).
const MAX_PLUGIN_NAME: usize = 256;

/// Configurations are read whole, but never more than this (as in the Wasm module).
const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// Fault injection for the fail-closed tests, compiled in only with the `fault` cargo
/// feature (the tests' build; never the `.so` `make build` ships): a request carrying
/// `x-wasm-filter-fault: panic` panics inside the request headers hook, and a connection
/// whose data starts with [`FAULT_MARKER`] panics inside the network read hook.
#[cfg(feature = "fault")]
const FAULT_MARKER: &[u8] = b"x-wasm-filter-fault: panic";

/// The plugin's name, from `filter_name`: `wasm-filter/<plugin>` names it (it tags the
/// metrics, as a Wasm plugin's `name` does); plain `wasm-filter` is the plugin `wasm-filter`.
fn plugin_name(name: &[u8]) -> Result<String, String> {
    let unknown = || {
        format!(
            "filter_name {:?} is unknown: this module's filter is {FILTER_NAME:?}, or \
             \"{FILTER_NAME}/<plugin>\" to name the plugin in its metrics",
            String::from_utf8_lossy(&name[..name.len().min(MAX_PLUGIN_NAME)])
        )
    };
    let name = std::str::from_utf8(name).map_err(|_| unknown())?;
    match name.strip_prefix(FILTER_NAME) {
        Some("") => Ok(FILTER_NAME.to_string()),
        Some(rest) => match rest.strip_prefix('/') {
            Some(plugin) if !plugin.is_empty() && plugin.len() <= MAX_PLUGIN_NAME => {
                Ok(plugin.to_string())
            }
            _ => Err(unknown()),
        },
        None => Err(unknown()),
    }
}

/// The plugin configuration Envoy hands a filter, checked as the Wasm module checks it: the
/// filter name, the size bound, then [`PluginConfig::parse`]; with the plugin's name.
fn plugin_config(name: &[u8], config: &[u8]) -> Result<(String, PluginConfig), String> {
    let plugin = plugin_name(name)?;
    if config.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "the plugin configuration is {} bytes, over the {MAX_CONFIG_BYTES}-byte limit",
            config.len()
        ));
    }
    Ok((plugin, PluginConfig::parse(config)?))
}

/// What a `config_new` hook made, logged: the configuration, or `None` (Envoy then refuses
/// it) with the reason.
fn configured<T>(
    made: Option<Result<T, String>>,
    describe: impl FnOnce(&T) -> String,
) -> Option<T> {
    match made {
        Some(Ok(config)) => {
            log!(Info, "{}", describe(&config));
            Some(config)
        }
        Some(Err(e)) => {
            log!(Error, "invalid plugin configuration: {e}");
            None
        }
        None => {
            log!(Error, "invalid plugin configuration: the parser panicked");
            None
        }
    }
}

/// Runs `f` so that no panic unwinds into Envoy (undefined behaviour across `extern "C"`):
/// `None` when it panicked. Every hook that can reach the roles' code goes through it; what
/// a panic means is the hook's to say.
fn guard<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_name_may_name_the_plugin() {
        assert_eq!(plugin_name(b"wasm-filter").unwrap(), "wasm-filter");
        assert_eq!(
            plugin_name(b"wasm-filter/header-ops").unwrap(),
            "header-ops"
        );
        for bad in [
            &b"wasm-filter/"[..],
            b"wasm-filterx",
            b"wasm-filter-x",
            b"\xff",
        ] {
            let e = plugin_name(bad).unwrap_err();
            assert!(e.contains("wasm-filter/<plugin>"), "{e}");
        }
        assert!(plugin_name(format!("wasm-filter/{}", "p".repeat(257)).as_bytes()).is_err());
    }
}
