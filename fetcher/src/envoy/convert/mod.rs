//! Envoy Wasm configuration that names remote modules, made to name local files, as Istio's
//! agent converts ECDS: every HTTP or network Wasm filter (plain, or wrapped in a
//! `TypedStruct`) and every Wasm service whose `vm_config.code.remote` has an `http_uri`
//! is pulled through the cache and rewritten to `code.local.filename`. The input may be one
//! filter configuration, a `TypedExtensionConfig`, a list of them, a discovery response, or a
//! whole bootstrap: the walk finds the Wasm wherever it is.
//!
//! A module that cannot be fetched is replaced by the RBAC filter its failure policy picks
//! (`crate::envoy::fallback`), as Istio does; a Wasm service has no substitute, so its failure fails
//! the conversion. Malformed input is refused before anything is fetched, naming the field.
//!
//! Istio's agent settings travel as `ISTIO_META_*` environment variables of the VM: the pull
//! policy (`ISTIO_META_WASM_IMAGE_PULL_POLICY`), the resource version
//! (`ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`) and the Docker config JSON of the pull secret
//! (`ISTIO_META_WASM_IMAGE_PULL_SECRET`). They are read, then removed, so the secret never
//! reaches Envoy.

use std::time::Duration;

use serde_json::{json, Map, Value};

use wasm_common::envoy_types::url;

use super::fallback::Fallback;
use super::render::Outcome;
use super::sites::{join, wasm_anys, Kind, WasmAny};
use crate::{Cache, FetchError, PullPolicy, PullRequest, Settings, Sha256};

const META_PREFIX: &str = "ISTIO_META_";
const POLICY_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_POLICY";
const VERSION_ENV: &str = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION";
const SECRET_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_SECRET";

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The input is not Envoy Wasm configuration as Envoy would take it.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// A Wasm service's module could not be fetched: there is no filter to stand in for it.
    #[error("{field}: cannot fetch the Wasm service's module {url}: {message}")]
    Service {
        field: String,
        url: String,
        message: String,
    },
}

fn invalid(field: &str, message: impl Into<String>) -> ConvertError {
    ConvertError::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A Wasm configuration whose module is remote: where it is and how to pull it.
#[derive(Debug, Clone)]
pub struct Site {
    /// Where the `Any` is, as a field path (`resources[0].typed_config`).
    pub at: String,
    /// The same place as a JSON pointer, to replace it.
    pointer: String,
    pub kind: Kind,
    /// The Wasm message (`{config: ...}` for a filter, `{config, singleton}` for a service),
    /// with `ISTIO_META_*` variables already removed.
    message: Value,
    /// How the message spells `vm_config` (`vmConfig` in proto JSON), where the local module
    /// goes.
    vm_key: String,
    pub request: PullRequest,
    /// `http_uri.timeout`, the bound Istio puts on the whole fetch.
    pub timeout: Option<Duration>,
    /// The Docker config JSON carried by `ISTIO_META_WASM_IMAGE_PULL_SECRET`.
    pub secret: Option<Vec<u8>>,
    pub fail_open: bool,
}

/// One converted site, for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub at: String,
    pub url: String,
    pub outcome: Outcome,
}

/// Every remote Wasm site in `doc`, checked. Local ones are left alone; none at all is no
/// error: Istio's agent passes a resource without remote Wasm through as it is.
pub fn sites(doc: &Value) -> Result<Vec<Site>, ConvertError> {
    let mut sites = Vec::new();
    for any in &wasm_anys(doc) {
        sites.extend(site(any)?);
    }
    Ok(sites)
}

