//! Reading the configurations with serde and serde_json, with serde's derive words users,
//! docs and tests know ("unknown field `x`, expected one of `a`, `b`", "missing field `x`",
//! "duplicate field `x`", "invalid type: string \"x\", expected u32", "unknown variant `x`,
//! expected `a` or `b`"). A message about a value ends with the value's path
//! (`... expected a string at request.set[0].name`), where serde_json would put a line and
//! column; a syntax error keeps serde_json's line and column.

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// A configuration is a few hundred bytes; this bounds what parsing one may build.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// A document over [`MAX_CONFIG_BYTES`] is refused before anything is read.
pub fn check_size(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_CONFIG_BYTES}-byte limit",
            bytes.len()
        ));
    }
    Ok(())
}

/// Reads a whole document of at most [`MAX_CONFIG_BYTES`] as `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    check_size(bytes)?;
    serde_json::from_slice(bytes).map_err(|e| explain(bytes, e))
}

/// serde_json's message; for a value's error, with the path of the value the error is in
/// (found by reading the document again down to where serde_json stopped) in place of the
/// line and column. One small walk rather than a path-tracking wrapper around every
/// configuration type's deserializer keeps the module small: V8 compiles every byte of it in
/// every worker.
fn explain(doc: &[u8], e: serde_json::Error) -> String {
    if !e.is_data() {
        return e.to_string();
    }
    let at = offset(doc, e.line(), e.column());
    let mut path = String::new();
    if let Ok(text) = std::str::from_utf8(doc) {
        descend(doc.as_ptr() as usize, text, at, &mut path, 0);
    }
    located(e, &path)
}

/// The byte offset of serde_json's line (from 1) and column (bytes into the line).
fn offset(doc: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match doc
            .get(start..)
            .and_then(|rest| rest.iter().position(|b| *b == b'\n'))
        {
            Some(i) => start += i + 1,
            None => break,
        }
    }
    start + column
}

/// Nesting the path search follows at most (serde_json reads no deeper).
const MAX_PATH_DEPTH: usize = 128;

/// Appends to `path` the key or index of the member of `text` (a value in the document at
/// `base`) that holds offset `at`, and so on down; stops at the innermost value holding it.
fn descend(base: usize, text: &str, at: usize, path: &mut String, depth: usize) {
    if depth >= MAX_PATH_DEPTH {
        return;
    }
    let span = |v: &RawValue| {
        let start = (v.get().as_ptr() as usize).wrapping_sub(base);
        (start, start + v.get().len())
    };
    let inside = |v: &RawValue| {
        let (start, end) = span(v);
        start <= at && at <= end
    };
    match text.trim_start().as_bytes().first() {
        Some(b'{') => {
            let Ok(Members(members)) = serde_json::from_str::<Members>(text) else {
                return;
            };
            if let Some((key, v)) = members.into_iter().find(|(_, v)| inside(v)) {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&key);
                descend(base, v.get(), at, path, depth + 1);
            }
        }
        Some(b'[') => {
            let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(text) else {
                return;
            };
            if let Some((i, v)) = items.into_iter().enumerate().find(|(_, v)| inside(v)) {
                path.push_str(&format!("[{i}]"));
                descend(base, v.get(), at, path, depth + 1);
            }
        }
        _ => {}
    }
}

/// An object's members in order, each value as written.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Members<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let visitor = EntriesVisitor {
            expecting: "an object",
            unique: &[],
        };
        d.deserialize_map(visitor).map(Members)
    }
}

/// `inner`'s message; for a value's error, with `path` in place of the line and column.
fn located(inner: serde_json::Error, path: &str) -> String {
    let text = inner.to_string();
    if !inner.is_data() {
        return text;
    }
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    let text = text.strip_suffix(&position).unwrap_or(&text);
    if path.is_empty() || path == "." {
        text.to_string()
    } else {
        format!("{text} at {path}")
    }
}

/// An object's entries in order, each value as written: the plugin configuration's top
/// level, whose `role` picks how the rest is read. `expecting` names it in a type error.
pub struct Entries<'a> {
    pub entries: Vec<(String, &'a RawValue)>,
}

impl<'a> Entries<'a> {
    /// Reads an object (`expecting` names it for a value of another type); a key given
    /// twice among `unique` is an error.
    pub fn read(
        bytes: &'a [u8],
        expecting: &'static str,
        unique: &'static [&'static str],
    ) -> Result<Self, String> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let visitor = EntriesVisitor { expecting, unique };
        let entries =
            serde::Deserializer::deserialize_map(&mut de, visitor).map_err(|e| located(e, ""))?;
        de.end().map_err(|e| e.to_string())?;
        Ok(Self { entries })
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The object without `key`, as JSON text.
    pub fn without(&self, key: &str) -> Result<String, String> {
        let mut out = String::from("{");
        for (k, v) in self.entries.iter().filter(|(k, _)| k != key) {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).map_err(|e| e.to_string())?);
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        Ok(out)
    }
}

struct EntriesVisitor {
    expecting: &'static str,
    unique: &'static [&'static str],
}

impl<'de> serde::de::Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries: Vec<(String, &'de RawValue)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if let Some(name) = self.unique.iter().find(|u| **u == key) {
                if entries.iter().any(|(k, _)| k == name) {
                    return Err(serde::de::Error::duplicate_field(name));
                }
            }
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(entries)
    }
}

/// `value` read as `T`, with its errors at `at` (a field of the document's top level).
pub fn field<T: DeserializeOwned>(value: &RawValue, at: &str) -> Result<T, String> {
    serde_json::from_str(value.get()).map_err(|e| located(e, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        name: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        list: Vec<Inner>,
    }

    #[test]
    fn messages_end_with_the_path_or_keep_the_position_of_a_syntax_error() {
        let e = from_slice::<Outer>(br#"{"list":[{"name":1}]}"#).unwrap_err();
        assert_eq!(
            e,
            "invalid type: integer `1`, expected a string at list[0].name"
        );
        let e = from_slice::<Outer>(br#"{"lst":[]}"#).unwrap_err();
        assert_eq!(e, "unknown field `lst`, expected `list`");
        let e = from_slice::<Outer>(br#"{"list":[]} x"#).unwrap_err();
        assert_eq!(e, "trailing characters at line 1 column 13");
        let e = from_slice::<Outer>(b"true").unwrap_err();
        assert_eq!(e, "invalid type: boolean `true`, expected struct Outer");
        let e = from_slice::<Outer>(br#"{"list":[{"name":"a","name":"b"}]}"#).unwrap_err();
        assert_eq!(e, "duplicate field `name` at list[0]");
    }
}
