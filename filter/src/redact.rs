//! JSON field redaction that keeps the document as it was written: key order, spacing and
//! number spelling are copied byte for byte, and only the values of the listed keys (at any
//! depth) are replaced by the mask.
//!
//! The body is read by serde_json, so a body is JSON here exactly when serde_json reads it
//! (UTF-8 without a BOM, no lone surrogate escapes, no `NaN`, nesting up to 128, numbers
//! within f64): what it cannot read is reported, never guessed at, and the role refuses it
//! unless its configuration opts out. Each masked value's place in the body is where
//! serde_json found it (a `RawValue` borrowed from the body).

use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What redaction did to a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redacted {
    /// No listed key was present.
    Unchanged,
    /// The new body and how many values were masked.
    Changed(Vec<u8>, usize),
    /// Not JSON serde_json reads; the reason, for the log.
    NotJson(String),
    /// The redacted body would be this many bytes, over the limit: nothing was built.
    TooLarge(u64),
}

/// Masks the value of every key in `keys` (in byte order), at any depth, with `mask` (written
/// as a JSON string). The whole value is replaced, whatever its type, so nothing of it leaks.
///
/// The result is never allocated past `limit` bytes: its size is known from the values'
/// places before anything is built (a short mask over many short values can multiply a
/// body), and it is written into a buffer of exactly that size.
pub fn redact(body: &[u8], keys: &[String], mask: &str, limit: usize) -> Redacted {
    // The first walk reads every value, the listed keys' too (serde_json's raw values are
    // checked for syntax only), and counts them; the second notes where they are.
    let mut found = Vec::new();
    if let Err(e) = walk(body, keys, false, &mut found) {
        return Redacted::NotJson(e.to_string());
    }
    if found.is_empty() {
        return Redacted::Unchanged;
    }
    let mut spans = Vec::with_capacity(found.len());
    if let Err(e) = walk(body, keys, true, &mut spans) {
        return Redacted::NotJson(e.to_string());
    }
    let quoted = match serde_json::to_string(mask) {
        Ok(q) => q,
        Err(e) => return Redacted::NotJson(e.to_string()),
    };
    let removed: u64 = spans.iter().map(|(_, len)| *len as u64).sum();
    let out_len = (body.len() as u64 - removed) + spans.len() as u64 * quoted.len() as u64;
    let capacity = match usize::try_from(out_len) {
        Ok(n) if n <= limit => n,
        _ => return Redacted::TooLarge(out_len),
    };
    let mut out = Vec::with_capacity(capacity);
    let mut copied = 0;
    for (start, len) in &spans {
        out.extend_from_slice(body.get(copied..*start).unwrap_or_default());
        out.extend_from_slice(quoted.as_bytes());
        copied = start + len;
    }
    out.extend_from_slice(body.get(copied..).unwrap_or_default());
    Redacted::Changed(out, spans.len())
}

/// Reads the whole body; each listed key's value is pushed on `spans` (its offset in the
/// body and length when `place`, else only its key's offset).
fn walk(
    body: &[u8],
    keys: &[String],
    place: bool,
    spans: &mut Vec<(usize, usize)>,
) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let walk = Walk {
        keys,
        place,
        base: body.as_ptr() as usize,
        spans,
        body: PhantomData,
    };
    walk.deserialize(&mut de)?;
    de.end()
}

/// One value of the body, read by serde_json: a listed key's value is noted, everything
/// else is walked into.
struct Walk<'k, 's, 'de> {
    keys: &'k [String],
    /// Note where a listed key's value is (rather than read it).
    place: bool,
    /// The body's address: a value borrowed from it is at its own address minus this.
    base: usize,
    spans: &'s mut Vec<(usize, usize)>,
    body: PhantomData<&'de [u8]>,
}