/// The site `any` is, checked; `None` for one whose module is already local.
fn site(any: &WasmAny) -> Result<Option<Site>, ConvertError> {
    let at = any.at.as_str();
    let base = any.message_at();
    let mut message = message_of(any, &base)?;
    let config_at = join(&base, "config");
    let config = message
        .get_mut("config")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| invalid(&config_at, "Required value: the plugin configuration"))?;
    let fail_open = fail_open(config, &config_at)?;
    let plugin_name = config.get("name").and_then(Value::as_str).map(String::from);
    let vm_key = key_in(config, "vm_config", &config_at)?;
    let vm_at = join(&config_at, &vm_key);
    let code_at = join(&vm_at, "code");
    let vm = config
        .get_mut(&vm_key)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| invalid(&vm_at, "Required value: the VM configuration"))?;
    let code = vm.get("code").and_then(Value::as_object).ok_or_else(|| {
        invalid(
            &code_at,
            "Required value: no remote and no local module (code.remote.http_uri or code.local.filename)",
        )
    })?;
    if code.contains_key("local") && !code.contains_key("remote") {
        return Ok(None);
    }
    let remote_at = join(&code_at, "remote");
    let remote = code.get("remote").and_then(Value::as_object).ok_or_else(|| {
        invalid(
            &code_at,
            "Required value: no remote and no local module (code.remote.http_uri or code.local.filename)",
        )
    })?;
    let Remote {
        url,
        sha256,
        timeout,
    } = remote_source(remote, &remote_at)?;
    let env = take_istio_env(vm, &vm_at)?;
    let policy = match env.get(POLICY_ENV).map(String::as_str) {
        Some("IfNotPresent") => Some(PullPolicy::IfNotPresent),
        Some("Always") => Some(PullPolicy::Always),
        _ => None,
    };
    let request = PullRequest {
        url: url.clone(),
        sha256,
        policy,
        resource: any.resource.clone().or(plugin_name),
        resource_version: env.get(VERSION_ENV).cloned(),
        ..Default::default()
    };
    Ok(Some(Site {
        at: at.to_string(),
        pointer: any.pointer.clone(),
        kind: any.kind,
        message,
        vm_key,
        request,
        timeout,
        secret: env.get(SECRET_ENV).map(|s| s.clone().into_bytes()),
        fail_open,
    }))
}

/// The message of `any` itself, without `@type` (from a TypedStruct: its `value`).
fn message_of(any: &WasmAny, base: &str) -> Result<Value, ConvertError> {
    let map = any.object;
    if any.wrapped {
        match map.get("value") {
            None => Ok(json!({})),
            Some(v @ Value::Object(_)) => Ok(v.clone()),
            Some(_) => Err(invalid(base, "must be an object")),
        }
    } else {
        let mut m = map.clone();
        m.remove("@type");
        Ok(Value::Object(m))
    }
}

/// What a `code.remote` says of the module: where it is, its pin, and how long to wait.
struct Remote {
    url: String,
    sha256: Option<Sha256>,
    timeout: Option<Duration>,
}

fn remote_source(remote: &Map<String, Value>, remote_at: &str) -> Result<Remote, ConvertError> {
    let http_uri_key = key_in(remote, "http_uri", remote_at)?;
    let http_uri_at = join(remote_at, &http_uri_key);
    let uri_at = join(&http_uri_at, "uri");
    let http_uri = remote
        .get(&http_uri_key)
        .and_then(Value::as_object)
        .ok_or_else(|| {
            invalid(
                &http_uri_at,
                "Required value: the module's URL (http_uri.uri); this fetcher reads nothing else of a remote source",
            )
        })?;
    let url = http_uri
        .get("uri")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| invalid(&uri_at, "Required value: the module's URL"))?
        .to_string();
    crate::reference::Source::parse(&url)
        .map_err(|e| invalid(&uri_at, crate::reference::redact_userinfo(&e.to_string())))?;
    let sha256 = match remote.get("sha256") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() || s == "nil" => None,
        Some(Value::String(s)) => Some(Sha256::parse(s).map_err(|e| {
            invalid(
                &join(remote_at, "sha256"),
                format!("{e} (the module's sha256, or for oci:// the manifest digest)"),
            )
        })?),
        Some(_) => {
            return Err(invalid(
                &join(remote_at, "sha256"),
                "must be a string of 64 hex characters",
            ))
        }
    };
    let timeout = match http_uri.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(
            wasm_common::duration::parse(t)
                .map_err(|e| invalid(&join(&http_uri_at, "timeout"), e))?,
        ),
        Some(_) => {
            return Err(invalid(
                &join(&http_uri_at, "timeout"),
                "must be a duration string such as \"30s\"",
            ))
        }
    };
    Ok(Remote {
        url,
        sha256,
        timeout,
    })
}

