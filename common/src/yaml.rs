//! YAML read from users (bootstraps, scenarios, `WasmPlugin` resources, plugin
//! configurations) with its aliases bounded. A parser replays an
//! alias's whole subtree wherever it is used, so a few KiB of anchors and aliases can stand for
//! gigabytes of values; serde_norway's own limit (100 alias uses per event) still lets a list
//! of 10,000 values used 2,000 times through (20 million values from 26 KB). The document's
//! values are counted, aliases expanded, before it is deserialized: a file may stand for at
//! most one value per byte, which no file without aliases passes.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, VariantAccess, Visitor};

/// Why a document was not read.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("its aliases expand to more than {limit} values (one per byte of the file is allowed): write the repeated parts out, or repeat them less")]
    Expansion { limit: usize },
    #[error("{0}")]
    Syntax(#[from] serde_norway::Error),
}

/// Deserializes `text` once its expanded size is known to be within one value per byte.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    check_expansion(text)?;
    Ok(serde_norway::from_str(text)?)
}

/// Every document of a `---`-separated stream, once the whole stream's expanded size is known
/// to be within one value per byte. A document that does not deserialize ends the stream with
/// its error, so a caller never acts on half a file.
pub fn from_str_all<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, YamlError> {
    check_expansion(text)?;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| T::deserialize(doc).map_err(YamlError::Syntax))
        .collect()
}

/// Counts the values of every document in `text`, aliases expanded, against one budget.
fn check_expansion(text: &str) -> Result<(), YamlError> {
    let limit = text.len().max(1024);
    let mut count = Count {
        left: limit,
        exceeded: false,
    };
    for doc in serde_norway::Deserializer::from_str(text) {
        // A syntax error is left for the real parse, which words it for the user.
        if (&mut count).deserialize(doc).is_err() {
            break;
        }
    }
    if count.exceeded {
        return Err(YamlError::Expansion { limit });
    }
    Ok(())
}

/// Visits every value of a document without keeping any, until `left` runs out.
struct Count {
    left: usize,
    exceeded: bool,
}

impl Count {
    fn tick<E: de::Error>(&mut self) -> Result<(), E> {
        if self.left == 0 {
            self.exceeded = true;
            return Err(E::custom("too many values"));
        }
        self.left -= 1;
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for &mut Count {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &mut Count {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.tick()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.tick()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.tick()
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.tick()
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.tick()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.tick()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.tick()
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        self.tick()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.tick()?;
        while seq.next_element_seed(&mut *self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.tick()?;
        while map.next_key_seed(&mut *self)?.is_some() {
            map.next_value_seed(&mut *self)?;
        }
        Ok(())
    }
    /// A tagged value (`!Tag value`).
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        self.tick()?;
        let (IgnoredAny, variant) = data.variant()?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `n` zeros anchored once, then used `k` times.
    fn bomb(n: usize, k: usize) -> String {
        format!(
            "a: &a [{}]\nb: [{}]\n",
            vec!["0"; n].join(","),
            vec!["*a"; k].join(",")
        )
    }

    #[test]
    fn aliases_that_multiply_a_document_are_refused_before_it_is_built() {
        // 26 KB standing for 20 million values.
        let text = bomb(10_000, 2_000);
        let e = from_str::<serde_json::Value>(&text).unwrap_err();
        assert!(
            matches!(e, YamlError::Expansion { limit } if limit == text.len()),
            "{e}"
        );
        assert!(e.to_string().contains("aliases expand to more than"), "{e}");
    }

    #[test]
    fn a_stream_shares_one_budget_across_its_documents() {
        // Each document alone stays under one value per byte of the whole text; together
        // they do not.
        let one = bomb(100, 40);
        let text = vec![one.as_str(); 40].join("---\n");
        assert!(matches!(
            from_str_all::<serde_json::Value>(&text),
            Err(YamlError::Expansion { .. })
        ));
        let docs: Vec<serde_json::Value> = from_str_all("a: 1\n---\nb: [2, 3]\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1]["b"][1], 3);
        assert!(matches!(
            from_str_all::<serde_json::Value>("a: 1\n---\nb: [2\n"),
            Err(YamlError::Syntax(_))
        ));
    }

    #[test]
    fn ordinary_documents_and_modest_aliases_read_as_before() {
        let v: serde_json::Value = from_str(&bomb(10, 20)).unwrap();
        assert_eq!(v["b"].as_array().unwrap().len(), 20);
        let plain: serde_json::Value = from_str("x: [1, 2, {z: null, w: 'text'}]\n").unwrap();
        assert_eq!(plain["x"][2]["w"], "text");
        assert!(matches!(
            from_str::<serde_json::Value>("x: [1, 2"),
            Err(YamlError::Syntax(_))
        ));
    }
}
