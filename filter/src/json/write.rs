//! Writing JSON: strings escaped as serde_json escapes them (quote, backslash, control
//! characters; everything else as it is), and objects written key by key.

/// `s` as a JSON string, appended to `out`.
pub fn quote(s: &str, out: &mut String) {
    out.push('"');
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(s.get(run..i).unwrap_or_default());
        run = i + 1;
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(escape);
        }
    }
    out.push_str(s.get(run..).unwrap_or_default());
    out.push('"');
}

/// `s` between quotes with its quotes, backslashes and control characters escaped, as
/// [`quote`] writes it, and also every character that would split or reorder a log line in
/// a viewer (DEL, C1 controls, line and paragraph separators, bidi marks and overrides):
/// how a value a client or upstream sent is shown in a message. Not `{:?}`, whose Debug code
/// and Unicode tables would be compiled into every VM for error messages alone.
pub struct Quoted<'a>(pub &'a str);

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::with_capacity(self.0.len() + 2);
        quote(self.0, &mut out);
        if !out.chars().any(breaks_a_line) {
            return f.write_str(&out);
        }
        for c in out.chars() {
            if breaks_a_line(c) {
                write!(f, "\\u{:04x}", u32::from(c))?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// What [`quote`] leaves as it is (JSON needs no more) but a log line must not hold raw.
fn breaks_a_line(c: char) -> bool {
    matches!(c, '\u{7f}'..='\u{9f}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// An object being written: `{`, then `"key":value` pairs, then `}` on [`Object::end`].
pub struct Object<'o> {
    out: &'o mut String,
    empty: bool,
}

impl<'o> Object<'o> {
    pub fn new(out: &'o mut String) -> Self {
        out.push('{');
        Self { out, empty: true }
    }

    /// Writes the key; the caller writes the value into what is returned.
    pub fn key(&mut self, key: &str) -> &mut String {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        quote(key, self.out);
        self.out.push(':');
        self.out
    }

    pub fn number(&mut self, key: &str, n: u64) {
        let out = self.key(key);
        out.push_str(&n.to_string());
    }

    pub fn end(self) {
        self.out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_like_serde_json() {
        for s in [
            "plain",
            "",
            "q\"b\\s/",
            "\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}",
            "é€😀 <>&'",
        ] {
            let mut out = String::new();
            quote(s, &mut out);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
            // DEL is JSON as it is, but no log line's.
            assert_eq!(Quoted(s).to_string(), out.replace('\u{7f}', "\\u007f"));
        }
        // Where a message's value has no control characters, it reads as `{:?}` did.
        assert_eq!(Quoted("x-a b\"").to_string(), format!("{:?}", "x-a b\""));
    }

    /// `Quoted` shows values in log lines, some from any client (a request's
    /// `content-encoding`) or any worker (a malformed shared-data value). `{:?}` wrote DEL,
    /// C1 controls, Unicode line/paragraph separators and bidi overrides escaped; written raw
    /// they split or reorder the line in a log viewer or terminal.
    #[test]
    fn a_message_shows_line_separators_bidi_and_c1_controls_escaped() {
        for c in [
            '\u{7f}', '\u{85}', '\u{9b}', '\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}',
        ] {
            let value = format!("gzip{c}x");
            let shown = Quoted(&value).to_string();
            assert!(
                !shown.contains(c),
                "U+{:04X} written raw: {}",
                u32::from(c),
                shown.escape_default()
            );
        }
    }

    #[test]
    fn objects_are_written_key_by_key() {
        let mut out = String::new();
        let mut o = Object::new(&mut out);
        o.number("a\"", 1);
        let mut inner = Object::new(o.key("b"));
        inner.number("c", u64::MAX);
        inner.end();
        Object::new(o.key("d")).end();
        o.end();
        assert_eq!(out, r#"{"a\"":1,"b":{"c":18446744073709551615},"d":{}}"#);
    }
}
