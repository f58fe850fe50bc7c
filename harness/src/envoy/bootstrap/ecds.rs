//! Filters whose configuration comes by discovery (ECDS) from a file, as Envoy reads them at
//! start: `config_discovery.config_source.path_config_source.path` names a discovery
//! response (what `wasm-fetcher render` / `serve` write), and its resource named like the
//! filter becomes the filter's `typed_config`, if its type is one of the entry's `type_urls`.
//! Other config sources (ADS, an API server) and a default configuration are refused.
//!
//! A path is read relative to the current directory, as Envoy reads it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::model::{invalid, BootstrapError};
use super::typed_config::type_name;
use wasm_common::envoy_types::name_of;

/// The type of each resource of an ECDS response.
const TYPED_EXTENSION_CONFIG: &str = "envoy.config.core.v3.TypedExtensionConfig";

/// Discovery files that replaced the ones the bootstrap names, by the name of the filter
/// (the resource) they configure.
pub type EcdsFiles = HashMap<String, PathBuf>;

/// Replaces every `config_discovery` of the listeners' network and HTTP filters in `doc`
/// (normalized) by the `typed_config` its file (or the one `swapped` gives) holds.
pub(super) fn inline(doc: &mut Value, swapped: &EcdsFiles) -> Result<(), BootstrapError> {
    // Envoy's file subscriptions need the node named; without it Envoy refuses to start.
    let named = ["id", "cluster"].iter().all(|k| {
        doc.pointer(&format!("/node/{k}"))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    });
    let mut discovered = Vec::new();
    let Some(listeners) = doc
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut)
    else {
        return unknown_swaps(swapped, &discovered);
    };
    for (l, listener) in listeners.iter_mut().enumerate() {
        let Some(chains) = listener
            .get_mut("filter_chains")
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for (c, chain) in chains.iter_mut().enumerate() {
            let Some(filters) = chain.get_mut("filters").and_then(Value::as_array_mut) else {
                continue;
            };
            for (f, filter) in filters.iter_mut().enumerate() {
                let at = format!("static_resources.listeners[{l}].filter_chains[{c}].filters[{f}]");
                discovered.extend(inline_filter(&at, filter, named, swapped)?);
                let Some(http) = filter
                    .pointer_mut("/typed_config/http_filters")
                    .and_then(Value::as_array_mut)
                else {
                    continue;
                };
                for (h, http_filter) in http.iter_mut().enumerate() {
                    discovered.extend(inline_filter(
                        &format!("{at}.typed_config.http_filters[{h}]"),
                        http_filter,
                        named,
                        swapped,
                    )?);
                }
            }
        }
    }
    unknown_swaps(swapped, &discovered)
}

/// A swapped file for a filter no `config_discovery` configures would change nothing.
fn unknown_swaps(swapped: &EcdsFiles, discovered: &[String]) -> Result<(), BootstrapError> {
    match swapped.keys().find(|name| !discovered.contains(name)) {
        Some(name) => Err(invalid(
            "config_discovery",
            format!("no filter named {name:?} is configured by discovery (config_discovery), so no ECDS file of it can be swapped"),
        )),
        None => Ok(()),
    }
}

/// One filter: its `config_discovery`, if it has one, becomes its `typed_config`; returns
/// its name then. `named`: the bootstrap's node has an id and a cluster.
fn inline_filter(
    at: &str,
    filter: &mut Value,
    named: bool,
    swapped: &EcdsFiles,
) -> Result<Option<String>, BootstrapError> {
    let Some(discovery) = filter
        .as_object_mut()
        .and_then(|f| f.remove("config_discovery"))
    else {
        return Ok(None);
    };
    let at = format!("{at}.config_discovery");
    if !named {
        return Err(invalid(
            &at,
            "a file config source needs node.id and node.cluster in the bootstrap: Envoy refuses to start without them",
        ));
    }
    let name = filter
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if filter.get("typed_config").is_some() {
        return Err(invalid(
            &at,
            "a filter has either typed_config or config_discovery, not both",
        ));
    }
    let (path, type_urls) = read_discovery(&at, &discovery)?;
    let path = swapped
        .get(&name)
        .map_or_else(|| path.clone(), |p| p.display().to_string());
    let typed = resource(&at, Path::new(&path), &name)?;
    let found = type_name(&typed);
    if !type_urls.iter().any(|u| name_of(u) == found) {
        return Err(invalid(
            &format!("{at}.type_urls"),
            format!("{path} configures {name:?} as {found:?}, which type_urls does not list: Envoy rejects it"),
        ));
    }
    filter["typed_config"] = typed;
    Ok(Some(name))
}

/// The file a `config_discovery` reads and the types it accepts; any other field is refused.
fn read_discovery(at: &str, d: &Value) -> Result<(String, Vec<String>), BootstrapError> {
    for (key, _) in d.as_object().into_iter().flatten() {
        if !matches!(key.as_str(), "config_source" | "type_urls") {
            return Err(invalid(
                &format!("{at}.{key}"),
                "not emulated: the harness reads config_discovery's config_source.path_config_source and type_urls only",
            ));
        }
    }
    let source = d.get("config_source").unwrap_or(&Value::Null);
    for (key, _) in source.as_object().into_iter().flatten() {
        if key != "path_config_source" {
            return Err(invalid(
                &format!("{at}.config_source.{key}"),
                "not emulated: only a path_config_source (a file Envoy reads) is",
            ));
        }
    }
    let file = source.get("path_config_source").unwrap_or(&Value::Null);
    for (key, _) in file.as_object().into_iter().flatten() {
        if !matches!(key.as_str(), "path" | "watched_directory") {
            return Err(invalid(
                &format!("{at}.config_source.path_config_source.{key}"),
                "not emulated: the harness reads path and watched_directory",
            ));
        }
    }
    let path = file
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            invalid(
                &format!("{at}.config_source"),
                "path_config_source.path is required",
            )
        })?;
    let type_urls: Vec<String> = d
        .get("type_urls")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if type_urls.is_empty() {
        return Err(invalid(&format!("{at}.type_urls"), "type_urls is required"));
    }
    Ok((path.to_string(), type_urls))
}

/// The `typed_config` of the resource named `name` in the discovery response at `path`.
fn resource(at: &str, path: &Path, name: &str) -> Result<Value, BootstrapError> {
    let text = crate::engine::input::read_text(path, crate::engine::input::MAX_CONFIG_BYTES)
        .map_err(|e| {
            invalid(
                at,
                format!("cannot read the ECDS file {}: {e}", path.display()),
            )
        })?;
    let response: Value = wasm_common::yaml::from_str(&text).map_err(|e| {
        invalid(
            at,
            format!("the ECDS file {} is not YAML/JSON: {e}", path.display()),
        )
    })?;
    let resources = response
        .get("resources")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let found = resources
        .iter()
        .find(|r| r.get("name").and_then(Value::as_str) == Some(name))
        .ok_or_else(|| {
            invalid(
                at,
                format!(
                    "the ECDS file {} has no resource named {name:?}: Envoy would wait for one, and the listener would never serve",
                    path.display()
                ),
            )
        })?;
    if type_name(found) != TYPED_EXTENSION_CONFIG {
        return Err(invalid(
            at,
            format!(
                "resource {name:?} of {} is a {:?}, not a {TYPED_EXTENSION_CONFIG}",
                path.display(),
                type_name(found)
            ),
        ));
    }
    found
        .get("typed_config")
        .filter(|t| t.is_object())
        .cloned()
        .ok_or_else(|| {
            invalid(
                at,
                format!(
                    "resource {name:?} of {} has no typed_config",
                    path.display()
                ),
            )
        })
}
