//! A `WasmPlugin` turned into what a static Envoy needs to run it: an ECDS resource (a
//! `TypedExtensionConfig` naming the cached module, in a file of its own, since Envoy's
//! filesystem ECDS takes exactly one resource per file) and the filter-chain entry that
//! watches that file. Envoy swaps the filter when the file is replaced by a rename inside the
//! watched directory, which is how [`EcdsResource::write_atomically`] writes it.
//!
//! The three steps are separate so a long-running caller can pull on its own schedule:
//!
//! ```no_run
//! # async fn demo(text: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use wasm_fetcher::envoy::{render, wasmplugin::WasmPlugin};
//! use wasm_fetcher::{pull, Cache, Settings};
//! let cache = Cache::open("/var/cache/wasm".as_ref())?;
//! for plugin in WasmPlugin::parse_all(text)? {
//!     let request = render::plan(&plugin, &render::Options::default());
//!     let pulled = pull(&request, &cache, &Settings::from_env()?).await;
//!     let resource = render::resource(&plugin, pulled.as_ref());
//!     resource.write_atomically("/etc/envoy/ecds".as_ref())?;
//! }
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use wasm_common::envoy_types::url;

use super::fallback::{Fallback, FilterType};
use super::wasmplugin::{EnvValue, FailStrategy, WasmPlugin};
use crate::{FetchError, PullPolicy, PullRequest, Pulled, Sha256};

/// The runtime Istio names (Envoy's V8).
pub const RUNTIME: &str = "envoy.wasm.runtime.v8";

/// What the caller decides beyond the resource.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where Kubernetes-style pull secrets are mounted, one directory per namespace:
    /// `imagePullSecret: NAME` of a plugin in namespace NS reads
    /// `DIR/NS/NAME/.dockerconfigjson` (a Secret volume's layout), so a plugin reaches only its
    /// own namespace's secrets, as in Istio. Without it a named secret is not used, and the
    /// default Docker config applies, as Istio's agent does with no secret.
    pub pull_secrets: Option<PathBuf>,
    /// Overrides every resource's `imagePullPolicy`: `Never` on an offline node whose cache
    /// was warmed by `prefetch`.
    pub pull_policy: Option<PullPolicy>,
}

/// The ECDS resource's name, as Istio 1.26+ names it: what the filter-chain entry refers to.
pub fn resource_name(p: &WasmPlugin) -> String {
    format!("extensions.istio.io/wasmplugin/{}", p.qualified_name())
}

/// The file the resource lives in, inside the ECDS directory: `<namespace>.<name>.yaml`
/// (both DNS names, so no path can escape the directory).
pub fn file_name(p: &WasmPlugin) -> String {
    format!("{}.yaml", p.qualified_name())
}

/// The pull the resource asks for: its URL, pin and policy; its ECDS resource name and
/// version, so `Always` pulls again when (and only when) the resource changes.
pub fn plan(p: &WasmPlugin, options: &Options) -> PullRequest {
    let pull_secret = match (&p.image_pull_secret, &options.pull_secrets) {
        (Some(name), Some(dir)) => Some(secret_path(dir, &p.namespace, name)),
        _ => None,
    };
    PullRequest {
        url: p.url.clone(),
        sha256: p.sha256,
        policy: options.pull_policy.or(p.image_pull_policy),
        resource: Some(resource_name(p)),
        resource_version: Some(p.version().to_string()),
        pull_secret,
        verify_key: p.verify_key.clone(),
        verify_identity: p.verify_identity.clone(),
        ..Default::default()
    }
}

/// Where the secret `name` of namespace `namespace` is mounted under `dir`. Both are DNS names
/// ([`WasmPlugin::parse_all`] checks them), so the path stays inside `dir/namespace`.
pub fn secret_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(namespace).join(name).join(".dockerconfigjson")
}

/// [`crate::pull`] bounded by `limit`; running out of time is an error like any failed pull
/// (a timed-out I/O error), so it gets the fallback.
pub async fn pull_within(
    request: &PullRequest,
    cache: &crate::Cache,
    settings: &crate::Settings,
    limit: std::time::Duration,
) -> Result<Pulled, FetchError> {
    tokio::time::timeout(limit, crate::pull(request, cache, settings))
        .await
        .unwrap_or_else(|_| {
            Err(FetchError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("timed out after {limit:?}"),
            )))
        })
}

