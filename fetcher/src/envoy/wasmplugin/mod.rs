//! Istio's `WasmPlugin` (`extensions.istio.io/v1alpha1`), read from YAML or JSON and checked
//! the way Istio's admission checks it: each refusal names the field as Kubernetes does
//! (`spec.sha256`, `spec.vmConfig.env[1].name`) with Istio's wording, so a resource this
//! accepts is one `kubectl apply` accepts, and the other way round.
//!
//! Workload selection (`selector`, `targetRef(s)`, `match`) is accepted and not used: a
//! resource given here is meant for the proxy beside this fetcher. `verificationKey`, which
//! Istio accepts and ignores, is read as what its name says: a PEM public key the module's
//! cosign signature must verify with (`crate::oci::cosign`).

use serde_json::{Map, Value};

use crate::{PullPolicy, Sha256};

mod fields;

use fields::*;

pub const API_VERSION: &str = "extensions.istio.io/v1alpha1";
pub const KIND: &str = "WasmPlugin";

/// The most a file of WasmPlugin resources may hold: Kubernetes caps an object at about 1.5 MiB
/// and a file may hold several. `render`, `prefetch` and `serve` read their inputs within it.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// One `WasmPlugin`, validated; enum fields resolved to their meaning.
#[derive(Debug, Clone, PartialEq)]
pub struct WasmPlugin {
    pub name: String,
    /// `metadata.namespace`, `default` when absent (where `kubectl apply` would put it).
    pub namespace: String,
    /// `metadata.resourceVersion`, if the resource carries one (exported from a cluster).
    pub resource_version: Option<String>,
    /// Hex sha256 of the whole document: any change to it, metadata included, is a new
    /// version (Istio's `Always` re-pulls on any change to the object).
    pub content_digest: String,
    /// `spec.url` with `oci://` put in front when it names no scheme, as Istio does.
    pub url: String,
    pub sha256: Option<Sha256>,
    /// `None` for `UNSPECIFIED_POLICY` or no field: the URL decides (see `crate::pull::policy`).
    pub image_pull_policy: Option<PullPolicy>,
    pub image_pull_secret: Option<String>,
    /// `spec.pluginConfig`, handed to the module as JSON text.
    pub plugin_config: Option<Map<String, Value>>,
    /// `spec.pluginName`: the module's root id.
    pub plugin_name: Option<String>,
    pub phase: Phase,
    pub priority: Option<i32>,
    pub plugin_type: PluginType,
    pub fail_strategy: FailStrategy,
    pub env: Vec<EnvVar>,
    /// `spec.verificationKey`: the module must carry a cosign signature by this key.
    pub verify_key: Option<crate::VerifyKey>,
    /// `metadata.annotations["wasm-fetcher.dev/certificate-identity"]` and its siblings: the
    /// module must carry a keyless signature by this identity, under the operator's trusted
    /// root.
    pub verify_identity: Option<crate::keyless::IdentityPolicy>,
}

/// Where in the filter chain a plugin goes (Istio: before its own authn, authz, stats
/// filters; `Unspecified` after all of them, just before the router).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Authn,
    Authz,
    Stats,
    Unspecified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginType {
    Http,
    Network,
}

/// What the proxy does when the module cannot be fetched or fails. `FailReload` reloads a
/// VM that failed at run time; a module that cannot be fetched fails closed under it, as in
/// Istio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailStrategy {
    FailClose,
    FailOpen,
    FailReload,
}

impl FailStrategy {
    /// Whether traffic passes when the module cannot be fetched.
    pub fn opens(self) -> bool {
        self == FailStrategy::FailOpen
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: EnvValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// `valueFrom: INLINE` (the default) with this `value`.
    Inline(String),
    /// `valueFrom: HOST`: the proxy's own environment variable of that name.
    Host,
}

/// Why a resource was refused: the field, as Kubernetes names it, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// A refusal in a file of several documents: which document (from 1), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error("not YAML or JSON: {0}")]
    Syntax(String),
    #[error("document {index}: {error}")]
    Invalid { index: usize, error: Invalid },
    #[error("no WasmPlugin in it (an empty file, or only empty documents)")]
    Empty,
}

impl WasmPlugin {
    /// Every `WasmPlugin` in `text`: one YAML or JSON document, or several separated by
    /// `---`. Empty documents are skipped; any other refused document refuses the whole text,
    /// so nothing is rendered from half a file.
    pub fn parse_all(text: &str) -> Result<Vec<WasmPlugin>, DocumentError> {
        let docs: Vec<Value> = wasm_common::yaml::from_str_all(text)
            .map_err(|e| DocumentError::Syntax(crate::shown::shown(&e.to_string())))?;
        let mut out = Vec::new();
        for (i, value) in docs.into_iter().enumerate() {
            if value.is_null() {
                continue;
            }
            let plugin = Self::from_value(&value).map_err(|error| DocumentError::Invalid {
                index: i + 1,
                error,
            })?;
            out.push(plugin);
        }
        if out.is_empty() {
            return Err(DocumentError::Empty);
        }
        Ok(out)
    }

