//! Reading and checking a `WasmPlugin`'s fields with Istio's rules and wording: the URL, the
//! VM environment, the fields accepted and not used, and the shapes (strings, objects, enums,
//! DNS names) every refusal names by its path.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::{
    invalid, EnvValue, EnvVar, FailStrategy, Invalid, Phase, PluginType, API_VERSION, KIND,
};
use crate::Sha256;

pub(super) const SPEC_FIELDS: &[&str] = &[
    "selector",
    "targetRef",
    "targetRefs",
    "url",
    "sha256",
    "imagePullPolicy",
    "imagePullSecret",
    "verificationKey",
    "pluginConfig",
    "pluginName",
    "phase",
    "priority",
    "failStrategy",
    "vmConfig",
    "match",
    "type",
];

/// `apiVersion` and `kind`: the only ones read are Istio's `WasmPlugin`.
pub(super) fn check_kind(top: &Map<String, Value>) -> Result<(), Invalid> {
    for (field, wanted) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match top.get(field) {
            Some(Value::String(v)) if v == wanted => {}
            Some(Value::String(v)) => {
                return Err(invalid(
                    field,
                    format!(
                        "Unsupported value: {:?}: supported values: {wanted:?}{}",
                        crate::shown::shown(v),
                        if field == "kind" {
                            " (TrafficExtension is not read)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
            _ => return Err(invalid(field, "Required value")),
        }
    }
    Ok(())
}

/// What `metadata` names: the plugin, its namespace (`default` when absent) and version.
pub(super) struct Metadata {
    pub name: String,
    pub namespace: String,
    pub resource_version: Option<String>,
}

pub(super) fn metadata(top: &Map<String, Value>) -> Result<Metadata, Invalid> {
    let metadata = object(top.get("metadata"), "metadata")?
        .ok_or_else(|| invalid("metadata", "Required value"))?;
    let name = string(metadata.get("name"), "metadata.name")?
        .ok_or_else(|| invalid("metadata.name", "Required value: name is required"))?;
    check_dns_subdomain(&name, "metadata.name")?;
    let namespace = match string(metadata.get("namespace"), "metadata.namespace")? {
        Some(ns) => {
            check_dns_label(&ns, "metadata.namespace")?;
            ns
        }
        None => "default".to_string(),
    };
    let resource_version = string(metadata.get("resourceVersion"), "metadata.resourceVersion")?;
    Ok(Metadata {
        name,
        namespace,
        resource_version,
    })
}

/// The annotations that name the keyless identity a plugin's module must be signed by
/// (Istio's WasmPlugin has `verificationKey` for a key, and no field for an identity).
pub const IDENTITY_ANNOTATIONS: [&str; 4] = [
    "wasm-fetcher.dev/certificate-identity",
    "wasm-fetcher.dev/certificate-identity-regexp",
    "wasm-fetcher.dev/certificate-oidc-issuer",
    "wasm-fetcher.dev/certificate-oidc-issuer-regexp",
];

/// The keyless identity `metadata.annotations` names, if any.
pub(super) fn identity_policy(
    top: &Map<String, Value>,
) -> Result<Option<crate::keyless::IdentityPolicy>, Invalid> {
    let annotations = top
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object);
    let Some(annotations) = annotations else {
        return Ok(None);
    };
    let mut values: [Option<String>; 4] = Default::default();
    for (slot, key) in values.iter_mut().zip(IDENTITY_ANNOTATIONS) {
        *slot = string(
            annotations.get(key),
            &format!("metadata.annotations[{key}]"),
        )?;
    }
    let names = crate::keyless::PolicyNames {
        identity: values[0].as_deref(),
        identity_regexp: values[1].as_deref(),
        issuer: values[2].as_deref(),
        issuer_regexp: values[3].as_deref(),
    };
    names
        .policy(IDENTITY_ANNOTATIONS)
        .map_err(|e| invalid("metadata.annotations", e))
}

/// `spec`: an object holding only the fields a WasmPlugin has.
pub(super) fn spec_object(top: &Map<String, Value>) -> Result<&Map<String, Value>, Invalid> {
    let spec = match top.get("spec") {
        None | Some(Value::Null) => {
            return Err(invalid("spec", "in body must be of type object: \"null\""))
        }
        Some(Value::Object(s)) => s,
        Some(other) => {
            return Err(invalid(
                "spec",
                format!("in body must be of type object: {:?}", type_name(other)),
            ))
        }
    };
    for key in spec.keys() {
        if !SPEC_FIELDS.contains(&key.as_str()) {
            return Err(invalid(
                format!("spec.{}", crate::shown::shown(key)),
                format!(
                    "unknown field; WasmPlugin's spec has {}",
                    SPEC_FIELDS.join(", ")
                ),
            ));
        }
    }
    Ok(spec)
}

/// `spec.sha256`: empty or 64 lower-case hex characters, as Istio's schema says.
pub(super) fn spec_sha256(spec: &Map<String, Value>) -> Result<Option<Sha256>, Invalid> {
    match string(spec.get("sha256"), "spec.sha256")? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => {
            let lower_hex = s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !lower_hex {
                return Err(invalid(
                    "spec.sha256",
                    "in body should match '(^$|^[a-f0-9]{64}$)': 64 lower-case hex characters (for an oci:// url, the image's manifest digest without \"sha256:\")",
                ));
            }
            Ok(Some(
                Sha256::parse(&s).map_err(|e| invalid("spec.sha256", e))?,
            ))
        }
    }
}

/// Where and how the plugin sits in the chain: `phase`, `priority`, `type`, `failStrategy`.
pub(super) struct Placement {
    pub phase: Phase,
    pub priority: Option<i32>,
    pub plugin_type: PluginType,
    pub fail_strategy: FailStrategy,
}

pub(super) fn placement(spec: &Map<String, Value>) -> Result<Placement, Invalid> {
    let phase = match enumeration(
        spec.get("phase"),
        "spec.phase",
        &["UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"],
    )? {
        Some("AUTHN") => Phase::Authn,
        Some("AUTHZ") => Phase::Authz,
        Some("STATS") => Phase::Stats,
        _ => Phase::Unspecified,
    };
    let priority = match spec.get("priority") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| {
                    invalid(
                        "spec.priority",
                        "in body must be of type int32 (a whole number from -2147483648 to 2147483647)",
                    )
                })?,
        ),
    };
    let plugin_type = match enumeration(
        spec.get("type"),
        "spec.type",
        &["UNSPECIFIED_PLUGIN_TYPE", "HTTP", "NETWORK"],
    )? {
        Some("NETWORK") => PluginType::Network,
        _ => PluginType::Http,
    };
    let fail_strategy = match enumeration(
        spec.get("failStrategy"),
        "spec.failStrategy",
        &["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"],
    )? {
        Some("FAIL_OPEN") => FailStrategy::FailOpen,
        Some("FAIL_RELOAD") => FailStrategy::FailReload,
        _ => FailStrategy::FailClose,
    };
    Ok(Placement {
        phase,
        priority,
        plugin_type,
        fail_strategy,
    })
}

