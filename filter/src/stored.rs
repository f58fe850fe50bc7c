//! Reading back what the roles store as text, in shared data and on the stats queue: the
//! numbers, and the error for a value that is not what a role stores. Every decoder calls
//! these rather than its own inlined `str::parse` and `format!` per field: in the guest each
//! copy is code V8's optimizing compiler compiles in every worker.

use crate::json::write::Quoted;
use std::fmt::Arguments;

/// A decimal `u64`, as `str::parse` reads one.
#[inline(never)]
pub fn number(text: &str) -> Option<u64> {
    text.parse().ok()
}

/// The stored bytes as text; `what` names the value in the error.
pub fn text<'a>(value: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(value).map_err(|_| format!("{what} is not UTF-8"))
}

/// `<what> "<text>": <problem>`, the error for a stored value that cannot be read.
#[cold]
#[inline(never)]
pub fn malformed(what: &str, text: &str, problem: Arguments) -> String {
    format!("{what} {}: {problem}", Quoted(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_str_parse_reads_them() {
        for (text, want) in [
            ("0", Some(0)),
            ("+7", Some(7)),
            ("007", Some(7)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("-1", None),
            ("", None),
            (" 1", None),
            ("1x", None),
        ] {
            assert_eq!(number(text), want, "{text:?}");
        }
    }

    #[test]
    fn errors_name_the_value_and_quote_it() {
        assert_eq!(
            text(b"\xff", "bucket"),
            Err("bucket is not UTF-8".to_string())
        );
        assert_eq!(text(b"1 2", "bucket"), Ok("1 2"));
        assert_eq!(
            malformed("entry", "a\"b", format_args!("no {}", "bucket")),
            r#"entry "a\"b": no bucket"#
        );
    }
}
