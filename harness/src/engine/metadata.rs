//! A request's dynamic metadata as a scenario seeds it (`dynamic_metadata: {NAMESPACE: {KEY:
//! VALUE}}`), and its protobuf encoding: Envoy's `metadata` property is the serialized
//! `envoy.config.core.v3.Metadata`, and the real-Envoy driver carries each value to
//! `header_to_metadata` as a serialized `google.protobuf.Value`.
//!
//! Values follow `google.protobuf.Struct`: numbers are doubles, maps are Structs, lists
//! ListValues.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Namespace (`filter_metadata` key) to the Struct under it.
pub type DynamicMetadata = BTreeMap<String, Map<String, Value>>;

/// `bytes` as a length-delimited protobuf field `field`.
fn delimited(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field << 3 | 2));
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A `google.protobuf.Value`.
pub fn protobuf_value(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        // null_value = 1 (NULL_VALUE, 0).
        Value::Null => out.extend_from_slice(&[1 << 3, 0]),
        Value::Number(n) => {
            out.push(2 << 3 | 1); // number_value = 2, a fixed64 double
            out.extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
        }
        Value::String(s) => delimited(&mut out, 3, s.as_bytes()),
        Value::Bool(b) => out.extend_from_slice(&[4 << 3, u8::from(*b)]),
        Value::Object(m) => delimited(&mut out, 5, &protobuf_struct(m)),
        Value::Array(a) => {
            let mut list = Vec::new();
            for item in a {
                delimited(&mut list, 1, &protobuf_value(item));
            }
            delimited(&mut out, 6, &list);
        }
    }
    out
}

/// A `google.protobuf.Struct`: its `fields` map, one entry (key 1, value 2) per field.
fn protobuf_struct(m: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in m {
        let mut entry = Vec::new();
        delimited(&mut entry, 1, k.as_bytes());
        delimited(&mut entry, 2, &protobuf_value(v));
        delimited(&mut out, 1, &entry);
    }
    out
}

/// An `envoy.config.core.v3.Metadata` holding `metadata` as its `filter_metadata` (field 1),
/// namespaces and keys in sorted order (Envoy writes a map's entries in its hash order).
pub fn protobuf_metadata(metadata: &DynamicMetadata) -> Vec<u8> {
    let mut out = Vec::new();
    for (namespace, fields) in metadata {
        let mut entry = Vec::new();
        delimited(&mut entry, 1, namespace.as_bytes());
        delimited(&mut entry, 2, &protobuf_struct(fields));
        delimited(&mut out, 1, &entry);
    }
    out
}

/// Whether `metadata` holds a map of more than one entry (namespaces included), whose
/// entries Envoy lists in no fixed order when a guest reads it whole.
pub fn has_unordered_map(metadata: &DynamicMetadata) -> bool {
    fn value(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.len() > 1 || m.values().any(value),
            Value::Array(a) => a.iter().any(value),
            _ => false,
        }
    }
    metadata.len() > 1
        || metadata
            .values()
            .any(|fields| fields.len() > 1 || fields.values().any(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_encode_as_protobuf_does() {
        // Known encodings (protoc --encode=google.protobuf.Value).
        assert_eq!(protobuf_value(&json!("ab")), [0x1a, 2, b'a', b'b']);
        assert_eq!(protobuf_value(&json!(true)), [0x20, 1]);
        assert_eq!(protobuf_value(&json!(2)), [0x11, 0, 0, 0, 0, 0, 0, 0, 0x40]);
        assert_eq!(protobuf_value(&json!(null)), [0x08, 0]);
        assert_eq!(
            protobuf_value(&json!(["a"])),
            [0x32, 5, 0x0a, 3, 0x1a, 1, b'a']
        );
        assert_eq!(
            protobuf_value(&json!({"k": "v"})),
            [0x2a, 10, 0x0a, 8, 0x0a, 1, b'k', 0x12, 3, 0x1a, 1, b'v']
        );
    }

    #[test]
    fn metadata_nests_namespaces_over_structs() {
        let mut md = DynamicMetadata::new();
        md.insert("n".into(), json!({"k": true}).as_object().cloned().unwrap());
        // Metadata{filter_metadata: {n: Struct{k: true}}}
        assert_eq!(
            protobuf_metadata(&md),
            [0x0a, 14, 0x0a, 1, b'n', 0x12, 9, 0x0a, 7, 0x0a, 1, b'k', 0x12, 2, 0x20, 1]
        );
    }

    #[test]
    fn maps_of_several_entries_are_told_apart() {
        let md = |v: Value| -> DynamicMetadata { serde_json::from_value(v).unwrap() };
        assert!(!has_unordered_map(&md(json!({"a": {"k": [{"x": 1}]}}))));
        assert!(has_unordered_map(&md(
            json!({"a": {"k": 1}, "b": {"k": 1}})
        )));
        assert!(has_unordered_map(&md(json!({"a": {"k": 1, "l": 2}}))));
        assert!(has_unordered_map(&md(
            json!({"a": {"k": [{"x": 1, "y": 2}]}})
        )));
    }
}
