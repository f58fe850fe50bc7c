//! Flow nesting and documents bounded by one linear scan, before libyaml sees the text.
//!
//! The nesting found is never less than libyaml's flow level: every `[` and `{` counts, and a
//! closing bracket counts only where libyaml cannot be inside a quoted scalar, a comment or a
//! block scalar. A quote is taken as opening a scalar wherever libyaml could start a token
//! (after whitespace, a flow indicator, `:` or another quote), so text this scan misreads can
//! only make it stricter. Block scalars (`|`, `>`) are skipped by libyaml's own rule: every
//! following line that is blank or indented past the node that holds the scalar.

use super::{YamlError, MAX_DEPTH, MAX_DOCUMENTS};

#[derive(PartialEq)]
enum In {
    Plain,
    Single,
    Double,
    Comment,
}

pub(super) fn check(text: &str) -> Result<(), YamlError> {
    let bytes = text.as_bytes();
    let mut state = In::Plain;
    let (mut depth, mut line, mut documents) = (0usize, 1usize, 1usize);
    // What came before the current byte: a quote opens a scalar only at a token boundary.
    let mut prev = b'\n';
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'[' || b == b'{' {
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(YamlError::TooDeep { line });
            }
        }
        match state {
            In::Plain => match b {
                b']' | b'}' => depth = depth.saturating_sub(1),
                b'#' if prev.is_ascii_whitespace() => state = In::Comment,
                b'\'' | b'"' if opens_token(prev) => {
                    state = if b == b'"' { In::Double } else { In::Single };
                }
                b'|' | b'>' if opens_token(prev) && header_only(&bytes[i + 1..]) => {
                    let parent = parent_indent(bytes, i);
                    let end = block_end(bytes, i, parent);
                    // Brackets in the scalar's text still count as openings.
                    for &c in &bytes[i..end] {
                        if c == b'[' || c == b'{' {
                            depth += 1;
                        } else if c == b'\n' {
                            line += 1;
                        }
                    }
                    if depth > MAX_DEPTH {
                        return Err(YamlError::TooDeep { line });
                    }
                    i = end;
                    prev = b'\n';
                    if end < bytes.len() {
                        count_document(bytes, end, &mut documents)?;
                    }
                    continue;
                }
                _ => {}
            },
            In::Comment if b == b'\n' => state = In::Plain,
            In::Double if b == b'\\' => {
                // The escaped byte neither closes the scalar nor opens anything.
                prev = b;
                i += 2;
                continue;
            }
            In::Double if b == b'"' => state = In::Plain,
            In::Single if b == b'\'' => {
                if bytes.get(i + 1) == Some(&b'\'') {
                    i += 1;
                } else {
                    state = In::Plain;
                }
            }
            _ => {}
        }
        if b == b'\n' {
            line += 1;
            count_document(bytes, i + 1, &mut documents)?;
        }
        prev = b;
        i += 1;
    }
    Ok(())
}

/// Where libyaml can start a token: after whitespace, a flow indicator, `:` (a JSON-like
/// value), a quote, or a byte-order mark's last byte.
fn opens_token(prev: u8) -> bool {
    prev.is_ascii_whitespace()
        || matches!(
            prev,
            b'[' | b'{' | b',' | b':' | b']' | b'}' | b'\'' | b'"' | 0xBF
        )
}

/// A line starting at `at` that marks a document (`---` or `...`) counts one more.
fn count_document(bytes: &[u8], at: usize, documents: &mut usize) -> Result<(), YamlError> {
    let rest = &bytes[at..];
    if rest.starts_with(b"---") || rest.starts_with(b"...") {
        *documents += 1;
        if *documents > MAX_DOCUMENTS {
            return Err(YamlError::TooManyDocuments);
        }
    }
    Ok(())
}

/// Whether what follows `|` or `>` on its line is a block scalar header: indicators, then
/// nothing but a comment.
fn header_only(rest: &[u8]) -> bool {
    let line = rest.split(|&c| c == b'\n').next().unwrap_or_default();
    let body = line
        .iter()
        .position(|&c| c == b'#')
        .map_or(line, |at| &line[..at]);
    body.iter()
        .all(|c| matches!(c, b'+' | b'-' | b'1'..=b'9' | b' ' | b'\t' | b'\r'))
}

/// The indentation of the node holding a block scalar whose `|` is at `at`: the column of the
/// key or `-`/`?` entry it belongs to, or -1 at a document's root.
fn parent_indent(bytes: &[u8], at: usize) -> isize {
    let start = bytes[..at]
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1);
    let line = &bytes[start..at];
    if line.starts_with(b"---") || line.iter().all(|c| c.is_ascii_whitespace()) && start == 0 {
        return -1;
    }
    // Past leading spaces and `- `/`? ` entries: the last entry's column when nothing else
    // is left before the header, else the key's column.
    let mut col = 0;
    let mut last_entry = -1isize;
    loop {
        while col < line.len() && line[col] == b' ' {
            col += 1;
        }
        let entry = col + 1 < line.len()
            && matches!(line[col], b'-' | b'?')
            && line[col + 1].is_ascii_whitespace();
        if !entry {
            break;
        }
        last_entry = col as isize;
        col += 1;
    }
    if col >= line.len() {
        // `- |`: the scalar is the entry itself. A bare `|` line is a root or a value whose
        // key is on an earlier line; the smallest indentation keeps it conservative.
        return if last_entry >= 0 {
            last_entry
        } else {
            col as isize - 1
        };
    }
    col as isize
}

/// Where the block scalar whose header is at `at` ends: the first line after the header that
/// is neither blank nor indented past `parent`.
fn block_end(bytes: &[u8], at: usize, parent: isize) -> usize {
    let mut pos = match bytes[at..].iter().position(|&c| c == b'\n') {
        Some(p) => at + p + 1,
        None => return bytes.len(),
    };
    while pos < bytes.len() {
        let line_end = bytes[pos..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(bytes.len(), |p| pos + p);
        let line = &bytes[pos..line_end];
        let indent = line.iter().take_while(|&&c| c == b' ').count();
        let blank = line.iter().all(|c| c.is_ascii_whitespace());
        let marker = parent < 0 && (line.starts_with(b"---") || line.starts_with(b"..."));
        if !blank && (indent as isize <= parent || marker) {
            return pos;
        }
        pos = line_end + 1;
    }
    bytes.len()
}
