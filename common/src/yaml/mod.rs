//! YAML read from users (bootstraps, scenarios, `WasmPlugin` resources, plugin
//! configurations), bounded before it is built. A parser replays an alias's whole subtree
//! wherever it is used, so a few KiB of anchors and aliases can stand for gigabytes: the
//! document is walked once, aliases expanded, and its expanded size in bytes (every scalar's
//! bytes plus one per value) may be at most twice the file's, which no file without aliases
//! passes. libyaml's scanner does work per token for every open flow collection, so parse time
//! grows with the square of `[`/`{` nesting (50,000 levels take over a minute); nesting and the
//! number of documents are bounded by a linear scan of the text before libyaml sees it.
//! Duplicate keys are refused, as kubectl refuses them, instead of the last one silently winning.

mod shape;

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, VariantAccess, Visitor};

/// Most flow collections (`[`, `{`) open at once, as the scan before parsing finds them;
/// brackets inside strings, block scalars and comments are text, not nesting. serde_norway
/// itself refuses nesting past 128; this bound keeps libyaml's work per token at most this
/// many steps.
pub const MAX_DEPTH: usize = 512;
/// Most documents in one `---`-separated stream.
pub const MAX_DOCUMENTS: usize = 1000;

/// Why a document was not read.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("its aliases expand to more than {limit} bytes (twice the file's size is allowed): write the repeated parts out, or repeat them less")]
    Expansion { limit: usize },
    #[error("by line {line} it nests more than {MAX_DEPTH} flow collections (`[`, `{{`) inside each other: write the inner levels in block style (one `key: value` or `- item` a line), or nest less")]
    TooDeep { line: usize },
    #[error("it holds more than {MAX_DOCUMENTS} documents (`---`): split it into several files")]
    TooManyDocuments,
    #[error("key {key:?} appears twice in one mapping: remove one of them")]
    DuplicateKey { key: String },
    #[error("{0}")]
    Syntax(#[from] serde_norway::Error),
}

/// Deserializes `text` once it is known to be within the bounds above.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    check(text)?;
    Ok(serde_norway::from_str(text)?)
}

/// Every document of a `---`-separated stream, once the whole stream is known to be within
/// the bounds above (one expansion budget for all its documents). A document that does not
/// deserialize ends the stream with its error, so a caller never acts on half a file.
pub fn from_str_all<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, YamlError> {
    check(text)?;
    serde_norway::Deserializer::from_str(text)
        .map(|doc| T::deserialize(doc).map_err(YamlError::Syntax))
        .collect()
}

fn check(text: &str) -> Result<(), YamlError> {
    shape::check(text)?;
    check_expansion(text)
}

/// Walks every document in `text`, aliases expanded, against one byte budget, and refuses
/// a mapping that names a key twice.
fn check_expansion(text: &str) -> Result<(), YamlError> {
    let limit = text.len().saturating_mul(2).max(1024);
    let mut count = Count {
        left: limit,
        failure: None,
    };
    for doc in serde_norway::Deserializer::from_str(text) {
        // A syntax error is left for the real parse, which words it for the user.
        if (&mut count).deserialize(doc).is_err() {
            break;
        }
    }
    match count.failure {
        Some(Failure::Expansion) => Err(YamlError::Expansion { limit }),
        Some(Failure::Duplicate(key)) => Err(YamlError::DuplicateKey { key }),
        None => Ok(()),
    }
}

enum Failure {
    Expansion,
    Duplicate(String),
}

/// Visits every value of a document without keeping any, until `left` bytes run out.
struct Count {
    left: usize,
    failure: Option<Failure>,
}

impl Count {
    fn take<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        match self.left.checked_sub(bytes.saturating_add(1)) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.failure = Some(Failure::Expansion);
                Err(E::custom("too large"))
            }
        }
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
        self.take(0)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.take(0)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.take(0)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.take(0)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.take(0)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.take(0)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.take(s.len())
    }
    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<(), E> {
        self.take(b.len())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.take(0)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.take(0)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.take(0)?;
        while seq.next_element_seed(&mut *self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.take(0)?;
        // Keys are compared as text, as kubectl compares them once YAML is JSON.
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key_seed(Key(&mut *self))? {
            if let Some(key) = key {
                if let Some(dup) = seen.replace(key) {
                    self.failure = Some(Failure::Duplicate(dup));
                    return Err(de::Error::custom("duplicate key"));
                }
            }
            map.next_value_seed(&mut *self)?;
        }
        Ok(())
    }
    /// A tagged value (`!Tag value`).
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        self.take(0)?;
        let (IgnoredAny, variant) = data.variant()?;
        variant.newtype_variant_seed(self)
    }
}