/// `spec.url`: required, a scheme Istio takes (none means `oci://`), and a URL the fetcher
/// can pull.
pub(super) fn spec_url(spec: &Map<String, Value>) -> Result<String, Invalid> {
    let url = string(spec.get("url"), "spec.url")?
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            invalid(
                "spec.url",
                "in body should be at least 1 chars long: the module's oci://, https://, http:// or file:// URL",
            )
        })?;
    let url = match url.split_once("://") {
        Some((scheme, _)) => {
            if !["oci", "http", "https", "file"].contains(&scheme) {
                return Err(invalid(
                    "spec.url",
                    format!(
                        "url must have schema one of [http, https, file, oci], got {:?}",
                        crate::shown::shown(scheme)
                    ),
                ));
            }
            url
        }
        None => format!("oci://{url}"),
    };
    crate::reference::Source::parse(&url).map_err(|e| {
        invalid(
            "spec.url",
            crate::reference::redact_for_display(&e.to_string()),
        )
    })?;
    Ok(url)
}

/// `spec.vmConfig.env`: names present and unique, `value` only for `INLINE`.
pub(super) fn vm_env(spec: &Map<String, Value>) -> Result<Vec<EnvVar>, Invalid> {
    let Some(vm) = object(spec.get("vmConfig"), "spec.vmConfig")? else {
        return Ok(Vec::new());
    };
    if let Some(key) = vm.keys().find(|k| *k != "env") {
        return Err(invalid(
            format!("spec.vmConfig.{}", crate::shown::shown(key)),
            "unknown field; vmConfig has env",
        ));
    }
    let list = match vm.get("env") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(invalid(
                "spec.vmConfig.env",
                format!("in body must be of type array: {:?}", type_name(other)),
            ))
        }
    };
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(list.len().min(256));
    for (i, item) in list.iter().enumerate() {
        let at = format!("spec.vmConfig.env[{i}]");
        let e = object(Some(item), &at)?.ok_or_else(|| invalid(&at, "Required value"))?;
        if let Some(key) = e
            .keys()
            .find(|k| !["name", "value", "valueFrom"].contains(&k.as_str()))
        {
            return Err(invalid(
                format!("{at}.{}", crate::shown::shown(key)),
                "unknown field; an env entry has name, value, valueFrom",
            ));
        }
        let name = non_empty(e.get("name"), &format!("{at}.name"))?.ok_or_else(|| {
            invalid(
                format!("{at}.name"),
                "in body should be at least 1 chars long",
            )
        })?;
        if !seen.insert(name.clone()) {
            return Err(invalid(
                format!("{at}.name"),
                format!("Duplicate value: {:?}", crate::shown::shown(&name)),
            ));
        }
        let from = enumeration(
            e.get("valueFrom"),
            &format!("{at}.valueFrom"),
            &["INLINE", "HOST"],
        )?;
        let value = string(e.get("value"), &format!("{at}.value"))?;
        let value = match (from, value) {
            (Some("HOST"), Some(_)) => {
                return Err(invalid(
                    at,
                    "value may only be set when valueFrom is INLINE",
                ))
            }
            (Some("HOST"), None) => EnvValue::Host,
            (_, v) => EnvValue::Inline(v.unwrap_or_default()),
        };
        out.push(EnvVar { name, value });
    }
    Ok(out)
}