    /// One resource, already parsed as JSON.
    pub fn from_value(doc: &Value) -> Result<WasmPlugin, Invalid> {
        let top = doc
            .as_object()
            .ok_or_else(|| invalid("(document)", "must be of type object"))?;
        check_kind(top)?;
        let Metadata {
            name,
            namespace,
            resource_version,
        } = metadata(top)?;
        let spec = spec_object(top)?;
        let url = spec_url(spec)?;
        let sha256 = spec_sha256(spec)?;
        let image_pull_policy = match enumeration(
            spec.get("imagePullPolicy"),
            "spec.imagePullPolicy",
            &["UNSPECIFIED_POLICY", "IfNotPresent", "Always"],
        )? {
            Some("IfNotPresent") => Some(PullPolicy::IfNotPresent),
            Some("Always") => Some(PullPolicy::Always),
            _ => None,
        };
        // A Secret's name, looked up in the plugin's own namespace (as Istio does): it becomes
        // a path segment, so no `/`, `..` or absolute path can reach another file.
        let image_pull_secret = non_empty(spec.get("imagePullSecret"), "spec.imagePullSecret")?;
        if let Some(s) = &image_pull_secret {
            check_dns_subdomain(s, "spec.imagePullSecret")?;
        }
        let plugin_config = object(spec.get("pluginConfig"), "spec.pluginConfig")?.cloned();
        let plugin_name = non_empty(spec.get("pluginName"), "spec.pluginName")?;
        let Placement {
            phase,
            priority,
            plugin_type,
            fail_strategy,
        } = placement(spec)?;
        let env = vm_env(spec)?;
        tolerated(spec)?;
        let verify_key = match string(spec.get("verificationKey"), "spec.verificationKey")? {
            Some(pem) if !pem.is_empty() => Some(
                crate::VerifyKey::from_pem(&pem).map_err(|e| invalid("spec.verificationKey", e))?,
            ),
            _ => None,
        };
        let verify_identity = identity_policy(top)?;
        Ok(WasmPlugin {
            name,
            namespace,
            resource_version,
            content_digest: Sha256::of(doc.to_string().as_bytes()).hex(),
            url,
            sha256,
            image_pull_policy,
            image_pull_secret,
            plugin_config,
            plugin_name,
            phase,
            priority,
            plugin_type,
            fail_strategy,
            env,
            verify_key,
            verify_identity,
        })
    }