/// What a resource file holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The Wasm filter, loading the cached module at `path`.
    Module { path: PathBuf, sha256: Sha256 },
    /// The module could not be had: the RBAC substitute the failure policy picks.
    Fallback { fallback: Fallback, error: String },
}

/// One ECDS resource, ready to write.
#[derive(Debug, Clone, PartialEq)]
pub struct EcdsResource {
    /// The `TypedExtensionConfig`'s name (see [`resource_name`]).
    pub name: String,
    pub file_name: String,
    /// The file's `version_info`: the resource's version, and the module for a module.
    pub version: String,
    pub filter_type: FilterType,
    pub outcome: Outcome,
    /// The whole file: a discovery response holding the one resource.
    pub document: Value,
}

/// The resource for `p`, given how its pull went.
pub fn resource(p: &WasmPlugin, pulled: Result<&Pulled, &FetchError>) -> EcdsResource {
    let kind = FilterType::from(p.plugin_type);
    let module = pulled.map(|m| (wasm_config(p, kind, &m.path), m.path.as_path(), m.sha256));
    resource_for(p, resource_name(p), module)
}

/// The resource `name` for `p`: the filter `typed_config` loading the cached module at `path`
/// when it could be had, else the failure policy's stand-in, with the error. One shape for
/// every kind of module (Wasm here, Envoy dynamic modules in `crate::serve`).
pub fn resource_for(
    p: &WasmPlugin,
    name: String,
    module: Result<(Value, &Path, Sha256), &FetchError>,
) -> EcdsResource {
    let filter_type = FilterType::from(p.plugin_type);
    let (typed_config, outcome, version) = match module {
        Ok((typed_config, path, sha256)) => (
            typed_config,
            Outcome::Module {
                path: path.to_path_buf(),
                sha256,
            },
            format!("{}-{}", short(p.version()), short(&sha256.to_string())),
        ),
        Err(e) => {
            let fallback = Fallback::for_policy(p.fail_strategy.opens());
            (
                fallback.config(filter_type),
                Outcome::Fallback {
                    fallback,
                    error: crate::reference::redact_for_display(&crate::error::chain(e)),
                },
                format!("{}-{}", short(p.version()), fallback.stat_prefix()),
            )
        }
    };
    let document = json!({
        "version_info": version,
        "resources": [{
            "@type": url::TYPED_EXTENSION_CONFIG,
            "name": name,
            "typed_config": typed_config,
        }],
    });
    EcdsResource {
        name,
        file_name: file_name(p),
        version,
        filter_type,
        outcome,
        document,
    }
}

fn short(s: &str) -> &str {
    s.get(..12).unwrap_or(s)
}

/// The Wasm filter configuration Istio builds for `p`, with the module local.
fn wasm_config(p: &WasmPlugin, kind: FilterType, module: &Path) -> Value {
    let mut vm = json!({
        "runtime": RUNTIME,
        "code": {"local": {"filename": module.display().to_string()}},
    });
    let inline: serde_json::Map<String, Value> = p
        .env
        .iter()
        .filter_map(|e| match &e.value {
            EnvValue::Inline(v) => Some((e.name.clone(), Value::String(v.clone()))),
            EnvValue::Host => None,
        })
        .collect();
    let host: Vec<&str> = p
        .env
        .iter()
        .filter(|e| e.value == EnvValue::Host)
        .map(|e| e.name.as_str())
        .collect();
    if !inline.is_empty() || !host.is_empty() {
        let mut env = json!({});
        if !inline.is_empty() {
            env["key_values"] = Value::Object(inline);
        }
        if !host.is_empty() {
            env["host_env_keys"] = json!(host);
        }
        vm["environment_variables"] = env;
    }
    let mut config = json!({
        "name": p.qualified_name(),
        "failure_policy": match p.fail_strategy {
            FailStrategy::FailOpen => "FAIL_OPEN",
            FailStrategy::FailClose => "FAIL_CLOSED",
            FailStrategy::FailReload => "FAIL_RELOAD",
        },
        "vm_config": vm,
    });
    if let Some(root_id) = &p.plugin_name {
        config["root_id"] = json!(root_id);
    }
    if let Some(pc) = p.plugin_config.as_ref().filter(|c| !c.is_empty()) {
        config["configuration"] = json!({
            "@type": url::STRING_VALUE,
            "value": Value::Object(pc.clone()).to_string(),
        });
    }
    json!({"@type": kind.wasm_type_url(), "config": config})
}

