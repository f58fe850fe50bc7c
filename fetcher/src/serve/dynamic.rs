//! `serve`'s dynamic modules: a `DynamicModule` resource (`extensions.wasm-fetcher.dev/v1alpha1`)
//! in the plugins directory becomes an ECDS file whose filter is Envoy's dynamic-module filter,
//! loading the module from the cache by its digest path
//! (`CACHE/dynamic-modules/<sha256>/lib<name>.so`).
//!
//! Istio has no API for dynamic modules yet; istio#59839 proposes a dedicated resource "similar
//! to our current Wasm implementation", and Envoy Gateway keeps them apart from Wasm too (its
//! `EnvoyExtensionPolicy.dynamicModules`). So the resource is its own kind whose `spec` is a
//! `WasmPlugin`'s, read by the same parser: `url` (oci://), `sha256`, `imagePullPolicy`,
//! `imagePullSecret`, `pluginName` (the filter's `filter_name`), `pluginConfig` (its
//! `filter_config`, as JSON text), `type` (HTTP or NETWORK), `failStrategy` (what stands in when
//! the module cannot be had, as for Wasm).
//!
//! A new version is a new path, so Envoy loads it beside the old one and swaps filters without
//! a restart; a file the cache holds is never rewritten, and the lease keeps it while an ECDS
//! file names it.

use std::path::Path;

use serde_json::{json, Value};
use wasm_common::envoy_types::url;

use crate::envoy::fallback::FilterType;
use crate::envoy::render::{self, EcdsResource};
use crate::envoy::wasmplugin::{DocumentError, Invalid, WasmPlugin};
use crate::error::FetchError;
use crate::pull::dynamic_module::DynamicPulled;
use crate::{Cache, PullRequest, Settings, Sha256};

pub const API_VERSION: &str = "extensions.wasm-fetcher.dev/v1alpha1";
pub const KIND: &str = "DynamicModule";

/// The Envoy the served dynamic modules are for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `--envoy-version`: this minor version.
    Version(String),
    /// `--envoy-admin`: the version that Envoy's admin `/server_info` reports, asked at each
    /// conversion (an upgraded Envoy gets modules for its version).
    Admin(String),
}

/// What a plugin file holds.
pub enum Resources {
    Wasm(Vec<WasmPlugin>),
    Dynamic(Vec<WasmPlugin>),
}

impl Resources {
    pub fn plugins(&self) -> &[WasmPlugin] {
        match self {
            Self::Wasm(p) | Self::Dynamic(p) => p,
        }
    }
}

/// The resources of a plugin file: `DynamicModule`s when its first resource is one (then all
/// must be), else `WasmPlugin`s.
pub fn parse(text: &str) -> Result<Resources, DocumentError> {
    let docs: Vec<Value> = wasm_common::yaml::from_str_all(text)
        .map_err(|e| DocumentError::Syntax(crate::shown::shown(&e.to_string())))?;
    let dynamic = docs.iter().find(|d| !d.is_null()).is_some_and(|d| {
        d.get("kind").and_then(Value::as_str) == Some(KIND)
            && d.get("apiVersion").and_then(Value::as_str) == Some(API_VERSION)
    });
    if !dynamic {
        return WasmPlugin::parse_all(text).map(Resources::Wasm);
    }
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let mut doc = doc;
        let kind_ok = doc.get("kind").and_then(Value::as_str) == Some(KIND)
            && doc.get("apiVersion").and_then(Value::as_str) == Some(API_VERSION);
        if !kind_ok {
            return Err(DocumentError::Invalid {
                index: i + 1,
                error: Invalid {
                    field: "kind".into(),
                    message: format!(
                        "a file of DynamicModule resources holds only those (apiVersion: {API_VERSION}, kind: {KIND})"
                    ),
                },
            });
        }
        if let Some(top) = doc.as_object_mut() {
            // The spec is a WasmPlugin's: the same parser reads it.
            top.insert(
                "apiVersion".into(),
                Value::String("extensions.istio.io/v1alpha1".into()),
            );
            top.insert("kind".into(), Value::String("WasmPlugin".into()));
        }
        let plugin = WasmPlugin::from_value(&doc).map_err(|error| DocumentError::Invalid {
            index: i + 1,
            error,
        })?;
        out.push(plugin);
    }
    Ok(Resources::Dynamic(out))
}