/// The selection fields, checked for shape only.
pub(super) fn tolerated(spec: &Map<String, Value>) -> Result<(), Invalid> {
    if let Some(sel) = object(spec.get("selector"), "spec.selector")? {
        if let Some(labels) = object(sel.get("matchLabels"), "spec.selector.matchLabels")? {
            for (k, v) in labels {
                if k.contains('*') {
                    return Err(invalid(
                        "spec.selector.matchLabels",
                        "wildcard not allowed in label key match",
                    ));
                }
                if v.as_str().is_some_and(|v| v.contains('*')) {
                    return Err(invalid(
                        "spec.selector.matchLabels",
                        "wildcard not allowed in label value match",
                    ));
                }
            }
        }
    }
    object(spec.get("targetRef"), "spec.targetRef")?;
    for field in ["targetRefs", "match"] {
        match spec.get(field) {
            None | Some(Value::Null) | Some(Value::Array(_)) => {}
            Some(other) => {
                return Err(invalid(
                    format!("spec.{field}"),
                    format!("in body must be of type array: {:?}", type_name(other)),
                ))
            }
        }
    }
    Ok(())
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(super) fn string(v: Option<&Value>, field: &str) -> Result<Option<String>, Invalid> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(
            field,
            format!("in body must be of type string: {:?}", type_name(other)),
        )),
    }
}

/// A string field that, when present, must not be empty (the CRD's `minLength: 1`).
pub(super) fn non_empty(v: Option<&Value>, field: &str) -> Result<Option<String>, Invalid> {
    match string(v, field)? {
        Some(s) if s.is_empty() => Err(invalid(field, "in body should be at least 1 chars long")),
        other => Ok(other),
    }
}

pub(super) fn object<'a>(
    v: Option<&'a Value>,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, Invalid> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(invalid(
            field,
            format!("in body must be of type object: {:?}", type_name(other)),
        )),
    }
}

/// An enum field: one of `allowed`, spelled exactly (Istio's enums are case-sensitive).
pub(super) fn enumeration<'a>(
    v: Option<&Value>,
    field: &str,
    allowed: &[&'a str],
) -> Result<Option<&'a str>, Invalid> {
    let Some(s) = string(v, field)? else {
        return Ok(None);
    };
    allowed
        .iter()
        .find(|a| **a == s)
        .map(|a| Some(*a))
        .ok_or_else(|| {
            let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
            invalid(
                field,
                format!(
                    "Unsupported value: {:?}: supported values: {}",
                    crate::shown::shown(&s),
                    list.join(", ")
                ),
            )
        })
}

/// A DNS-1123 subdomain (a Kubernetes object name): it also becomes a file name, so no
/// `/` and no `..` can reach the file system.
pub(super) fn check_dns_subdomain(s: &str, field: &str) -> Result<(), Invalid> {
    let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(|label| dns_label(label, 63));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "Invalid value: {:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                crate::shown::shown(s)
            ),
        ))
    }
}

pub(super) fn check_dns_label(s: &str, field: &str) -> Result<(), Invalid> {
    if dns_label(s, 63) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "Invalid value: {:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                crate::shown::shown(s)
            ),
        ))
    }
}

pub(super) fn dns_label(s: &str, max: usize) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= max
        && bytes.iter().all(|&c| alnum(c) || c == b'-')
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
}
