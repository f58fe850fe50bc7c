//! Seeding a request's dynamic metadata in real Envoy: a `header_to_metadata` filter ahead of
//! the Wasm filters turns one hidden header per seeded key (the key's `google.protobuf.Value`,
//! serialized and base64-encoded, so a number, a list or a map keeps its type) into the
//! metadata, and removes the header, so neither the filters nor the upstream see it.
//! `header_to_metadata` takes its keys from its configuration, so the keys every request
//! seeds are known when Envoy starts.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::envoy::http::metadata::protobuf_value;
use crate::envoy::http::{DynamicMetadata, Request};
use crate::envoy::traffic::TrafficError;

/// The hidden header carrying the `i`th seeded key.
const HEADER_PREFIX: &str = "x-wasm-harness-metadata-";

/// The (namespace, key) pairs the requests seed, each once.
pub fn seeded_keys<'a>(
    metadata: impl IntoIterator<Item = &'a DynamicMetadata>,
) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = metadata
        .into_iter()
        .flat_map(|m| {
            m.iter()
                .flat_map(|(ns, fields)| fields.keys().map(|k| (ns.clone(), k.clone())))
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Puts the `header_to_metadata` filter first in every HTTP connection manager of `doc`.
pub(super) fn insert_filter(doc: &mut Value, keys: &[(String, String)]) {
    if keys.is_empty() {
        return;
    }
    let rules: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, (namespace, key))| {
            json!({
                "header": format!("{HEADER_PREFIX}{i}"),
                "on_header_present": {
                    "metadata_namespace": namespace,
                    "key": key,
                    "type": "PROTOBUF_VALUE",
                    "encode": "BASE64",
                },
                "remove": true,
            })
        })
        .collect();
    let filter = json!({
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": rules,
        },
    });
    let listeners = doc
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut);
    for listener in listeners.into_iter().flatten() {
        let chains = listener
            .get_mut("filter_chains")
            .and_then(Value::as_array_mut);
        for chain in chains.into_iter().flatten() {
            let filters = chain.get_mut("filters").and_then(Value::as_array_mut);
            for f in filters.into_iter().flatten() {
                if let Some(Value::Array(http)) = f.pointer_mut("/typed_config/http_filters") {
                    http.insert(0, filter.clone());
                }
            }
        }
    }
}

/// `request` with its dynamic metadata as hidden headers, for the filter [`insert_filter`]
/// configured with `keys`.
pub(super) fn with_headers(
    request: &Request,
    keys: &[(String, String)],
) -> Result<Request, TrafficError> {
    let mut out = request.clone();
    for (namespace, fields) in &request.dynamic_metadata {
        for (key, value) in fields {
            let i = keys
                .iter()
                .position(|(n, k)| n == namespace && k == key)
                .ok_or_else(|| TrafficError::MetadataNotSeeded {
                    namespace: namespace.clone(),
                    key: key.clone(),
                })?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(protobuf_value(value));
            out.headers
                .push((format!("{HEADER_PREFIX}{i}"), encoded.into_bytes()));
        }
    }
    Ok(out)
}
