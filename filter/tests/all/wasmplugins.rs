//! `envoy-config/wasmplugins/`: every Istio `WasmPlugin` example parses against the fields and
//! enums of Istio's WasmPlugin API (`extensions.istio.io/v1alpha1`), and its `pluginConfig` is
//! a configuration the filter itself accepts, for the plugin type its role needs.

use std::collections::BTreeMap;

use serde::Deserialize;
use wasm_filter::config::PluginConfig;

use crate::support::root;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resource {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Metadata {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Istio's `WasmPlugin` spec: every field it has, none it lacks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Spec {
    #[serde(default)]
    selector: Option<Selector>,
    #[serde(default)]
    target_ref: Option<TargetRef>,
    #[serde(default)]
    target_refs: Vec<TargetRef>,
    url: String,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    image_pull_policy: Option<PullPolicy>,
    #[serde(default)]
    image_pull_secret: Option<String>,
    #[serde(default)]
    verification_key: Option<String>,
    #[serde(default)]
    plugin_config: Option<serde_json::Value>,
    #[serde(default)]
    plugin_name: Option<String>,
    #[serde(default)]
    phase: Option<Phase>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    fail_strategy: Option<FailStrategy>,
    #[serde(default)]
    vm_config: Option<VmConfig>,
    #[serde(default, rename = "match")]
    matches: Vec<TrafficSelector>,
    #[serde(default, rename = "type")]
    plugin_type: Option<PluginType>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Selector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct TargetRef {
    #[serde(default)]
    group: Option<String>,
    kind: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum PullPolicy {
    #[serde(rename = "UNSPECIFIED_POLICY")]
    Unspecified,
    IfNotPresent,
    Always,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Phase {
    #[serde(rename = "UNSPECIFIED_PHASE")]
    Unspecified,
    Authn,
    Authz,
    Stats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum FailStrategy {
    #[serde(rename = "FAIL_CLOSE")]
    Close,
    #[serde(rename = "FAIL_OPEN")]
    Open,
    #[serde(rename = "FAIL_RELOAD")]
    Reload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum PluginType {
    #[serde(rename = "UNSPECIFIED_PLUGIN_TYPE")]
    Unspecified,
    Http,
    Network,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmConfig {
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct EnvVar {
    name: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    value_from: Option<EnvValueSource>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum EnvValueSource {
    Inline,
    Host,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct TrafficSelector {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    ports: Vec<serde_json::Value>,
}

/// The placeholder the examples carry until a build's digest is put in.
const SHA_PLACEHOLDER: &str = "WASM_FILTER_SHA256";

/// A `WasmPlugin` valid for Istio and for the filter: every field Istio's API has, none it
/// lacks; a `pluginConfig` the filter accepts; the plugin type its role needs. The resource and
/// its role on success, else what is wrong. Shared with the documentation test.
pub fn check(text: &str) -> Result<(Resource, &'static str), String> {
    let r: Resource = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    if r.api_version != "extensions.istio.io/v1alpha1" || r.kind != "WasmPlugin" {
        return Err(format!(
            "not a WasmPlugin: apiVersion {}, kind {}",
            r.api_version, r.kind
        ));
    }
    if r.metadata.name.is_empty() {
        return Err("metadata.name is empty".into());
    }
    let s = &r.spec;
    if !s.url.starts_with("oci://") && !s.url.starts_with("file://") && !s.url.starts_with("http") {
        return Err(format!("spec.url {}: not a scheme Istio pulls", s.url));
    }
    for v in s.vm_config.iter().flat_map(|c| &c.env) {
        // Istio: INLINE (the default) needs a value; HOST reads the proxy's own.
        let ok = match v.value_from.unwrap_or(EnvValueSource::Inline) {
            EnvValueSource::Inline => v.value.is_some(),
            EnvValueSource::Host => v.value.is_none(),
        };
        if !ok {
            return Err(format!(
                "spec.vmConfig.env {}: value and valueFrom disagree",
                v.name
            ));
        }
    }
    let config = s
        .plugin_config
        .as_ref()
        .ok_or("no spec.pluginConfig: the filter refuses a plugin with no role")?;
    let parsed = PluginConfig::parse(config.to_string().as_bytes())
        .map_err(|e| format!("the filter refuses its pluginConfig: {e}"))?;
    let wanted = match parsed {
        PluginConfig::TcpTotalDataSizeCounter(_) => PluginType::Network,
        _ => PluginType::Http,
    };
    if s.plugin_type.unwrap_or(PluginType::Http) != wanted {
        return Err(format!(
            "role {} needs type {wanted:?}, the resource says {:?}",
            parsed.role(),
            s.plugin_type
        ));
    }
    let role = parsed.role();
    Ok((r, role))
}

#[test]
fn every_wasmplugin_example_is_valid_for_istio_and_for_the_filter() {
    let dir = root().join("envoy-config/wasmplugins");
    let mut roles = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let (r, role) = check(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let s = &r.spec;
        assert!(s.url.starts_with("oci://"), "{name}: {}", s.url);
        let selects = s
            .selector
            .as_ref()
            .is_some_and(|x| !x.match_labels.is_empty())
            || s.target_ref.is_some()
            || !s.target_refs.is_empty();
        assert!(selects, "{name}: applies to no workload");
        let sha = s
            .sha256
            .as_deref()
            .unwrap_or_else(|| panic!("{name}: no sha256"));
        assert!(
            sha == SHA_PLACEHOLDER
                || (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())),
            "{name}: sha256 {sha:?}"
        );
        assert!(
            s.image_pull_policy.is_some() && s.image_pull_secret.is_some(),
            "{name}"
        );
        assert!(
            s.phase.is_some() && s.priority.is_some() && s.fail_strategy.is_some(),
            "{name}"
        );
        assert!(s.vm_config.is_some(), "{name}: no vmConfig");
        assert!(s.plugin_type.is_some(), "{name}: no type");
        roles.push(role);
    }
    roles.sort();
    assert_eq!(
        roles,
        [
            "http-body-operation",
            "http-header-operation",
            "rate-limit",
            "stats-aggregator",
            "tcp-total-data-size-counter"
        ]
    );
}

#[test]
fn a_field_or_enum_value_istio_lacks_is_caught() {
    let text =
        std::fs::read_to_string(root().join("envoy-config/wasmplugins/rate-limit.yaml")).unwrap();
    for (from, to) in [
        ("failStrategy: FAIL_OPEN", "failStrategy: OPEN"),
        (
            "imagePullPolicy: IfNotPresent",
            "imagePullPolicy: ifnotpresent",
        ),
        ("phase: AUTHZ", "stage: AUTHZ"),
        ("type: HTTP", "type: TCP"),
    ] {
        assert!(text.contains(from), "{from}");
        let bad = text.replace(from, to);
        assert!(
            serde_norway::from_str::<Resource>(&bad).is_err(),
            "{to} was accepted"
        );
    }
}