impl<'de> Walk<'_, '_, 'de> {
    fn inner(&mut self) -> Walk<'_, '_, 'de> {
        Walk {
            keys: self.keys,
            place: self.place,
            base: self.base,
            spans: self.spans,
            body: PhantomData,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.inner())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let listed = self.keys.binary_search(&key).is_ok();
            if !listed || !self.place {
                if listed {
                    self.spans.push((0, 0));
                }
                map.next_value_seed(self.inner())?;
                continue;
            }
            let value: &'de RawValue = map.next_value()?;
            let start = (value.get().as_ptr() as usize).wrapping_sub(self.base);
            self.spans.push((start, value.get().len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        let mut keys: Vec<String> = k.iter().map(|s| s.to_string()).collect();
        keys.sort();
        keys
    }

    const L: usize = 1 << 20;

    fn text(r: Redacted) -> String {
        match r {
            Redacted::Changed(b, _) => String::from_utf8(b).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn masks_listed_keys_at_any_depth_and_keeps_the_rest_byte_for_byte() {
        let body =
            br#"{ "user": {"name": "al", "password": "x", "cards": [{"pan": 4111, "exp": "1/30"}]},
  "password" : {"nested": true}, "z": 1.50e2 }"#;
        let out = text(redact(body, &keys(&["password", "pan"]), "***", L));
        assert_eq!(
            out,
            r#"{ "user": {"name": "al", "password": "***", "cards": [{"pan": "***", "exp": "1/30"}]},
  "password" : "***", "z": 1.50e2 }"#
        );
    }

    #[test]
    fn counts_masks_and_reports_unchanged() {
        match redact(
            br#"[{"a":1},{"a":[1,2]},{"b":{"a":null}}]"#,
            &keys(&["a"]),
            "-",
            L,
        ) {
            Redacted::Changed(b, n) => {
                assert_eq!(n, 3);
                assert_eq!(b, br#"[{"a":"-"},{"a":"-"},{"b":{"a":"-"}}]"#);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            redact(br#"{"b": "a"}"#, &keys(&["a"]), "-", L),
            Redacted::Unchanged
        );
        assert_eq!(redact(b"42", &keys(&["a"]), "-", L), Redacted::Unchanged);
    }

    #[test]
    fn escaped_keys_and_masks_are_handled() {
        let out = text(redact(
            br#"{"pass\u0077ord": "x", "q\"": "y"}"#,
            &keys(&["password"]),
            "a\"b",
            L,
        ));
        assert_eq!(out, r#"{"pass\u0077ord": "a\"b", "q\"": "y"}"#);
    }

    #[test]
    fn not_json_is_reported() {
        for body in [
            &b"hello"[..],
            b"{\"a\":",
            b"",
            b"{\"a\":1} trailing",
            b"{\"a\":\"\xff\"}",
            b"{\"a\":\"\\ud800\"}",
            b"[1,]",
        ] {
            assert!(
                matches!(redact(body, &keys(&["a"]), "-", L), Redacted::NotJson(_)),
                "{body:?}"
            );
        }
        assert_eq!(
            redact(b"{\"a\":1,\n \"b\" 2}", &keys(&["a"]), "-", L),
            Redacted::NotJson("expected `:` at line 2 column 6".into())
        );
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(matches!(
            redact(deep.as_bytes(), &keys(&["a"]), "-", L),
            Redacted::NotJson(_)
        ));
    }

    #[test]
    fn a_mask_multiplying_the_body_stops_at_the_limit_before_building_it() {
        // 7-byte values masked with 400 bytes: 57 times the body.
        let body = format!("[{}{{\"k\":1}}]", "{\"k\":1},".repeat(10_000));
        let mask = "m".repeat(400);
        let want = body.len() + 10_001 * (402 - 1);
        assert_eq!(
            redact(body.as_bytes(), &keys(&["k"]), &mask, want - 1),
            Redacted::TooLarge(want as u64)
        );
        match redact(body.as_bytes(), &keys(&["k"]), &mask, want) {
            Redacted::Changed(b, n) => {
                assert_eq!((b.len(), b.capacity(), n), (want, want, 10_001));
            }
            other => panic!("{other:?}"),
        }
        // Shrinking redactions are counted as such: a body over the limit may come out under it.
        let long = format!(r#"{{"k":"{}"}}"#, "x".repeat(1000));
        assert_eq!(
            text(redact(long.as_bytes(), &keys(&["k"]), "-", 100)),
            r#"{"k":"-"}"#
        );
    }
}

#[cfg(test)]
mod serde_json_agreement {
    use super::*;

    /// A body is JSON here exactly when serde_json reads it as a value.
    #[test]
    fn bodies_are_json_exactly_when_serde_json_reads_them() {
        let corpus: [&[u8]; 52] = [
            b"01",
            b"-",
            b"1.",
            b"1e",
            b"-01",
            b"1e400",
            b"-1e400",
            b"1e99999999999999999999999",
            b"123456789012345678901234567890",
            b"\"\\u0000\"",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"\\uD83D\\uDE00\"",
            b"\xef\xbb\xbf{}",
            b"\x0c{}",
            b"{}\x0c",
            b"\xa0{}",
            b"[1,]",
            b"{\"a\":1,}",
            b"{\"a\":1,\"a\":2}",
            b"\"\xff\"",
            b"\"\xed\xa0\x80\"",
            b"\"\xc0\xaf\"",
            b"\"\x7f\"",
            b"NaN",
            b"Infinity",
            b"+1",
            b".5",
            b"1.e5",
            b"1E+",
            b"0x10",
            b"[\"\\u00\"]",
            b"\"\\U0041\"",
            b"\"\\'\"",
            b"nulll",
            b"truex",
            b"[true false]",
            b"\"a\tb\"",
            b"{\"a\" : 1 }",
            b"  ",
            b"[]]",
            b"{}\n",
            b"\x00",
            b"1 ",
            b"-0.0e-0",
            b"[1e309]",
            b"\"\\u0041\\\"",
            b"{\"\xff\":1}",
            b"[-]",
            b"[1.5e]",
            b"\r\n[1]\r\n",
        ];
        let keys = vec!["zz".to_string()];
        for body in corpus {
            let ours = !matches!(redact(body, &keys, "-", L), Redacted::NotJson(_));
            let serde = serde_json::from_slice::<serde_json::Value>(body).is_ok();
            assert_eq!(ours, serde, "{:?}", String::from_utf8_lossy(body));
        }
    }

    const L: usize = 1 << 20;
}