/// A mapping key: counted like any value, and its text kept when it is a scalar.
struct Key<'a>(&'a mut Count);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = Option<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Option<String>, E> {
        self.0.take(0)?;
        Ok(Some(v.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<String>, E> {
        self.0.take(0)?;
        Ok(Some(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<String>, E> {
        self.0.take(0)?;
        Ok(Some(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<String>, E> {
        self.0.take(0)?;
        Ok(Some(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<String>, E> {
        self.0.take(v.len())?;
        Ok(Some(v.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
        self.0.take(0)?;
        Ok(Some("null".to_owned()))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Option<String>, A::Error> {
        self.0.visit_seq(seq)?;
        Ok(None)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Option<String>, A::Error> {
        self.0.visit_map(map)?;
        Ok(None)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Option<String>, A::Error> {
        self.0.visit_enum(data)?;
        Ok(None)
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
            matches!(e, YamlError::Expansion { limit } if limit == 2 * text.len()),
            "{e}"
        );
        assert!(e.to_string().contains("aliases expand to more than"), "{e}");
    }

    #[test]
    fn one_long_string_used_many_times_is_refused_by_its_bytes() {
        // 100 KB anchored once and used 3,000 times: few values, 300 MB of text.
        let text = format!(
            "a: &a {}\nb: [{}]\n",
            "x".repeat(100_000),
            vec!["*a"; 3_000].join(",")
        );
        assert!(matches!(
            from_str::<serde_json::Value>(&text),
            Err(YamlError::Expansion { .. })
        ));
        // The same string used twice is a file's worth of bytes, and reads.
        let text = format!("a: &a {}\nb: *a\n", "x".repeat(100_000));
        let v: serde_json::Value = from_str(&text).unwrap();
        assert_eq!(v["b"].as_str().map(str::len), Some(100_000));
    }

    #[test]
    fn deep_flow_nesting_is_refused_before_libyaml_scans_it() {
        // 50,000 levels keep libyaml busy for over a minute; the scan refuses them at once.
        let text = format!("{}{}", "{a: ".repeat(50_000), "}".repeat(50_000));
        assert!(matches!(
            from_str::<serde_json::Value>(&text),
            Err(YamlError::TooDeep { line: 1 })
        ));
        // Closing brackets hidden in quoted scalars do not lower the count.
        let hidden = format!(
            "{}1{}",
            "[\"]]\", ".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(matches!(
            from_str::<serde_json::Value>(&hidden),
            Err(YamlError::TooDeep { .. })
        ));
        let hidden = format!(
            "{}1{}",
            "['a'']]', ".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(matches!(
            from_str::<serde_json::Value>(&hidden),
            Err(YamlError::TooDeep { .. })
        ));
        // Many sibling collections, brackets in comments and block scalars, and a few hundred
        // strings with brackets are not nesting.
        let mut ok = String::from("text: |\n  [[[[[[\n  'x\nlist: # [[[[[[[[\n");
        ok.push_str(&"  - {a: [1, 2], re: \"^[a-z]+$\", b: '[x]'}\n".repeat(200));
        let v: serde_json::Value = from_str(&ok).unwrap();
        assert_eq!(v["list"].as_array().map(Vec::len), Some(200));
        assert_eq!(v["text"], "[[[[[[\n'x\n");
        // Brackets in strings, block scalars and comments are text, however many.
        let many = "[".repeat(4 * MAX_DEPTH);
        let ok = format!(
            "a: \"{many}\"\nb: '{many}'\nc: |\n  {many}\n  x\nd: [\"{many}\", '{many}']\n# {many}\ne: x {many}\n"
        );
        let v: serde_json::Value = from_str(&ok).unwrap();
        assert_eq!(v["d"][1].as_str().map(str::len), Some(4 * MAX_DEPTH));
        let list = format!("- '{{ {many}'\n").repeat(3);
        assert!(from_str::<serde_json::Value>(&list).is_ok());
        // A quote that may be text in a plain scalar continued from the line before (where
        // libyaml reads it as text) does not hide the nesting after it.
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        for hiding in [
            format!("a: x\n  'y\nb: {deep}\nc: '\n"),
            format!("- x\n  \"y\n- {deep}\n- \"\n"),
            format!("[a\n 'b, {deep}, 'c]\n"),
            format!("a: !t'x {deep}\n"),
        ] {
            assert!(
                matches!(
                    from_str::<serde_json::Value>(&hiding),
                    Err(YamlError::TooDeep { .. })
                ),
                "{hiding:.40}"
            );
        }
        // A quote in a block scalar does not hide the closing brackets after it.
        let mut ok = String::from("- a: |\n   x \"\n  b: x\n");
        ok.push_str(&"- [1, [2], {c: [3]}]\n".repeat(MAX_DEPTH));
        assert!(from_str::<serde_json::Value>(&ok).is_ok());
    }

    #[test]
    fn a_stream_of_too_many_documents_is_refused() {
        let text = "a: 1\n---\n".repeat(MAX_DOCUMENTS + 1);
        assert!(matches!(
            from_str_all::<serde_json::Value>(&text),
            Err(YamlError::TooManyDocuments)
        ));
        let text = format!("---\n{}", "a: 1\n---\n".repeat(MAX_DOCUMENTS - 1));
        assert!(from_str_all::<serde_json::Value>(&text).is_ok());
    }

    #[test]
    fn duplicate_keys_are_refused_as_kubectl_refuses_them() {
        let e = from_str::<serde_json::Value>("spec:\n  failOpen: false\n  failOpen: true\n")
            .unwrap_err();
        assert!(
            matches!(&e, YamlError::DuplicateKey { key } if key == "failOpen"),
            "{e}"
        );
        assert!(matches!(
            from_str_all::<serde_json::Value>("a: 1\n---\n{b: 1, 'b': 2}\n"),
            Err(YamlError::DuplicateKey { .. })
        ));
        // One key in two mappings, or one mapping used twice through an alias, is no duplicate.
        let v: serde_json::Value = from_str("x: &m {k: 1}\ny: {k: 2}\nz: [*m, *m]\n").unwrap();
        assert_eq!(v["z"][1]["k"], 1);
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