/// The filter-chain entry for `p`: the filter by its ECDS name, read from its file in
/// `ecds_dir` (the directory as Envoy sees it) and reloaded when a file is renamed into that
/// directory. The RBAC type is listed so a fallback can stand in for the Wasm filter.
pub fn filter_entry(p: &WasmPlugin, ecds_dir: &Path) -> Value {
    let kind = FilterType::from(p.plugin_type);
    json!({
        "name": resource_name(p),
        "config_discovery": {
            "config_source": {
                "path_config_source": {
                    "path": ecds_dir.join(file_name(p)).display().to_string(),
                    "watched_directory": {"path": ecds_dir.display().to_string()},
                },
            },
            "type_urls": kind.type_urls(),
        },
    })
}

/// Puts plugins in Istio's filter-chain order: by phase (`AUTHN`, `AUTHZ`, `STATS`, then
/// unspecified), then by priority, highest first (absent counts as 0), then by namespace and
/// name so the order never depends on the order of the input.
pub fn order(plugins: &mut [WasmPlugin]) {
    plugins.sort_by(|a, b| {
        a.phase
            .cmp(&b.phase)
            .then(b.priority.unwrap_or(0).cmp(&a.priority.unwrap_or(0)))
            .then_with(|| a.namespace.cmp(&b.namespace))
            .then_with(|| a.name.cmp(&b.name))
    });
}

/// The entries for a bootstrap, in order: `http_filters` (before the router) and
/// `network_filters` (before the terminal filter); an empty list is left out.
pub fn filter_chain(plugins: &[WasmPlugin], ecds_dir: &Path) -> Value {
    let mut ordered = plugins.to_vec();
    order(&mut ordered);
    let entries = |t| {
        ordered
            .iter()
            .filter(|p| FilterType::from(p.plugin_type) == t)
            .map(|p| filter_entry(p, ecds_dir))
            .collect::<Vec<_>>()
    };
    let mut out = serde_json::Map::new();
    for (key, t) in [
        ("http_filters", FilterType::Http),
        ("network_filters", FilterType::Network),
    ] {
        let list = entries(t);
        if !list.is_empty() {
            out.insert(key.into(), Value::Array(list));
        }
    }
    Value::Object(out)
}

/// A file could not be written; the previous one, if any, is untouched.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {source}", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl EcdsResource {
    /// The file's text (YAML, which Envoy reads by the `.yaml` extension).
    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(&self.document).unwrap_or_else(|_| self.document.to_string())
    }

    /// Writes the file into `dir` whole or not at all: a temp file in `dir` then a rename, so
    /// Envoy watching `dir` sees the old file or the new one, never a part. Returns its path.
    pub fn write_atomically(&self, dir: &Path) -> Result<PathBuf, WriteError> {
        self.write_with_mode(dir, wasm_common::fs::Mode::WorldReadable)
    }

    /// [`Self::write_atomically`], readable as `mode` says (the file holds `pluginConfig` and
    /// `vmConfig.env` values).
    pub fn write_with_mode(
        &self,
        dir: &Path,
        mode: wasm_common::fs::Mode,
    ) -> Result<PathBuf, WriteError> {
        let path = dir.join(&self.file_name);
        write_with_mode(&path, self.to_yaml().as_bytes(), mode)?;
        Ok(path)
    }
}

/// Replaces `path` with `bytes` by a rename from a temp file beside it (same directory, so
/// the rename is atomic), readable by all (Envoy may run as another user).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_with_mode(path, bytes, wasm_common::fs::Mode::WorldReadable)
}