/// The key `snake` goes by in `map`: its snake_case name, or proto JSON's lowerCamelCase one,
/// as Envoy reads both (the snake_case name when neither is there). Both at once is refused:
/// Envoy keeps whichever comes last, and reading the other one is how a fail-closed plugin
/// became allow-all.
fn key_in(map: &Map<String, Value>, snake: &str, at: &str) -> Result<String, ConvertError> {
    let camel = lower_camel(snake);
    if camel != snake && map.contains_key(snake) && map.contains_key(&camel) {
        return Err(invalid(
            &join(at, snake),
            format!("set twice, as {snake} and as {camel}: keep one"),
        ));
    }
    Ok(if map.contains_key(&camel) {
        camel
    } else {
        snake.to_string()
    })
}

/// Proto JSON's name for a field: `failure_policy` is `failurePolicy`.
fn lower_camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// Istio's rule: `failure_policy`, when set, opens only for `FAIL_OPEN`; otherwise the
/// deprecated `fail_open`. Both set (a policy other than `UNSPECIFIED` and `fail_open: true`)
/// is refused, as Envoy refuses it.
fn fail_open(config: &Map<String, Value>, at: &str) -> Result<bool, ConvertError> {
    let policy_key = key_in(config, "failure_policy", at)?;
    let open_key = key_in(config, "fail_open", at)?;
    let policy = match config.get(&policy_key) {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => match p.as_str() {
            "UNSPECIFIED" => None,
            "FAIL_OPEN" => Some(true),
            "FAIL_CLOSED" | "FAIL_RELOAD" => Some(false),
            other => {
                return Err(invalid(
                    &join(at, &policy_key),
                    format!(
                        "Unsupported value: {:?}: supported values: \"UNSPECIFIED\", \"FAIL_RELOAD\", \"FAIL_CLOSED\", \"FAIL_OPEN\"",
                        crate::shown::shown(other)
                    ),
                ))
            }
        },
        Some(_) => {
            return Err(invalid(
                &join(at, &policy_key),
                "must be a string (FAIL_OPEN, FAIL_CLOSED, FAIL_RELOAD)",
            ))
        }
    };
    let legacy = match config.get(&open_key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid(&join(at, &open_key), "must be true or false")),
    };
    match (policy, legacy) {
        (Some(_), true) => Err(invalid(
            &join(at, &open_key),
            format!("only one of fail_open or failure_policy can be set (Envoy refuses both; {policy_key} is set)"),
        )),
        (Some(open), false) => Ok(open),
        (None, legacy) => Ok(legacy),
    }
}

/// Removes the `ISTIO_META_*` variables from the VM's environment and returns them; an
/// environment left empty is removed, as Istio's agent does.
fn take_istio_env(
    vm: &mut Map<String, Value>,
    vm_at: &str,
) -> Result<std::collections::BTreeMap<String, String>, ConvertError> {
    let mut out = std::collections::BTreeMap::new();
    let env_key = key_in(vm, "environment_variables", vm_at)?;
    let env_at = join(vm_at, &env_key);
    let Some(env) = vm.get_mut(&env_key) else {
        return Ok(out);
    };
    let env = env
        .as_object_mut()
        .ok_or_else(|| invalid(&env_at, "must be an object"))?;
    let kv_key = key_in(env, "key_values", &env_at)?;
    let host_key = key_in(env, "host_env_keys", &env_at)?;
    if let Some(kv) = env.get_mut(&kv_key) {
        let kv_at = join(&env_at, &kv_key);
        let kv = kv
            .as_object_mut()
            .ok_or_else(|| invalid(&kv_at, "must be an object of strings"))?;
        let meta: Vec<String> = kv
            .keys()
            .filter(|k| k.starts_with(META_PREFIX))
            .cloned()
            .collect();
        for k in meta {
            match kv.remove(&k) {
                Some(Value::String(v)) => {
                    out.insert(k, v);
                }
                _ => return Err(invalid(&join(&kv_at, &k), "must be a string")),
            }
        }
        if kv.is_empty() {
            env.remove(&kv_key);
        }
    }
    let no_host_keys = env
        .get(&host_key)
        .is_none_or(|h| h.as_array().is_some_and(Vec::is_empty));
    if env.is_empty() || (no_host_keys && !env.contains_key(&kv_key)) {
        vm.remove(&env_key);
    }
    Ok(out)
}

