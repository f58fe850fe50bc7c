//! How a value a client, an upstream or a configuration gave is shown in a message.

/// `s` between quotes, escaped as serde_json writes a string (quote, backslash, control
/// characters), and also every character that would split or reorder a log line in a viewer
/// (DEL, C1 controls, line and paragraph separators, bidi marks and overrides). Not `{:?}`,
/// whose Debug code and Unicode tables would be compiled into every VM for messages alone.
pub struct Quoted<'a>(pub &'a str);

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let out = serde_json::to_string(self.0).map_err(|_| std::fmt::Error)?;
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

/// What JSON leaves as it is but a log line must not hold raw.
fn breaks_a_line(c: char) -> bool {
    matches!(c, '\u{7f}'..='\u{9f}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::Quoted;

    #[test]
    fn quotes_as_json_and_escapes_what_breaks_a_log_line() {
        assert_eq!(Quoted("a\"b\\c\n\u{1}").to_string(), r#""a\"b\\c\n\u0001""#);
        assert_eq!(
            Quoted("x\u{2028}y\u{85}").to_string(),
            r#""x\u2028y\u0085""#
        );
        assert_eq!(Quoted("ünï").to_string(), "\"ünï\"");
    }
}
