//! `typed_config` and other `google.protobuf.Any` fields: their type names, and the
//! `TypedStruct` wrapper Envoy sees through (`udpa.type.v1.TypedStruct`,
//! `xds.type.v3.TypedStruct`: a `type_url` and the message as a Struct in `value`), which is how
//! every proxy-wasm SDK example's `envoy.yaml` configures its filter.

use serde_json::{Map, Value};

use super::model::{invalid, BootstrapError};

/// Type names the harness understands (a type URL's part after its last `/`): the workspace's
/// one vocabulary of Envoy types.
pub(super) use wasm_common::envoy_types::name as types;
use wasm_common::envoy_types::{is_typed_struct, name_of};

/// The type name of an `Any` (its `@type`), empty when it has none.
pub(super) fn type_name(v: &Value) -> String {
    name_of(v.get("@type").and_then(Value::as_str).unwrap_or_default()).to_string()
}

/// Replaces a `TypedStruct` at `at` by the message it carries, as an ordinary `Any` (`@type`
/// set to its `type_url`, the fields of `value` beside it), so the rest of the parser reads one
/// form. Anything else is left as it is.
pub(super) fn unwrap_typed_struct(at: &str, v: &mut Value) -> Result<(), BootstrapError> {
    if !is_typed_struct(&type_name(v)) {
        return Ok(());
    }
    let Some(wrapper) = v.as_object_mut() else {
        return Ok(());
    };
    let url = match (wrapper.remove("type_url"), wrapper.remove("typeUrl")) {
        (Some(Value::String(url)), None) | (None, Some(Value::String(url))) => url,
        (Some(_), Some(_)) => {
            return Err(invalid(
                at,
                "both type_url and typeUrl are set in the TypedStruct: keep one",
            ))
        }
        _ => {
            return Err(invalid(
                &format!("{at}.type_url"),
                "a TypedStruct needs the type_url of the message in its value",
            ))
        }
    };
    let mut message = match wrapper.remove("value") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(fields)) => fields,
        Some(_) => {
            return Err(invalid(
                &format!("{at}.value"),
                "a TypedStruct's value must be a map (the message's fields)",
            ))
        }
    };
    if message.contains_key("@type") {
        return Err(invalid(
            &format!("{at}.value.@type"),
            "a TypedStruct's value holds the message's fields, not another Any",
        ));
    }
    if name_of(&url).is_empty() {
        return Err(invalid(
            &format!("{at}.type_url"),
            format!("{url:?} names no type"),
        ));
    }
    message.insert("@type".into(), Value::String(url));
    *v = Value::Object(message);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unwrapped(yaml: &str) -> Result<Value, String> {
        let mut v: Value = serde_norway::from_str(yaml).unwrap();
        unwrap_typed_struct("f.typed_config", &mut v)
            .map(|()| v)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn both_typed_struct_names_become_the_message_they_carry() {
        for wrapper in wasm_common::envoy_types::TYPED_STRUCTS {
            let v = unwrapped(&format!(
                "{{'@type': type.googleapis.com/{wrapper}, type_url: type.googleapis.com/{}, value: {{config: {{name: x}}}}}}",
                types::HTTP_WASM
            ))
            .unwrap();
            assert_eq!(type_name(&v), types::HTTP_WASM);
            assert_eq!(v["config"]["name"], "x");
            assert!(v.get("value").is_none() && v.get("type_url").is_none());
        }
        // A bare type name, camelCase typeUrl, and no value at all are accepted, as in Envoy.
        let v = unwrapped(&format!(
            "{{'@type': x.io/xds.type.v3.TypedStruct, typeUrl: {}}}",
            types::ROUTER
        ))
        .unwrap();
        assert_eq!(type_name(&v), types::ROUTER);
    }

    #[test]
    fn a_broken_typed_struct_is_refused_naming_the_field() {
        let e = unwrapped("{'@type': type.googleapis.com/udpa.type.v1.TypedStruct, value: {}}")
            .unwrap_err();
        assert!(e.contains("f.typed_config.type_url"), "{e}");
        let e = unwrapped(
            "{'@type': type.googleapis.com/udpa.type.v1.TypedStruct, type_url: a/b.C, value: [1]}",
        )
        .unwrap_err();
        assert!(e.contains("f.typed_config.value: "), "{e}");
        let plain = unwrapped("{'@type': type.googleapis.com/a.B, x: 1}").unwrap();
        assert_eq!(plain["x"], 1);
    }
}