/// Pulls the site's module under its timeout (or `default_timeout`), with its pull secret.
pub async fn fetch(
    site: &Site,
    cache: &Cache,
    settings: &Settings,
    default_timeout: Duration,
) -> Result<crate::Pulled, FetchError> {
    let mut request = site.request.clone();
    // The secret's bytes go to a private temp file for the pull's length: the pull reads a
    // Docker config from a file, as `--pull-secret` gives one.
    let _secret_file = match &site.secret {
        Some(bytes) if bytes.is_empty() => {
            return Err(FetchError::Setting {
                name: SECRET_ENV,
                value: String::new(),
                reason: "missing image pulling secret (the control plane could not read it)".into(),
            })
        }
        Some(bytes) => {
            let mut f = tempfile::NamedTempFile::new()?;
            std::io::Write::write_all(&mut f, bytes)?;
            request.pull_secret = Some(f.path().to_path_buf());
            Some(f)
        }
        None => None,
    };
    let limit = site.timeout.unwrap_or(default_timeout);
    crate::envoy::render::pull_within(&request, cache, settings, limit).await
}

/// Puts the outcome of `site`'s pull into `doc`: the Wasm message with its module local, or
/// the fallback. A Wasm service that could not be fetched is an error.
pub fn apply(
    doc: &mut Value,
    site: &Site,
    pulled: Result<&crate::Pulled, &FetchError>,
) -> Result<Converted, ConvertError> {
    let url = crate::reference::redact_userinfo(&site.request.url);
    let (replacement, outcome) = match (pulled, &site.kind) {
        (Ok(m), kind) => {
            let mut message = site.message.clone();
            message["config"][site.vm_key.as_str()]["code"] =
                json!({"local": {"filename": m.path.display().to_string()}});
            let type_url = match kind {
                Kind::Filter(f) => f.wasm_type_url(),
                Kind::Service => url::WASM_SERVICE,
            };
            if let Some(obj) = message.as_object_mut() {
                obj.insert("@type".into(), json!(type_url));
            }
            (
                message,
                Outcome::Module {
                    path: m.path.clone(),
                    sha256: m.sha256,
                },
            )
        }
        (Err(e), Kind::Filter(f)) => {
            let fallback = Fallback::for_policy(site.fail_open);
            (
                fallback.config(*f),
                Outcome::Fallback {
                    fallback,
                    error: crate::reference::redact_userinfo(&crate::error::chain(e)),
                },
            )
        }
        (Err(e), Kind::Service) => {
            return Err(ConvertError::Service {
                field: site.at.clone(),
                url,
                message: crate::reference::redact_userinfo(&crate::error::chain(e)),
            })
        }
    };
    match doc.pointer_mut(&site.pointer) {
        Some(slot) => *slot = replacement,
        None => {
            return Err(invalid(
                &site.at,
                "not found in the document it was read from",
            ))
        }
    }
    Ok(Converted {
        at: site.at.clone(),
        url,
        outcome,
    })
}

/// Converts `doc` in place: checks every site, pulls them all, then applies the outcomes.
/// On an error `doc` may be partly converted; the caller writes nothing then.
pub async fn convert(
    doc: &mut Value,
    cache: &Cache,
    settings: &Settings,
    default_timeout: Duration,
) -> Result<Vec<Converted>, ConvertError> {
    let sites = sites(doc)?;
    let pulls = futures_util::future::join_all(
        sites
            .iter()
            .map(|s| fetch(s, cache, settings, default_timeout)),
    )
    .await;
    sites
        .iter()
        .zip(&pulls)
        .map(|(site, pulled)| apply(doc, site, pulled.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests;
