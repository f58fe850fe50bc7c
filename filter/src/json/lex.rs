//! The crate's one JSON lexer: whitespace, strings (every escape, surrogate pairs, UTF-8
//! checked), numbers (RFC 8259's grammar, kept as text) and literals. The configuration
//! parser and the body redactor walk structure on top of it, each in its own way.

use std::fmt;

/// Objects and arrays nested deeper than this are refused (serde_json's default), which
/// keeps every walk well within the guest's stack.
pub const MAX_DEPTH: usize = 128;

/// Why a text is not JSON, and where (line and column, both from 1, like serde_json's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    what: String,
    at: Option<(usize, usize)>,
}

impl Error {
    /// An error that has no position (a limit on the whole text).
    pub fn whole(what: String) -> Self {
        Self { what, at: None }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)?;
        match self.at {
            Some((line, column)) => write!(f, " at line {line} column {column}"),
            None => Ok(()),
        }
    }
}

/// A value that is neither a string nor a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    /// As written; the grammar is checked, the magnitude is the reader's business.
    Number(&'a str),
}

/// A cursor over the text.
pub struct Lexer<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Lexer<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Self { b, i: 0 }
    }

    /// The offset of the next byte.
    pub fn at(&self) -> usize {
        self.i
    }

    /// The next byte, without whitespace skipping.
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn bump(&mut self) {
        self.i += 1;
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// Skips whitespace and returns the next byte (not consumed); the end of the text is
    /// an error naming what was being read (`"a value"`, `"an object"`, `"a list"`).
    pub fn next(&mut self, inside: &str) -> Result<u8, Error> {
        self.ws();
        self.peek()
            .ok_or_else(|| self.error(format!("EOF while parsing {inside}")))
    }

    /// Only whitespace may follow the document.
    pub fn end(&mut self) -> Result<(), Error> {
        self.ws();
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.error("trailing characters".into())),
        }
    }

    /// After a key: whitespace, then `:`.
    pub fn colon(&mut self) -> Result<(), Error> {
        if self.next("an object")? != b':' {
            return Err(self.error("expected `:`".into()));
        }
        self.i += 1;
        Ok(())
    }

    /// At the current byte.
    pub fn error(&self, what: String) -> Error {
        self.error_at(self.i, what)
    }

    fn error_at(&self, at: usize, what: String) -> Error {
        let before = self.b.get(..at).unwrap_or(self.b);
        let line = 1 + before.iter().filter(|&&c| c == b'\n').count();
        let line_start = before
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        Error {
            what,
            at: Some((line, at - line_start + 1)),
        }
    }

    /// The string at the cursor (its opening quote); its text goes into `out` if given.
    pub fn string(&mut self, mut out: Option<&mut String>) -> Result<(), Error> {
        self.i += 1;
        loop {
            let start = self.i;
            while matches!(self.peek(), Some(c) if c != b'"' && c != b'\\' && c >= 0x20) {
                self.i += 1;
            }
            let run = self.b.get(start..self.i).unwrap_or_default();
            let text = std::str::from_utf8(run).map_err(|e| {
                self.error_at(start + e.valid_up_to(), "invalid UTF-8 in a string".into())
            })?;
            if let Some(out) = out.as_deref_mut() {
                out.push_str(text);
            }
            match self.peek() {
                None => return Err(self.error("EOF while parsing a string".into())),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = self.escape()?;
                    if let Some(out) = out.as_deref_mut() {
                        out.push(c);
                    }
                }
                Some(_) => {
                    return Err(self.error(
                        "control character (\\u0000-\\u001F) found while parsing a string".into(),
                    ))
                }
            }
        }
    }

    /// After a backslash.
    fn escape(&mut self) -> Result<char, Error> {
        let Some(c) = self.peek() else {
            return Err(self.error("EOF while parsing a string".into()));
        };
        self.i += 1;
        Ok(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode(),
            _ => return Err(self.error_at(self.i - 1, "invalid escape".into())),
        })
    }

    /// After `\u`: one code point, two escapes for one beyond the BMP.
    fn unicode(&mut self) -> Result<char, Error> {
        let first = self.hex4()?;
        let code = match first {
            0xDC00..=0xDFFF => {
                return Err(self.error("lone trailing surrogate in hex escape".into()))
            }
            0xD800..=0xDBFF => {
                if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                    return Err(self.error("lone leading surrogate in hex escape".into()));
                }
                self.i += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("invalid surrogate pair in hex escape".into()));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid unicode code point".into()))
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self.peek().and_then(|c| char::from(c).to_digit(16));
            let Some(d) = digit else {
                return Err(self.error("invalid hex escape".into()));
            };
            code = code * 16 + d;
            self.i += 1;
        }
        Ok(code)
    }

    /// A number or a literal at the cursor.
    pub fn scalar(&mut self) -> Result<Scalar<'a>, Error> {
        for (word, value) in [
            (&b"null"[..], Scalar::Null),
            (b"true", Scalar::Bool(true)),
            (b"false", Scalar::Bool(false)),
        ] {
            if self.b.get(self.i..self.i + word.len()) == Some(word) {
                self.i += word.len();
                return Ok(value);
            }
        }
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number().map(Scalar::Number),
            Some(b'n' | b't' | b'f') => Err(self.error("expected ident".into())),
            _ => Err(self.error("expected value".into())),
        }
    }

    fn number(&mut self) -> Result<&'a str, Error> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("invalid number".into())),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.error("invalid number".into()));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("invalid number".into()));
            }
        }
        let text = self.b.get(start..self.i).unwrap_or_default();
        // Only ASCII digits and signs were taken.
        Ok(std::str::from_utf8(text).unwrap_or_default())
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> Result<String, String> {
        let mut lex = Lexer::new(text.as_bytes());
        let mut out = String::new();
        lex.string(Some(&mut out)).map_err(|e| e.to_string())?;
        lex.end().map_err(|e| e.to_string())?;
        Ok(out)
    }

    #[test]
    fn strings_decode_every_escape_and_surrogate_pairs() {
        assert_eq!(
            string(r#""a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u20AC\ud83d\ude00é""#).unwrap(),
            "a\"b\\c/d\u{8}\u{c}\n\r\tAé€😀é"
        );
        for (bad, want) in [
            (r#""\ud83d""#, "lone leading surrogate"),
            (r#""\ud83dx""#, "lone leading surrogate"),
            (r#""\ude00""#, "lone trailing surrogate"),
            (r#""\ud83d\u0041""#, "invalid surrogate pair"),
            (r#""\u12G4""#, "invalid hex escape"),
            (r#""\x""#, "invalid escape at line 1 column 3"),
            ("\"a\nb\"", "control character"),
            (r#""abc"#, "EOF while parsing a string"),
            (r#""\"#, "EOF while parsing a string"),
        ] {
            let e = string(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let mut lex = Lexer::new(b"\"a\xff\"");
        let e = lex.string(None).unwrap_err().to_string();
        assert_eq!(e, "invalid UTF-8 in a string at line 1 column 3");
    }

    #[test]
    fn numbers_follow_the_grammar_and_keep_their_text() {
        for good in ["0", "-0", "12", "-3.25", "1e5", "1E+5", "2.5e-3"] {
            let mut lex = Lexer::new(good.as_bytes());
            assert_eq!(lex.scalar().unwrap(), Scalar::Number(good));
            assert_eq!(lex.at(), good.len());
        }
        for bad in ["-", "1.", ".5", "1e", "1e+", "-a"] {
            let mut lex = Lexer::new(bad.as_bytes());
            let e = lex.scalar().and_then(|_| lex.end());
            assert!(e.is_err(), "{bad}");
        }
        let mut lex = Lexer::new(b"tru");
        assert!(lex
            .scalar()
            .unwrap_err()
            .to_string()
            .contains("expected ident"));
    }

    #[test]
    fn positions_count_lines_and_columns() {
        let mut lex = Lexer::new(b"\n\n  x");
        let e = lex.next("a value").and_then(|_| lex.scalar()).unwrap_err();
        assert_eq!(e.to_string(), "expected value at line 3 column 3");
    }
}