    /// `<namespace>.<name>`: the plugin's name in Envoy (`PluginConfig.name`), as Istio names it.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// The version a pull under `Always` compares: `metadata.resourceVersion` when the resource
    /// has one, else the digest of its content.
    pub fn version(&self) -> &str {
        self.resource_version
            .as_deref()
            .unwrap_or(&self.content_digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: header-ops, namespace: edge}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  url: registry.example.com/filters/f:1.0
  sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  imagePullPolicy: Always
  imagePullSecret: creds
  pluginName: headers
  phase: AUTHZ
  priority: 10
  type: NETWORK
  failStrategy: FAIL_OPEN
  vmConfig:
    env:
    - {name: A, value: "1"}
    - {name: POD_NAME, valueFrom: HOST}
  pluginConfig: {role: tcp-total-data-size-counter}
"#;

    fn parse(text: &str) -> Result<WasmPlugin, DocumentError> {
        WasmPlugin::parse_all(text).map(|mut v| v.remove(0))
    }

    #[test]
    fn every_field_is_read() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.qualified_name(), "edge.header-ops");
        assert_eq!(p.url, "oci://registry.example.com/filters/f:1.0");
        assert_eq!(p.image_pull_policy, Some(PullPolicy::Always));
        assert_eq!(p.image_pull_secret.as_deref(), Some("creds"));
        assert_eq!(p.plugin_name.as_deref(), Some("headers"));
        assert_eq!((p.phase, p.priority), (Phase::Authz, Some(10)));
        assert_eq!(p.plugin_type, PluginType::Network);
        assert!(p.fail_strategy.opens());
        assert_eq!(
            p.env,
            [
                EnvVar {
                    name: "A".into(),
                    value: EnvValue::Inline("1".into())
                },
                EnvVar {
                    name: "POD_NAME".into(),
                    value: EnvValue::Host
                }
            ]
        );
        assert_eq!(p.version(), p.content_digest);
        let changed = parse(&GOOD.replace("priority: 10", "priority: 11")).unwrap();
        assert_ne!(changed.version(), p.version());
    }

    #[test]
    fn defaults_are_istios() {
        let p = parse(
            "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec: {url: 'https://h/a.wasm'}\n",
        )
        .unwrap();
        assert_eq!(p.namespace, "default");
        assert_eq!(p.phase, Phase::Unspecified);
        assert_eq!(p.plugin_type, PluginType::Http);
        assert_eq!(p.fail_strategy, FailStrategy::FailClose);
        assert_eq!(p.image_pull_policy, None);
        assert!(p.plugin_config.is_none() && p.env.is_empty());
    }

    #[test]
    fn several_documents_and_empty_ones() {
        let two = format!(
            "---\n{GOOD}\n---\n{}\n---\n",
            GOOD.replace("header-ops", "b")
        );
        let all = WasmPlugin::parse_all(&two).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].name, "b");
        assert_eq!(WasmPlugin::parse_all("---\n"), Err(DocumentError::Empty));
    }

    #[test]
    fn aliases_expanding_past_the_file_are_refused_before_any_resource_is_read() {
        let anchor = format!("x: &a [{}]\n", vec!["0"; 2_000].join(","));
        let text = format!("{GOOD}\n---\n{anchor}y: [{}]\n", vec!["*a"; 500].join(","));
        match WasmPlugin::parse_all(&text) {
            Err(DocumentError::Syntax(e)) => assert!(e.contains("aliases expand"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    /// Each refusal names the field as Istio's validation does.
    #[test]
    fn refusals_name_the_field() {
        for (from, to, field, words) in [
            (
                "url: registry.example.com/filters/f:1.0",
                "url: ''",
                "spec.url",
                "at least 1 chars",
            ),
            (
                "url: registry.example.com/filters/f:1.0",
                "url: 'fake://x/y'",
                "spec.url",
                "schema one of",
            ),
            (
                "url: registry.example.com/filters/f:1.0",
                "url: 'oci://h/Up:1'",
                "spec.url",
                "lower-case",
            ),
            (
                "sha256: 0123456789abcdef",
                "sha256: 0123456789ABCDEF",
                "spec.sha256",
                "should match",
            ),
            (
                "imagePullPolicy: Always",
                "imagePullPolicy: always",
                "spec.imagePullPolicy",
                "Unsupported value: \"always\"",
            ),
            (
                "imagePullSecret: creds",
                "imagePullSecret: ''",
                "spec.imagePullSecret",
                "at least 1 chars",
            ),
            (
                "imagePullSecret: creds",
                "imagePullSecret: ../creds",
                "spec.imagePullSecret",
                "RFC 1123 subdomain",
            ),
            (
                "imagePullSecret: creds",
                "imagePullSecret: /etc/creds",
                "spec.imagePullSecret",
                "RFC 1123 subdomain",
            ),
            (
                "imagePullSecret: creds",
                "imagePullSecret: other-namespace/creds",
                "spec.imagePullSecret",
                "RFC 1123 subdomain",
            ),
            (
                "pluginName: headers",
                "pluginName: ''",
                "spec.pluginName",
                "at least 1 chars",
            ),
            (
                "phase: AUTHZ",
                "phase: authz",
                "spec.phase",
                "supported values",
            ),
            ("priority: 10", "priority: 1.5", "spec.priority", "int32"),
            (
                "priority: 10",
                "priority: 3000000000",
                "spec.priority",
                "int32",
            ),
            (
                "type: NETWORK",
                "type: TCP",
                "spec.type",
                "\"HTTP\", \"NETWORK\"",
            ),
            (
                "failStrategy: FAIL_OPEN",
                "failStrategy: OPEN",
                "spec.failStrategy",
                "FAIL_CLOSE",
            ),
            (
                "- {name: A, value: \"1\"}",
                "- {name: '', value: \"1\"}",
                "spec.vmConfig.env[0].name",
                "at least 1 chars",
            ),
            (
                "- {name: A, value: \"1\"}",
                "- {name: POD_NAME}",
                "spec.vmConfig.env[1].name",
                "Duplicate value",
            ),
            (
                "- {name: POD_NAME, valueFrom: HOST}",
                "- {name: P, valueFrom: HOST, value: x}",
                "spec.vmConfig.env[1]",
                "only be set when valueFrom is INLINE",
            ),
            (
                "pluginConfig: {role: tcp-total-data-size-counter}",
                "pluginConfig: [1]",
                "spec.pluginConfig",
                "type object",
            ),
            (
                "phase: AUTHZ",
                "stage: AUTHZ",
                "spec.stage",
                "unknown field",
            ),
            (
                "{istio: ingressgateway}",
                "{istio: 'bar*'}",
                "spec.selector.matchLabels",
                "wildcard",
            ),
            (
                "name: header-ops",
                "name: ../etc",
                "metadata.name",
                "RFC 1123",
            ),
            (
                "namespace: edge",
                "namespace: a.b",
                "metadata.namespace",
                "RFC 1123",
            ),
            (
                "kind: WasmPlugin",
                "kind: EnvoyFilter",
                "kind",
                "Unsupported value",
            ),
            ("v1alpha1", "v1", "apiVersion", "Unsupported value"),
        ] {
            assert!(GOOD.contains(from), "{from}");
            let text = GOOD.replace(from, to);
            match parse(&text) {
                Err(DocumentError::Invalid { index: 1, error }) => {
                    assert_eq!(error.field, field, "{to}: {error}");
                    assert!(error.message.contains(words), "{to}: {error}");
                }
                other => panic!("{to}: {other:?}"),
            }
        }
        let no_spec = "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: a}\nspec:\n";
        assert!(parse(no_spec)
            .unwrap_err()
            .to_string()
            .contains("spec: in body must be of type object: \"null\""));
        assert!(matches!(parse("a: [b"), Err(DocumentError::Syntax(_))));
    }
}