/// The ECDS resource's name: what the filter-chain entry's `config_discovery` names.
pub fn resource_name(p: &WasmPlugin) -> String {
    format!(
        "extensions.wasm-fetcher.dev/dynamicmodule/{}",
        p.qualified_name()
    )
}

/// The filter-chain entry that makes Envoy load `p`'s ECDS file from `ecds_dir`: the
/// dynamic-module filter, or the RBAC filter that stands in for it.
pub fn filter_entry(p: &WasmPlugin, ecds_dir: &Path) -> Value {
    let kind = FilterType::from(p.plugin_type);
    let module = match kind {
        FilterType::Http => url::HTTP_DYNAMIC_MODULE,
        FilterType::Network => url::NETWORK_DYNAMIC_MODULE,
    };
    json!({
        "name": resource_name(p),
        "config_discovery": {
            "config_source": {
                "path_config_source": {
                    "path": ecds_dir.join(render::file_name(p)).display().to_string(),
                    "watched_directory": {"path": ecds_dir.display().to_string()},
                },
            },
            "type_urls": [module, kind.rbac_type_url()],
        },
    })
}

/// The Envoy minor version of `target`.
pub async fn envoy_version(target: &Target, settings: &Settings) -> Result<String, FetchError> {
    match target {
        Target::Version(v) => Ok(v.clone()),
        Target::Admin(addr) => server_info_version(addr, settings).await,
    }
}

/// `MAJOR.MINOR` of the version an Envoy admin's `/server_info` reports
/// (`<commit>/1.40.0/Clean/RELEASE/BoringSSL`).
async fn server_info_version(addr: &str, settings: &Settings) -> Result<String, FetchError> {
    let bad = |reason: String| FetchError::EnvoyAdmin {
        addr: crate::shown::shown(addr),
        reason,
    };
    let deadline = crate::net::Deadline::Total(settings.http_timeout);
    let client = crate::net::client(settings, false, deadline)?;
    let resp = client
        .get(format!("http://{addr}/server_info"))
        .send()
        .await
        .map_err(|e| bad(format!("cannot read /server_info ({e})")))?;
    if !resp.status().is_success() {
        return Err(bad(format!("/server_info answered {}", resp.status())));
    }
    let body = crate::net::read_limited(resp, 1 << 20, "server_info")
        .await
        .map_err(|e| bad(e.to_string()))?;
    let info: Value = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "/server_info is not JSON ({})",
            crate::shown::shown(&e.to_string())
        ))
    })?;
    let version = info["version"].as_str().unwrap_or_default();
    minor_of(version).ok_or_else(|| {
        bad(format!(
            "/server_info names no Envoy version ({:?})",
            crate::shown::shown(version)
        ))
    })
}

/// `1.40` of `<commit>/1.40.0/…`.
fn minor_of(server_version: &str) -> Option<String> {
    let release = server_version.split('/').nth(1)?;
    let mut parts = release.split('.');
    let v = format!("{}.{}", parts.next()?, parts.next()?);
    crate::store::shared_object::parse_envoy_version(&v).ok()
}

