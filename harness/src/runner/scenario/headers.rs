//! Header lists as scenarios write them.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::engine::host::HeaderMap;

/// Headers written as a map (`{name: value}`) or, to repeat a name, a list of one-entry maps.
/// Order is kept; names are lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Headers;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of header names to values, or a list of such maps")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, ScalarString>()? {
                    out.push((k.to_ascii_lowercase(), v.0));
                }
                Ok(Headers(out))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some(h) = s.next_element::<Headers>()? {
                    out.extend(h.0);
                }
                Ok(Headers(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A header value written as a YAML scalar: `"1"`, `1` and `true` all mean the text.
struct ScalarString(String);

impl<'de> Deserialize<'de> for ScalarString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(Self(s)),
            serde_json::Value::Number(n) => Ok(Self(n.to_string())),
            serde_json::Value::Bool(b) => Ok(Self(b.to_string())),
            other => Err(de::Error::custom(format!(
                "a header value must be a string, not {other}"
            ))),
        }
    }
}

impl Headers {
    pub fn to_map(&self) -> HeaderMap {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect()
    }
}
