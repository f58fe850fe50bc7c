//! Every bootstrap field the harness reads, brought into one form before the bootstrap is
//! parsed, accepting each shape Envoy's YAML/JSON loader accepts (checked with `envoy --mode
//! validate`, see `testdata/bootstraps/`): camelCase names (`portValue`), a single value where
//! a list is expected (`domains: "*"`, `listeners: {name: ...}`), numbers written as strings
//! (`port_value: "10000"`, `0x2710`, `1e4`), booleans as YAML 1.1 words (`singleton: yes`,
//! `"True"`), enums by number (`failure_policy: 1`), and `TypedStruct`-wrapped `typed_config`.
//! A field of a type Envoy would refuse too (`listeners: 5`, `fail_open: 1`) is an error naming
//! it and the type it needs, instead of a field quietly read as absent. Then
//! [`super::fields::refuse_unemulated`] refuses, by name, the fields the harness does not
//! emulate.

use serde_json::Value;

use super::model::{invalid, BootstrapError};
use super::typed_config;

#[derive(Clone, Copy)]
pub(super) enum Kind {
    List,
    Map,
    /// A `google.protobuf.Any` (a map with `@type`), possibly a `TypedStruct`.
    Any,
    Text,
    Number,
    Bool,
    /// An enum: its names with their numbers.
    Enum(&'static [(&'static str, u64)]),
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::List => "a list",
            Kind::Map | Kind::Any => "a map",
            Kind::Text => "a string",
            Kind::Number => "a number",
            Kind::Bool => "true or false",
            Kind::Enum(_) => "one of the enum's names or numbers",
        }
    }

    /// Brings `v` (found at `at`) into this kind's one form, or says why it is not of it.
    fn normalize(self, at: &str, v: &mut Value, typed: TypedStructs) -> Result<(), BootstrapError> {
        match (self, &*v) {
            (Kind::List, Value::Array(_))
            | (Kind::Map, Value::Object(_))
            | (Kind::Text, Value::String(_))
            | (Kind::Bool, Value::Bool(_)) => Ok(()),
            // Protobuf's JSON reader takes one value for a repeated field as a list of one.
            (Kind::List, _) => {
                let one = v.take();
                *v = Value::Array(vec![one]);
                Ok(())
            }
            (Kind::Any, Value::Object(_)) if typed == TypedStructs::Unwrap => {
                typed_config::unwrap_typed_struct(at, v)
            }
            (Kind::Any, Value::Object(_)) => Ok(()),
            (Kind::Number, _) => match unsigned(v) {
                Some(n) => {
                    *v = Value::from(n);
                    Ok(())
                }
                None => Err(wrong(at, self, v)),
            },
            (Kind::Bool, Value::String(s)) => match yaml_bool(s) {
                Some(b) => {
                    *v = Value::Bool(b);
                    Ok(())
                }
                None => Err(wrong(at, self, v)),
            },
            (Kind::Enum(names), Value::String(s)) if names.iter().any(|(n, _)| n == s) => Ok(()),
            (Kind::Enum(names), _) => match unsigned(v) {
                Some(n) => match names.iter().find(|(_, number)| *number == n) {
                    Some((name, _)) => {
                        *v = Value::String(name.to_string());
                        Ok(())
                    }
                    None => Err(invalid(at, format!("{n} is not a value of this enum"))),
                },
                // An unknown name: the parser names the values it knows.
                None if v.is_string() => Ok(()),
                None => Err(wrong(at, self, v)),
            },
            _ => Err(wrong(at, self, v)),
        }
    }
}

/// An unsigned integer as protobuf's JSON reader takes one: a number (`10000.0` and `1e4`
/// too) or a string holding one (Envoy's YAML loader also reads `0x2710`).
fn unsigned(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => {
            let s = s.trim();
            if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                return u64::from_str_radix(hex, 16).ok();
            }
            s.parse::<u64>()
                .ok()
                .or_else(|| unsigned(&Value::from(s.parse::<f64>().ok()?)))
        }
        _ => None,
    }
}

/// The words Envoy's YAML loader (yaml-cpp) reads as booleans, quoted or not.
fn yaml_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "y" | "Y" | "on" | "On" | "ON" => {
            Some(true)
        }
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "n" | "N" | "off" | "Off" | "OFF" => {
            Some(false)
        }
        _ => None,
    }
}

/// `port_value` -> `portValue`: the name protobuf's JSON form also accepts.
pub(super) fn camel_case(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `portValue` -> `port_value`.
pub(super) fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `at` joined with `key` as a field path.
pub(super) fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// What [`normalize`] does with a `TypedStruct`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TypedStructs {
    /// Replace it by the message it carries (the parser reads one form).
    Unwrap,
    /// Leave it, and what is inside it, as written: for a document handed to real Envoy,
    /// which should read the user's own spelling of it.
    Keep,
}

/// Brings every field the tables of [`super::fields`] name into one form.
pub fn normalize(doc: &mut Value, typed: TypedStructs) -> Result<(), BootstrapError> {
    for (path, kind) in super::fields::all() {
        visit("", doc, &path, kind, typed)?;
    }
    Ok(())
}