/// Pulls `p`'s module for `target` and renders its ECDS resource: the dynamic-module filter
/// naming the cached file, or the failure policy's substitute when it cannot be had within
/// `deadline` (a registry that trickles holds no pull slot past it).
pub async fn resource(
    p: &WasmPlugin,
    request: &PullRequest,
    target: Option<&Target>,
    cache: &Cache,
    settings: &Settings,
    deadline: std::time::Duration,
) -> EcdsResource {
    let pulled = match target {
        None => Err(FetchError::NotLoadable {
            envoy_version: "(unknown)".into(),
            reason: "serve has no Envoy to check a dynamic module against: pass --envoy-version or --envoy-admin".into(),
        }),
        Some(target) => match envoy_version(target, settings).await {
            Ok(v) => {
                let pull = crate::pull::dynamic_module::pull(request, &v, cache, settings);
                tokio::time::timeout(deadline, pull)
                    .await
                    .unwrap_or_else(|_| {
                        Err(FetchError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("timed out after {deadline:?}"),
                        )))
                    })
            }
            Err(e) => Err(e),
        },
    };
    if let Err(e) = &pulled {
        tracing::error!(plugin = %p.qualified_name(), error = %crate::reference::redact_for_display(&crate::error::chain(e)), "dynamic module not available; writing the plugin's fallback");
    }
    render_resource(p, pulled.as_ref())
}

fn render_resource(p: &WasmPlugin, pulled: Result<&DynamicPulled, &FetchError>) -> EcdsResource {
    let kind = FilterType::from(p.plugin_type);
    let module = pulled.map(|m| (filter_config(p, kind, m), m.path.as_path(), m.sha256));
    render::resource_for(p, resource_name(p), module)
}

/// Envoy's dynamic-module filter for `p`, loading the cached file.
fn filter_config(p: &WasmPlugin, kind: FilterType, m: &DynamicPulled) -> Value {
    let type_url = match kind {
        FilterType::Http => url::HTTP_DYNAMIC_MODULE,
        FilterType::Network => url::NETWORK_DYNAMIC_MODULE,
    };
    let config = p
        .plugin_config
        .as_ref()
        .map(|c| Value::Object(c.clone()).to_string())
        .unwrap_or_default();
    json!({
        "@type": type_url,
        "dynamic_module_config": {
            "name": m.name,
            "module": {"local": {"filename": m.path.display().to_string()}},
        },
        "filter_name": p.plugin_name.clone().unwrap_or_else(|| p.name.clone()),
        "filter_config": {"@type": url::STRING_VALUE, "value": config},
    })
}

/// Whether `path` is the cache's copy of the dynamic module `sha` (a lease must keep it).
pub fn is_cached(cache: &Cache, sha: &Sha256, path: &Path) -> bool {
    path.parent() == cache.dynamic_module_path(sha, "lib.so").parent()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_module_resource_reads_as_a_wasmplugin_spec_and_others_stay_wasmplugins() {
        let text = format!(
            "apiVersion: {API_VERSION}\nkind: {KIND}\nmetadata: {{name: rl, namespace: ns}}\n\
             spec: {{url: 'oci://r.example/m:1', pluginName: wasm-filter/rl, pluginConfig: {{role: rate-limit}}}}\n"
        );
        let Resources::Dynamic(p) = parse(&text).unwrap() else {
            panic!("not dynamic")
        };
        assert_eq!(p[0].qualified_name(), "ns.rl");
        assert_eq!(
            resource_name(&p[0]),
            "extensions.wasm-fetcher.dev/dynamicmodule/ns.rl"
        );
        let wasm = "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {url: 'https://h/a.wasm'}\n";
        assert!(matches!(parse(wasm).unwrap(), Resources::Wasm(_)));
        // A WasmPlugin after a DynamicModule is refused, naming the document.
        let mixed = format!("{text}---\n{wasm}");
        let e = parse(&mixed)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("2") && e.contains("kind: a file of DynamicModule"),
            "{e}"
        );
    }

    #[test]
    fn the_minor_version_is_read_from_server_info() {
        assert_eq!(
            minor_of("9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL"),
            Some("1.40".into())
        );
        assert_eq!(minor_of("garbage"), None);
        assert_eq!(minor_of("x/1.\n/y"), None);
    }
}