fn write_with_mode(
    path: &Path,
    bytes: &[u8],
    mode: wasm_common::fs::Mode,
) -> Result<(), WriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    wasm_common::fs::write_whole(dir, ".wasm-fetcher-", path, bytes, mode, true).map_err(|source| {
        WriteError {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SignKey;

    fn plugin(extra: &str) -> WasmPlugin {
        let text = format!(
            "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {{name: p, namespace: ns}}\nspec:\n  url: https://h.example/p.wasm\n{extra}"
        );
        WasmPlugin::parse_all(&text).unwrap().remove(0)
    }

    fn pulled() -> Pulled {
        Pulled {
            path: "/cache/modules/sha256/ab.wasm".into(),
            source: "https://h.example/p.wasm".into(),
            sha256: crate::Sha256::parse(&"ab".repeat(32)).unwrap(),
            manifest_digest: None,
            pin: None,
            from_cache: false,
            signature: None,
        }
    }

    #[test]
    fn a_pulled_module_becomes_istios_wasm_filter() {
        let p = plugin(
            "  pluginName: root\n  failStrategy: FAIL_OPEN\n  pluginConfig: {role: x}\n  vmConfig: {env: [{name: A, value: b}, {name: H, valueFrom: HOST}]}\n",
        );
        let r = resource(&p, Ok(&pulled()));
        assert_eq!(r.name, "extensions.istio.io/wasmplugin/ns.p");
        assert_eq!(r.file_name, "ns.p.yaml");
        let res = &r.document["resources"][0];
        assert_eq!(res["@type"], url::TYPED_EXTENSION_CONFIG);
        assert_eq!(res["name"], r.name.as_str());
        let tc = &res["typed_config"];
        assert_eq!(tc["@type"], url::HTTP_WASM);
        let c = &tc["config"];
        assert_eq!(c["name"], "ns.p");
        assert_eq!(c["root_id"], "root");
        assert_eq!(c["failure_policy"], "FAIL_OPEN");
        assert_eq!(c["configuration"]["value"], r#"{"role":"x"}"#);
        let vm = &c["vm_config"];
        assert_eq!(vm["runtime"], RUNTIME);
        assert_eq!(
            vm["code"]["local"]["filename"],
            "/cache/modules/sha256/ab.wasm"
        );
        assert_eq!(vm["environment_variables"]["key_values"]["A"], "b");
        assert_eq!(vm["environment_variables"]["host_env_keys"], json!(["H"]));
    }

    #[test]
    fn a_failed_pull_becomes_the_fallback_of_the_same_type() {
        let e = FetchError::HttpStatus {
            status: 403,
            reason: String::new(),
        };
        let closed = resource(&plugin("  type: NETWORK\n"), Err(&e));
        assert_eq!(
            closed.outcome,
            Outcome::Fallback {
                fallback: Fallback::DenyAll,
                error: "HTTP 403".into()
            }
        );
        assert_eq!(
            closed.document["resources"][0]["typed_config"],
            Fallback::DenyAll.config(FilterType::Network)
        );
        let open = resource(&plugin("  failStrategy: FAIL_OPEN\n"), Err(&e));
        assert_eq!(
            open.document["resources"][0]["typed_config"]["@type"],
            url::HTTP_RBAC
        );
        let reload = resource(&plugin("  failStrategy: FAIL_RELOAD\n"), Err(&e));
        assert!(matches!(
            reload.outcome,
            Outcome::Fallback {
                fallback: Fallback::DenyAll,
                ..
            }
        ));
    }

    #[test]
    fn the_plan_carries_policy_pin_secret_and_version() {
        let sha = "cd".repeat(32);
        let p = plugin(&format!(
            "  sha256: {sha}\n  imagePullPolicy: Always\n  imagePullSecret: creds\n"
        ));
        let req = plan(
            &p,
            &Options {
                pull_secrets: Some("/secrets".into()),
                pull_policy: None,
            },
        );
        assert_eq!(req.url, "https://h.example/p.wasm");
        assert_eq!(req.sha256.map(|s| s.hex()), Some(sha));
        assert_eq!(req.policy, Some(PullPolicy::Always));
        assert_eq!(
            req.resource.as_deref(),
            Some("extensions.istio.io/wasmplugin/ns.p")
        );
        assert_eq!(req.resource_version.as_deref(), Some(p.version()));
        assert_eq!(
            req.pull_secret,
            Some(PathBuf::from("/secrets/ns/creds/.dockerconfigjson")),
            "the plugin's own namespace's secret"
        );
        let never = plan(
            &p,
            &Options {
                pull_secrets: None,
                pull_policy: Some(PullPolicy::Never),
            },
        );
        assert_eq!(never.policy, Some(PullPolicy::Never));
        assert_eq!(never.pull_secret, None);
    }

    #[test]
    fn order_is_phase_then_priority_then_name() {
        let mk = |name: &str, extra: &str| {
            let mut p = plugin(extra);
            p.name = name.into();
            p
        };
        let mut ps = vec![
            mk("none", ""),
            mk("stats", "  phase: STATS\n"),
            mk("authz-low", "  phase: AUTHZ\n  priority: -1\n"),
            mk("authz-b", "  phase: AUTHZ\n"),
            mk("authz-a", "  phase: AUTHZ\n"),
            mk("authz-high", "  phase: AUTHZ\n  priority: 100\n"),
            mk("authn", "  phase: AUTHN\n"),
        ];
        order(&mut ps);
        let names: Vec<_> = ps.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "authn",
                "authz-high",
                "authz-a",
                "authz-b",
                "authz-low",
                "stats",
                "none"
            ]
        );
    }

    #[test]
    fn the_filter_entry_watches_the_file_and_accepts_the_fallback() {
        let e = filter_entry(&plugin("  type: NETWORK\n"), Path::new("/ecds"));
        let cd = &e["config_discovery"];
        assert_eq!(
            cd["config_source"]["path_config_source"]["path"],
            "/ecds/ns.p.yaml"
        );
        assert_eq!(
            cd["config_source"]["path_config_source"]["watched_directory"]["path"],
            "/ecds"
        );
        assert_eq!(
            cd["type_urls"],
            json!([url::NETWORK_WASM, url::NETWORK_RBAC])
        );
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = resource(&plugin(""), Ok(&pulled()));
        let path = r.write_atomically(dir.path()).unwrap();
        let back: Value = serde_norway::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, r.document);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["ns.p.yaml"]);
        let missing = dir.path().join("no/such/dir");
        assert!(r.write_atomically(&missing).is_err());
    }

    #[test]
    fn a_wasmplugins_verification_key_reaches_its_pull_and_a_bad_one_refuses_it() {
        let pem = SignKey::from_scalar(&[4; 32])
            .verify_key()
            .unwrap()
            .to_pem();
        let doc = |key: &str| {
            serde_json::json!({
                "apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
                "metadata": {"name": "p"},
                "spec": {"url": "oci://r.example/f:1", "verificationKey": key},
            })
        };
        let p = WasmPlugin::from_value(&doc(&pem)).unwrap();
        let request = plan(&p, &Default::default());
        assert_eq!(
            request.verify_key,
            Some(crate::VerifyKey::from_pem(&pem).unwrap())
        );
        let e = WasmPlugin::from_value(&doc("not a key")).unwrap_err();
        assert_eq!(e.field, "spec.verificationKey");
        let unset = WasmPlugin::from_value(&doc("")).unwrap();
        assert_eq!(plan(&unset, &Default::default()).verify_key, None);
    }

    #[test]
    fn a_wasmplugins_identity_annotations_reach_its_pull_and_half_an_identity_is_refused() {
        let doc = |annotations: serde_json::Value| {
            serde_json::json!({
                "apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
                "metadata": {"name": "p", "annotations": annotations},
                "spec": {"url": "oci://r.example/f:1"},
            })
        };
        let p = WasmPlugin::from_value(&doc(serde_json::json!({
            "wasm-fetcher.dev/certificate-identity-regexp": "https://github.com/org/.*",
            "wasm-fetcher.dev/certificate-oidc-issuer": "https://token.actions.githubusercontent.com",
            "unrelated": "x",
        })))
        .unwrap();
        let policy = plan(&p, &Default::default()).verify_identity.unwrap();
        assert!(policy
            .subject
            .matches("https://github.com/org/repo/.github/workflows/r.yml@refs/heads/main"));
        assert!(!policy.subject.matches("https://github.com/other/repo"));
        assert!(policy
            .issuer
            .matches("https://token.actions.githubusercontent.com"));
        let e = WasmPlugin::from_value(&doc(serde_json::json!({
            "wasm-fetcher.dev/certificate-identity": "me@example.com",
        })))
        .unwrap_err();
        assert_eq!(e.field, "metadata.annotations");
        assert!(
            e.message
                .contains("wasm-fetcher.dev/certificate-oidc-issuer"),
            "{}",
            e.message
        );
        let none = WasmPlugin::from_value(&doc(serde_json::json!({"a": "b"}))).unwrap();
        assert!(plan(&none, &Default::default()).verify_identity.is_none());
    }
}
