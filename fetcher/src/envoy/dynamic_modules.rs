//! Envoy's dynamic-module filters in configuration, pointed at a cached `lib<name>.so`. Envoy
//! 1.40's `DynamicModuleConfig` names the module by `name` (`lib<name>.so`, searched for in
//! `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`) or by `module`, an `AsyncDataSource` (a local file,
//! or an HTTP URL with a sha256) that wins over `name` when both are set. Pointing a filter at
//! a file sets `module` to `{local: {filename}}`: one configuration then names one file,
//! whatever the environment of the Envoy that loads it. `name` is left as it was.
//!
//! `convert` takes a filter whose `module.remote.http_uri.uri` is `oci://…` (Envoy fetches
//! only HTTP, and no registry's image index by platform): the module is pulled for the Envoy
//! version and platform asked for (`crate::dynamic_module::pull`, `remote.sha256` its pin)
//! and the filter pointed at the cached file. An HTTP(S) remote, a local file or a bare name is
//! Envoy's to load and left alone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use wasm_common::envoy_types::{self, name};

use super::sites::join;
use crate::{Cache, FetchError, PullRequest, Settings, Sha256};

/// One dynamic-module filter configuration found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicModuleAny {
    /// Where it is, as a field path (`static_resources.listeners[0]…typed_config`).
    pub at: String,
    /// The same place as a JSON pointer.
    pub pointer: String,
}

/// Every HTTP or network dynamic-module filter in `doc` (an `Any` typed as one), in document
/// order.
pub fn dynamic_module_anys(doc: &Value) -> Vec<DynamicModuleAny> {
    let mut found = Vec::new();
    walk(doc, "", "", &mut found);
    found
}

fn walk(v: &Value, at: &str, pointer: &str, found: &mut Vec<DynamicModuleAny>) {
    match v {
        Value::Object(map) => {
            let type_name = map
                .get("@type")
                .and_then(Value::as_str)
                .map(envoy_types::name_of);
            if matches!(
                type_name,
                Some(name::HTTP_DYNAMIC_MODULE | name::NETWORK_DYNAMIC_MODULE)
            ) {
                found.push(DynamicModuleAny {
                    at: at.to_string(),
                    pointer: pointer.to_string(),
                });
                return;
            }
            for (key, child) in map {
                let ptr = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                walk(child, &join(at, key), &ptr, found);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                walk(
                    child,
                    &format!("{at}[{i}]"),
                    &format!("{pointer}/{i}"),
                    found,
                );
            }
        }
        _ => {}
    }
}

/// Points every dynamic-module filter in `doc` at `file` (absolute); returns how many. A
/// filter whose `dynamic_module_config` is not an object is refused by its field path.
pub fn point_at(doc: &mut Value, file: &Path) -> Result<usize, String> {
    let module = json!({"local": {"filename": file.display().to_string()}});
    let found = dynamic_module_anys(doc);
    for any in &found {
        let Some(filter) = doc.pointer_mut(&any.pointer).and_then(Value::as_object_mut) else {
            continue;
        };
        // Envoy reads proto JSON's spelling too.
        let key = if filter.contains_key("dynamicModuleConfig") {
            "dynamicModuleConfig"
        } else {
            "dynamic_module_config"
        };
        let config = filter.entry(key).or_insert_with(|| json!({}));
        let config = config.as_object_mut().ok_or_else(|| {
            format!(
                "{}: must be an object (Envoy's DynamicModuleConfig)",
                join(&any.at, key)
            )
        })?;
        config.insert("module".into(), module.clone());
    }
    Ok(found.len())
}

/// A dynamic-module filter whose module is to be pulled from a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSite {
    /// Where the filter is, as a field path.
    pub at: String,
    pointer: String,
    pub url: String,
    pub sha256: Option<Sha256>,
}

/// The field spelled either way Envoy reads it (snake_case or proto JSON's lowerCamelCase).
fn field<'a>(v: &'a Value, snake: &str, camel: &str) -> Option<&'a Value> {
    let map = v.as_object()?;
    map.get(snake).or_else(|| map.get(camel))
}

/// Every dynamic-module filter in `doc` whose module is `remote` with an `oci://` URL, checked
/// (a malformed one is refused by its field path before anything is fetched).
pub fn remote_sites(doc: &Value) -> Result<Vec<RemoteSite>, String> {
    let mut out = Vec::new();
    for any in dynamic_module_anys(doc) {
        let filter = doc.pointer(&any.pointer).unwrap_or(&Value::Null);
        let remote = field(filter, "dynamic_module_config", "dynamicModuleConfig")
            .and_then(|c| c.get("module"))
            .and_then(|m| m.get("remote"));
        let Some(remote) = remote else {
            continue;
        };
        let at = join(&any.at, "dynamic_module_config.module.remote");
        let uri = field(remote, "http_uri", "httpUri")
            .and_then(|h| h.get("uri"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                format!(
                    "{}: Required value: the module's URL",
                    join(&at, "http_uri.uri")
                )
            })?;
        if !uri.starts_with("oci://") {
            continue;
        }
        crate::reference::Source::parse(uri).map_err(|e| {
            format!(
                "{}: {}",
                join(&at, "http_uri.uri"),
                crate::reference::redact_userinfo(&e.to_string())
            )
        })?;
        let sha256 = match remote.get("sha256") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(Sha256::parse(s).map_err(|e| {
                format!(
                    "{}: {e} (the index's, the manifest's or the module's sha256)",
                    join(&at, "sha256")
                )
            })?),
            Some(_) => {
                return Err(format!(
                    "{}: must be a string of 64 hex characters",
                    join(&at, "sha256")
                ))
            }
        };
        out.push(RemoteSite {
            at: any.at.clone(),
            pointer: any.pointer.clone(),
            url: uri.to_string(),
            sha256,
        });
    }
    Ok(out)
}

