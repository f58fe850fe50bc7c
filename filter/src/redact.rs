//! JSON field redaction that keeps the document as it was written: key order, spacing and
//! number spelling are copied byte for byte, and only the values of the listed keys (at any
//! depth) are replaced by the mask. A body that is not JSON is reported, never guessed at.

use crate::json::{self, Lexer, MAX_DEPTH};

/// What redaction did to a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redacted {
    /// No listed key was present.
    Unchanged,
    /// The new body and how many values were masked.
    Changed(Vec<u8>, usize),
    /// Not JSON; the reason, for the log.
    NotJson(String),
    /// The redacted body would be this many bytes, over the limit: nothing was built.
    TooLarge(u64),
}

/// Masks the value of every key in `keys` (in byte order), at any depth, with `mask` (written as a JSON
/// string). The whole value is replaced, whatever its type, so nothing of it leaks.
///
/// The result is never allocated past `limit` bytes: a first walk only counts what the
/// output would be (a short mask over many short values can multiply a body), and the second
/// writes it into a buffer of exactly that size. Neither keeps a list of what to mask, so
/// memory stays the body plus the output (and the longest key), whatever the body holds.
pub fn redact(body: &[u8], keys: &[String], mask: &str, limit: usize) -> Redacted {
    let mut quoted = String::new();
    json::write::quote(mask, &mut quoted);
    // The planning walk checks the syntax as it goes: the writing walk sees a valid document.
    let mut plan = Scanner::new(body, keys, quoted.as_bytes(), None);
    if let Err(e) = plan.document() {
        return Redacted::NotJson(e.to_string());
    }
    if plan.masked == 0 {
        return Redacted::Unchanged;
    }
    let capacity = match usize::try_from(plan.out_len) {
        Ok(n) if n <= limit => n,
        _ => return Redacted::TooLarge(plan.out_len),
    };
    let mut out = Vec::with_capacity(capacity);
    let mut write = Scanner::new(body, keys, quoted.as_bytes(), Some(&mut out));
    if let Err(e) = write.document() {
        return Redacted::NotJson(e.to_string());
    }
    let (masked, copied) = (write.masked, write.copied);
    out.extend_from_slice(body.get(copied..).unwrap_or_default());
    Redacted::Changed(out, masked)
}

/// A walk over the document on [`json::Lexer`], noting (or writing) what masking changes.
struct Scanner<'a, 'o> {
    lex: Lexer<'a>,
    b: &'a [u8],
    keys: &'a [String],
    mask: &'a [u8],
    /// Where the output goes on the writing walk; `None` while planning.
    out: Option<&'o mut Vec<u8>>,
    /// Body bytes up to here are in `out` (or counted).
    copied: usize,
    /// The output's size once the walk is done: a u64, as a short mask over many short
    /// values in a large body can total more than wasm32's `usize`.
    out_len: u64,
    masked: usize,
    /// Inside a value being masked: keys in it are not looked at.
    masking: bool,
    /// The key last read, unescaped (one buffer for the whole walk).
    key: String,
}

impl<'a, 'o> Scanner<'a, 'o> {
    fn new(b: &'a [u8], keys: &'a [String], mask: &'a [u8], out: Option<&'o mut Vec<u8>>) -> Self {
        Self {
            lex: Lexer::new(b),
            b,
            keys,
            mask,
            out,
            copied: 0,
            out_len: b.len() as u64,
            masked: 0,
            masking: false,
            key: String::new(),
        }
    }

    /// The value at `start..end` is replaced by the mask.
    fn mask_span(&mut self, start: usize, end: usize) {
        self.masked += 1;
        // Spans are disjoint parts of the body, so this never goes below zero.
        self.out_len = self.out_len - (end - start) as u64 + self.mask.len() as u64;
        if let Some(out) = self.out.as_deref_mut() {
            out.extend_from_slice(self.b.get(self.copied..start).unwrap_or_default());
            out.extend_from_slice(self.mask);
        }
        self.copied = end;
    }

    fn document(&mut self) -> Result<(), json::Error> {
        self.value(0)?;
        self.lex.end()
    }

    /// Walks one value, masking listed keys' values inside it.
    fn value(&mut self, depth: usize) -> Result<(), json::Error> {
        match self.lex.next("a value")? {
            b'"' => self.lex.string(None),
            c @ (b'{' | b'[') => {
                if depth >= MAX_DEPTH {
                    return Err(self
                        .lex
                        .error(format!("nested deeper than {MAX_DEPTH} levels")));
                }
                self.lex.bump();
                if c == b'{' {
                    self.object(depth + 1)
                } else {
                    self.array(depth + 1)
                }
            }
            _ => self.lex.scalar().map(drop),
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), json::Error> {
        if self.lex.next("a list")? == b']' {
            self.lex.bump();
            return Ok(());
        }
        loop {
            self.value(depth)?;
            match self.lex.next("a list")? {
                b',' => self.lex.bump(),
                b']' => {
                    self.lex.bump();
                    return Ok(());
                }
                _ => return Err(self.lex.error("expected `,` or `]`".into())),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<(), json::Error> {
        if self.lex.next("an object")? == b'}' {
            self.lex.bump();
            return Ok(());
        }
        loop {
            if self.lex.next("an object")? != b'"' {
                return Err(self.lex.error("key must be a string".into()));
            }
            self.key.clear();
            self.lex.string(Some(&mut self.key))?;
            self.lex.colon()?;
            if !self.masking && self.keys.binary_search(&self.key).is_ok() {
                // Skip it without looking for keys inside: the whole value goes.
                self.lex.next("a value")?;
                let value_start = self.lex.at();
                self.masking = true;
                let walked = self.value(depth);
                self.masking = false;
                walked?;
                self.mask_span(value_start, self.lex.at());
            } else {
                self.value(depth)?;
            }
            match self.lex.next("an object")? {
                b',' => self.lex.bump(),
                b'}' => {
                    self.lex.bump();
                    return Ok(());
                }
                _ => return Err(self.lex.error("expected `,` or `}`".into())),
            }
        }
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

    /// Bodies serde_json refused were passed on as "not JSON"; the lexer must refuse the same
    /// ones, except numbers beyond f64 (RFC 8259 allows any magnitude), which it redacts.
    #[test]
    fn bodies_are_json_exactly_when_serde_json_said_so_except_huge_numbers() {
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
        let huge = [
            &b"1e400"[..],
            b"-1e400",
            b"1e99999999999999999999999",
            b"[1e309]",
        ];
        for body in corpus {
            let ours = !matches!(redact(body, &keys, "-", L), Redacted::NotJson(_));
            let serde = serde_json::from_slice::<serde_json::Value>(body).is_ok();
            let want = serde || huge.contains(&body);
            assert_eq!(ours, want, "{:?}", String::from_utf8_lossy(body));
        }
    }

    const L: usize = 1 << 20;
}
