//! Reading back what the roles store as text, in shared data and on the stats queue: the
//! numbers, and the error for a value that is not what a role stores. Every decoder calls
//! these rather than its own inlined `str::parse` and `format!` per field: in the guest each
//! copy is code V8's optimizing compiler compiles in every worker.

use crate::quote::Quoted;
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

/// Of a malformed value, the log shows this much: another module sharing the key space can
/// store megabytes under a key, and the line is written on every request that reads it.
const SHOWN_CHARS: usize = 100;

/// `<what> "<text>": <problem>`, the error for a stored value that cannot be read; a long
/// value is cut and its size given.
#[cold]
#[inline(never)]
pub fn malformed(what: &str, text: &str, problem: Arguments) -> String {
    let shown = cut(text);
    if shown.len() < text.len() {
        format!(
            "{what} {}... ({} bytes): {problem}",
            Quoted(shown),
            text.len()
        )
    } else {
        format!("{what} {}: {problem}", Quoted(text))
    }
}

/// The part of a stored value a message shows: its first [`SHOWN_CHARS`] characters.
pub fn cut(text: &str) -> &str {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => text.get(..end).unwrap_or_default(),
        None => text,
    }
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

    /// A value another module wrote under the prefix can be any size; its error is logged on
    /// every request that reads it, so it quotes a bounded part of it.
    #[test]
    fn a_huge_malformed_stored_value_makes_a_log_line_of_bounded_size() {
        let junk = "x".repeat(1 << 20);
        let e = malformed("bucket", &junk, format_args!("expected two numbers"));
        assert!(
            e.starts_with("bucket \"xxx"),
            "{}",
            e.get(..40).unwrap_or_default()
        );
        assert!(e.len() <= 1024, "a {}-byte log line", e.len());
    }
}