/// Follows `path` (`.` between keys, `[]` after a list whose every item the rest applies to)
/// from `v` (found at `at`), normalizing what it reaches; absent fields and `null` are left to
/// the parser, which knows which are required.
fn visit(
    at: &str,
    v: &mut Value,
    path: &str,
    kind: Kind,
    typed: TypedStructs,
) -> Result<(), BootstrapError> {
    let (segment, rest) = match path.split_once('.') {
        Some((s, r)) => (s, Some(r)),
        None => (path, None),
    };
    let (key, each) = match segment.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (segment, false),
    };
    let here = join(at, key);
    let Some(found) = field(at, v, key)?.filter(|f| !f.is_null()) else {
        return Ok(());
    };
    if !each {
        return match rest {
            None => kind.normalize(&here, found, typed),
            Some(rest) => visit(&here, found, rest, kind, typed),
        };
    }
    Kind::List.normalize(&here, found, typed)?;
    let Value::Array(items) = found else {
        return Ok(());
    };
    for (i, item) in items.iter_mut().enumerate() {
        let at_item = format!("{here}[{i}]");
        match rest {
            None => kind.normalize(&at_item, item, typed)?,
            Some(rest) => visit(&at_item, item, rest, kind, typed)?,
        }
    }
    Ok(())
}

/// `v[key]`, found under its camelCase name too (renamed to `key`, so the parser reads one
/// name); both names at once is an error, since which one Envoy keeps is not documented.
fn field<'a>(
    at: &str,
    v: &'a mut Value,
    key: &str,
) -> Result<Option<&'a mut Value>, BootstrapError> {
    let Some(map) = v.as_object_mut() else {
        return Ok(None);
    };
    let camel = camel_case(key);
    if camel != key {
        if let Some(value) = map.remove(&camel) {
            if map.contains_key(key) {
                return Err(invalid(
                    &join(at, key),
                    format!("both {key} and {camel} are set: keep one"),
                ));
            }
            map.insert(key.to_string(), value);
        }
    }
    Ok(map.get_mut(key))
}

fn wrong(at: &str, kind: Kind, found: &Value) -> BootstrapError {
    let what = match found {
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "a map".to_string(),
        Value::String(s) if s.len() > 40 => "a string".to_string(),
        Value::String(s) => format!("a string ({s:?})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::Bool(b) => format!("{b}"),
        Value::Null => "nothing".to_string(),
    };
    invalid(at, format!("expected {}, found {what}", kind.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(yaml: &str) -> Result<Value, String> {
        let mut doc: Value = serde_norway::from_str(yaml).unwrap();
        normalize(&mut doc, TypedStructs::Unwrap)
            .map(|()| doc)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_with_the_type_it_needs() {
        assert_eq!(
            normalized("static_resources: {listeners: [{name: 7}]}").unwrap_err(),
            "bootstrap: static_resources.listeners[0].name: expected a string, found a number (7)"
        );
        let e = normalized(
            "static_resources: {listeners: [{filter_chains: [{filters: [{typed_config: {http_filters: [{typed_config: {config: {fail_open: 1}}}]}}]}]}]}",
        )
        .unwrap_err();
        assert_eq!(
            e,
            "bootstrap: static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.config.fail_open: expected true or false, found a number (1)"
        );
        assert!(normalized("static_resources: 3")
            .unwrap_err()
            .contains("static_resources: expected a map"));
        assert!(normalized("static_resources: {listeners: []}").is_ok());
    }

    #[test]
    fn envoys_other_spellings_become_the_one_the_parser_reads() {
        let doc = normalized(
            r#"
staticResources:
  listeners:
    name: one
    address: {socketAddress: {portValue: "0x2710"}}
    filterChains:
      filters:
        typedConfig:
          route_config: {virtual_hosts: {domains: "*", routes: {match: {prefix: /}, directResponse: {status: 2e2}}}}
          http_filters:
            typed_config:
              config: {failurePolicy: "1", vm_config: {allowPrecompiled: "yes"}}
bootstrap_extensions: {typed_config: {singleton: "True"}}
"#,
        )
        .unwrap();
        let l = &doc["static_resources"]["listeners"][0];
        assert_eq!(l["name"], "one");
        assert_eq!(l["address"]["socket_address"]["port_value"], 10000);
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        let vh = &hcm["route_config"]["virtual_hosts"][0];
        assert_eq!(vh["domains"], serde_json::json!(["*"]));
        assert_eq!(vh["routes"][0]["direct_response"]["status"], 200);
        let config = &hcm["http_filters"][0]["typed_config"]["config"];
        assert_eq!(config["failure_policy"], "FAIL_RELOAD");
        assert_eq!(config["vm_config"]["allow_precompiled"], true);
        assert_eq!(
            doc["bootstrap_extensions"][0]["typed_config"]["singleton"],
            true
        );
    }

    #[test]
    fn both_spellings_of_one_field_are_refused() {
        let e = normalized("static_resources: {listeners: [{name: a, Name: b}]}");
        assert!(e.is_ok(), "only protobuf's camelCase is another name");
        let e = normalized(
            "static_resources: {listeners: [{filter_chains: [{filters: [{typed_config: {stat_prefix: a, statPrefix: b}}]}]}]}",
        )
        .unwrap_err();
        assert!(
            e.contains("filters[0].typed_config.stat_prefix: both stat_prefix and statPrefix"),
            "{e}"
        );
    }

    #[test]
    fn names_convert_both_ways() {
        assert_eq!(camel_case("http2_protocol_options"), "http2ProtocolOptions");
        assert_eq!(snake_case("http2ProtocolOptions"), "http2_protocol_options");
        assert_eq!(snake_case("port_value"), "port_value");
    }
}
