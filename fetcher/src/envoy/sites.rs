//! The one walk over Envoy configuration for its Wasm: every `Any` that is an HTTP or network
//! Wasm filter, or a Wasm service, wherever it sits (a bootstrap, a discovery response, a
//! `TypedExtensionConfig`, a list of them, one filter configuration). A `TypedStruct` whose
//! `type_url` names a Wasm filter counts too, as Envoy unwraps it. Types are matched by type
//! name, as Envoy resolves an `Any` (`wasm_common::envoy_types::name_of`).

use serde_json::{Map, Value};
use wasm_common::envoy_types::{self, name};

use super::fallback::FilterType;

/// What a Wasm `Any` configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Filter(FilterType),
    Service,
}

impl Kind {
    /// The kind a type URL names, if it names a Wasm filter or service.
    pub fn of_type_url(url: &str) -> Option<Self> {
        match envoy_types::name_of(url) {
            name::HTTP_WASM => Some(Self::Filter(FilterType::Http)),
            name::NETWORK_WASM => Some(Self::Filter(FilterType::Network)),
            name::WASM_SERVICE => Some(Self::Service),
            _ => None,
        }
    }
}

/// One Wasm `Any` found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WasmAny<'a> {
    /// The `Any` itself (the `TypedStruct`, when wrapped).
    pub object: &'a Map<String, Value>,
    /// Where it is, as a field path (`resources[0].typed_config`).
    pub at: String,
    /// The same place as a JSON pointer, to reach it again (`Value::pointer_mut`).
    pub pointer: String,
    pub kind: Kind,
    /// Wrapped in a `TypedStruct`: the Wasm message is its `value`, not the `Any` itself.
    pub wrapped: bool,
    /// The name of the `TypedExtensionConfig` it is the `typed_config` of, if any: the
    /// resource it is pulled for.
    pub resource: Option<String>,
}

impl WasmAny<'_> {
    /// The field path of the Wasm message (`…value` inside a `TypedStruct`).
    pub fn message_at(&self) -> String {
        if self.wrapped {
            join(&self.at, "value")
        } else {
            self.at.clone()
        }
    }
}

/// Every Wasm `Any` in `doc`, in document order. The walk does not descend into one it found.
pub fn wasm_anys(doc: &Value) -> Vec<WasmAny<'_>> {
    let mut found = Vec::new();
    walk(doc, "", "", None, &mut found);
    found
}

/// `at.key`, or `key` at the top.
pub fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn walk<'a>(
    v: &'a Value,
    at: &str,
    pointer: &str,
    resource: Option<&str>,
    found: &mut Vec<WasmAny<'a>>,
) {
    match v {
        Value::Object(map) => {
            if let Some((kind, wrapped)) = wasm_kind(map) {
                found.push(WasmAny {
                    object: map,
                    at: at.to_string(),
                    pointer: pointer.to_string(),
                    kind,
                    wrapped,
                    resource: resource.map(String::from),
                });
                return;
            }
            // A TypedExtensionConfig names the resource its typed_config is pulled for (a
            // filter-chain entry has the same shape, but its name is the filter's kind).
            let name = map
                .get("name")
                .and_then(Value::as_str)
                .filter(|_| is_extension_config(map, at));
            for (key, child) in map {
                // Envoy reads proto JSON's spelling too.
                let typed_config = key == "typed_config" || key == "typedConfig";
                let res = if typed_config { name } else { None };
                let ptr = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                walk(child, &join(at, key), &ptr, res.or(resource), found);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let (at, ptr) = (format!("{at}[{i}]"), format!("{pointer}/{i}"));
                walk(child, &at, &ptr, resource, found);
            }
        }
        _ => {}
    }
}

/// A `TypedExtensionConfig`: typed as one, or given as one (the whole input, an item of a
/// list, or an item of a discovery response's `resources`).
fn is_extension_config(map: &Map<String, Value>, at: &str) -> bool {
    let typed = map
        .get("@type")
        .and_then(Value::as_str)
        .is_some_and(|t| envoy_types::name_of(t) == name::TYPED_EXTENSION_CONFIG);
    let top_item = at.is_empty()
        || (at.starts_with('[') && !at.contains('.'))
        || (at.starts_with("resources[") && !at.contains('.'));
    typed || top_item
}

/// Whether this object is a Wasm `Any`, of which kind, and whether a `TypedStruct` wraps it.
fn wasm_kind(map: &Map<String, Value>) -> Option<(Kind, bool)> {
    let t = map.get("@type").and_then(Value::as_str)?;
    if let Some(kind) = Kind::of_type_url(t) {
        return Some((kind, false));
    }
    if envoy_types::is_typed_struct(t) {
        let inner = map
            .get("type_url")
            .or_else(|| map.get("typeUrl"))
            .and_then(Value::as_str)?;
        if let Some(kind @ Kind::Filter(_)) = Kind::of_type_url(inner) {
            return Some((kind, true));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_wasm_anys_wherever_they_are_and_names_their_resource() {
        let doc = json!({
            "resources": [{
                "@type": envoy_types::url::TYPED_EXTENSION_CONFIG,
                "name": "ns.a",
                "typed_config": {"@type": envoy_types::url::HTTP_WASM, "config": {}},
            }],
            "bootstrap_extensions": [{"typed_config": {
                "@type": "example.com/envoy.extensions.wasm.v3.WasmService",
                "config": {"nested": {"@type": envoy_types::url::HTTP_WASM}},
            }}],
            "http_filters": [
                {"name": "f/x", "typed_config": {
                    "@type": envoy_types::url::XDS_TYPED_STRUCT,
                    "type_url": envoy_types::url::NETWORK_WASM,
                    "value": {},
                }},
                {"typed_config": {
                    "@type": envoy_types::url::UDPA_TYPED_STRUCT,
                    "type_url": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                }},
            ],
        });
        let found = wasm_anys(&doc);
        let got: Vec<_> = found
            .iter()
            .map(|w| (w.at.as_str(), w.kind, w.wrapped, w.resource.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "bootstrap_extensions[0].typed_config",
                    Kind::Service,
                    false,
                    None
                ),
                (
                    "http_filters[0].typed_config",
                    Kind::Filter(FilterType::Network),
                    true,
                    None
                ),
                (
                    "resources[0].typed_config",
                    Kind::Filter(FilterType::Http),
                    false,
                    Some("ns.a")
                ),
            ]
        );
        assert_eq!(found[1].pointer, "/http_filters/0/typed_config");
        assert_eq!(found[1].message_at(), "http_filters[0].typed_config.value");
    }
}