/// The Envoy a conversion pulls dynamic modules for.
#[derive(Debug, Clone)]
pub struct Target {
    /// `MAJOR.MINOR`.
    pub envoy_version: String,
    /// `os/arch`; this host's when `None`.
    pub platform: Option<String>,
}

/// Pulls every site's module for `target` (each within `limit`) and points its filter at the
/// cached file; returns each site's path and file. Any failure fails the whole conversion,
/// naming the site: a dynamic-module filter has no failure policy to fall back on, and the
/// caller then writes nothing, so the configuration Envoy runs stays as it was.
pub async fn convert(
    doc: &mut Value,
    sites: &[RemoteSite],
    target: &Target,
    cache: &Cache,
    settings: &Settings,
    limit: Duration,
) -> Result<Vec<(String, PathBuf)>, String> {
    let pulls = futures_util::future::join_all(sites.iter().map(|site| {
        let request = PullRequest {
            url: site.url.clone(),
            sha256: site.sha256,
            platform: target.platform.clone(),
            ..Default::default()
        };
        async move {
            let pull =
                crate::dynamic_module::pull(&request, &target.envoy_version, cache, settings);
            tokio::time::timeout(limit, pull).await.unwrap_or_else(|_| {
                Err(FetchError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("timed out after {limit:?}"),
                )))
            })
        }
    }))
    .await;
    let mut out = Vec::new();
    for (site, pulled) in sites.iter().zip(pulls) {
        let pulled = pulled.map_err(|e| {
            format!(
                "{}: cannot fetch the dynamic module {}: {}",
                site.at,
                crate::reference::redact_userinfo(&site.url),
                crate::reference::redact_userinfo(&crate::error::chain(&e))
            )
        })?;
        let mut one = doc
            .pointer_mut(&site.pointer)
            .map(Value::take)
            .unwrap_or(Value::Null);
        point_at(&mut one, &pulled.path)?;
        if let Some(slot) = doc.pointer_mut(&site.pointer) {
            *slot = one;
        }
        out.push((site.at.clone(), pulled.path));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dynamic_module_filter_gets_the_local_file_and_keeps_its_name() {
        let mut doc = json!({"listeners": [{"filters": [
            {"typed_config": {"@type": envoy_types::url::NETWORK_DYNAMIC_MODULE,
                              "dynamic_module_config": {"name": "m"}, "filter_name": "f"}},
            {"typed_config": {"@type": envoy_types::url::HCM, "http_filters": [
                {"typed_config": {"@type": envoy_types::url::HTTP_DYNAMIC_MODULE,
                                  "dynamicModuleConfig": {"module": {"remote": {}}}}},
                {"typed_config": {"@type": envoy_types::url::HTTP_WASM, "config": {}}},
            ]}},
        ]}]});
        assert_eq!(point_at(&mut doc, Path::new("/c/libm.so")).unwrap(), 2);
        let local = json!({"local": {"filename": "/c/libm.so"}});
        let filters = &doc["listeners"][0]["filters"];
        assert_eq!(
            filters[0]["typed_config"]["dynamic_module_config"],
            json!({"name": "m", "module": local})
        );
        let http = &filters[1]["typed_config"]["http_filters"];
        assert_eq!(
            http[0]["typed_config"]["dynamicModuleConfig"]["module"],
            local
        );
        assert_eq!(
            http[1]["typed_config"]["config"],
            json!({}),
            "Wasm left alone"
        );

        let mut bad = json!({"@type": envoy_types::url::HTTP_DYNAMIC_MODULE,
                             "dynamic_module_config": "m"});
        let e = point_at(&mut bad, Path::new("/c/libm.so")).unwrap_err();
        assert_eq!(
            e,
            "dynamic_module_config: must be an object (Envoy's DynamicModuleConfig)"
        );
    }

    #[test]
    fn only_an_oci_remote_is_a_site_and_a_malformed_one_is_refused_by_field() {
        let filter = |module: Value| {
            json!({"@type": envoy_types::url::HTTP_DYNAMIC_MODULE,
                   "dynamic_module_config": {"name": "m", "module": module}})
        };
        let pin = "ab".repeat(32);
        let doc = json!([
            filter(json!({"remote": {"http_uri": {"uri": "oci://r.example/m:1"}, "sha256": pin}})),
            filter(json!({"remote": {"http_uri": {"uri": "https://h.example/libm.so"}}})),
            filter(json!({"local": {"filename": "/libm.so"}})),
        ]);
        let sites = remote_sites(&doc).unwrap();
        assert_eq!(sites.len(), 1);
        assert_eq!(
            (sites[0].at.as_str(), sites[0].url.as_str()),
            ("[0]", "oci://r.example/m:1")
        );
        assert_eq!(sites[0].sha256.map(|s| s.hex()), Some(pin));
        for (module, words) in [
            (
                json!({"remote": {"http_uri": {}}}),
                "[0].dynamic_module_config.module.remote.http_uri.uri: Required value",
            ),
            (
                json!({"remote": {"httpUri": {"uri": "oci://r/m:1"}, "sha256": "x"}}),
                "[0].dynamic_module_config.module.remote.sha256: ",
            ),
        ] {
            let e = remote_sites(&json!([filter(module)])).unwrap_err();
            assert!(e.starts_with(words), "{e}");
        }
    }
}
