//! The module's own JSON: a reader for the configurations ([`parse`] into a [`Value`], read
//! with [`fields`]), the lexer the body redactor walks with, and a writer for the stats
//! summary. Its own code rather than serde and serde_json because every V8 compiles every
//! byte of the module: docs/performance.md has the sizes and Envoy's memory either way.

pub mod fields;
pub mod lex;
pub mod write;

pub use fields::{Field, Obj};
pub use lex::{Error, Lexer, Scalar, MAX_DEPTH};

/// A JSON document. Objects keep their keys in order and as given (duplicates included:
/// whoever reads one decides, see [`Obj::fields`]); numbers keep their text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

/// Reads a whole document of at most `max_bytes` bytes (checked before anything is built).
pub fn parse(bytes: &[u8], max_bytes: usize) -> Result<Value, Error> {
    if bytes.len() > max_bytes {
        return Err(Error::whole(format!(
            "{} bytes, over the {max_bytes}-byte limit",
            bytes.len()
        )));
    }
    let mut lex = Lexer::new(bytes);
    let value = value(&mut lex, 0)?;
    lex.end()?;
    Ok(value)
}

fn value(lex: &mut Lexer<'_>, depth: usize) -> Result<Value, Error> {
    match lex.next("a value")? {
        b'"' => {
            let mut s = String::new();
            lex.string(Some(&mut s))?;
            Ok(Value::String(s))
        }
        c @ (b'{' | b'[') => {
            if depth >= MAX_DEPTH {
                return Err(lex.error(format!("nested deeper than {MAX_DEPTH} levels")));
            }
            lex.bump();
            if c == b'{' {
                object(lex, depth + 1)
            } else {
                array(lex, depth + 1)
            }
        }
        _ => Ok(match lex.scalar()? {
            Scalar::Null => Value::Null,
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Number(n) => Value::Number(n.to_string()),
        }),
    }
}

fn object(lex: &mut Lexer<'_>, depth: usize) -> Result<Value, Error> {
    let mut entries = Vec::new();
    if lex.next("an object")? == b'}' {
        lex.bump();
        return Ok(Value::Object(entries));
    }
    loop {
        if lex.next("an object")? != b'"' {
            return Err(lex.error("key must be a string".into()));
        }
        let mut key = String::new();
        lex.string(Some(&mut key))?;
        lex.colon()?;
        entries.push((key, value(lex, depth)?));
        match lex.next("an object")? {
            b',' => lex.bump(),
            b'}' => {
                lex.bump();
                return Ok(Value::Object(entries));
            }
            _ => return Err(lex.error("expected `,` or `}`".into())),
        }
    }
}

fn array(lex: &mut Lexer<'_>, depth: usize) -> Result<Value, Error> {
    let mut items = Vec::new();
    if lex.next("a list")? == b']' {
        lex.bump();
        return Ok(Value::Array(items));
    }
    loop {
        items.push(value(lex, depth)?);
        match lex.next("a list")? {
            b',' => lex.bump(),
            b']' => {
                lex.bump();
                return Ok(Value::Array(items));
            }
            _ => return Err(lex.error("expected `,` or `]`".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Value, String> {
        parse(text.as_bytes(), 1 << 20).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_every_kind_keeping_order_and_number_text() {
        let v = p(r#" {"b": [1, -2.50, 3e2, true, false, null], "a": {"s": "x\u0079"}, "b": {}} "#)
            .unwrap();
        let n = |t: &str| Value::Number(t.into());
        assert_eq!(
            v,
            Value::Object(vec![
                (
                    "b".into(),
                    Value::Array(vec![
                        n("1"),
                        n("-2.50"),
                        n("3e2"),
                        Value::Bool(true),
                        Value::Bool(false),
                        Value::Null
                    ])
                ),
                (
                    "a".into(),
                    Value::Object(vec![("s".into(), Value::String("xy".into()))])
                ),
                ("b".into(), Value::Object(vec![])),
            ])
        );
        assert_eq!(p("[]").unwrap(), Value::Array(vec![]));
        assert_eq!(p("\"\"").unwrap(), Value::String(String::new()));
    }

    #[test]
    fn malformed_documents_are_refused_with_a_position() {
        for (bad, want) in [
            ("", "EOF while parsing a value at line 1 column 1"),
            ("{not json", "key must be a string at line 1 column 2"),
            (r#"{"a" 1}"#, "expected `:` at line 1 column 6"),
            (r#"{"a":1 "b":2}"#, "expected `,` or `}` at line 1 column 8"),
            ("[1 2]", "expected `,` or `]` at line 1 column 4"),
            ("[1,]", "expected value at line 1 column 4"),
            ("{\"a\":1,}", "key must be a string at line 1 column 8"),
            ("{\"a\":", "EOF while parsing a value at line 1 column 6"),
            ("[1", "EOF while parsing a list at line 1 column 3"),
            ("{\"a\":1", "EOF while parsing an object at line 1 column 7"),
            ("{} x", "trailing characters at line 1 column 4"),
            ("{}\n{}", "trailing characters at line 2 column 1"),
            ("nul", "expected ident at line 1 column 1"),
            ("01", "trailing characters at line 1 column 2"),
            ("'a'", "expected value at line 1 column 1"),
        ] {
            assert_eq!(p(bad).unwrap_err(), want, "{bad:?}");
        }
    }

    #[test]
    fn limits_are_checked_before_building() {
        let e = parse(br#"{"a":"bcd"}"#, 10).unwrap_err();
        assert_eq!(e.to_string(), "11 bytes, over the 10-byte limit");
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(p(&deep(MAX_DEPTH)).is_ok());
        let e = p(&deep(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(e, "nested deeper than 128 levels at line 1 column 129");
        let e = p(&"{\"a\":".repeat(MAX_DEPTH + 1)).unwrap_err();
        assert!(e.starts_with("nested deeper than 128 levels"), "{e}");
    }
}
