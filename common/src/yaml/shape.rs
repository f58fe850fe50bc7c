//! Flow nesting and documents bounded by one linear scan, before libyaml sees the text.
//!
//! The scan follows libyaml's tokens far enough to know where a `[` or `{` opens a flow
//! collection: at a token's start, or where a plain scalar inside a flow collection ends. Text
//! inside quoted scalars, block scalars, comments and block-context plain scalars is not
//! nesting and is skipped. The nesting found must never be less than libyaml's flow level, so
//! where the scan cannot be sure how libyaml reads a quote (a line that may continue a plain
//! scalar from the line before, a tag, an anchor) it counts every opening bracket up to the
//! closing quote and no closing bracket: a misreading can only make it stricter.

use super::{YamlError, MAX_DEPTH, MAX_DOCUMENTS};

#[derive(PartialEq, Clone, Copy)]
enum In {
    /// Between tokens, or in a plain scalar (`scalar`).
    Structure,
    /// A quoted scalar; `sure` when it opened where libyaml certainly starts a token.
    Single {
        sure: bool,
    },
    Double {
        sure: bool,
    },
    Comment,
    /// A tag, anchor or alias up to the next blank: its text is not nesting, but a tag may
    /// hold brackets and quotes, so openings count.
    Property,
}

struct Scan<'a> {
    bytes: &'a [u8],
    depth: usize,
    line: usize,
    documents: usize,
}

impl Scan<'_> {
    fn open(&mut self) -> Result<(), YamlError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(YamlError::TooDeep { line: self.line });
        }
        Ok(())
    }

    fn newline(&mut self, next: usize) -> Result<(), YamlError> {
        self.line += 1;
        let rest = &self.bytes[next.min(self.bytes.len())..];
        if rest.starts_with(b"---") || rest.starts_with(b"...") {
            self.documents += 1;
            if self.documents > MAX_DOCUMENTS {
                return Err(YamlError::TooManyDocuments);
            }
        }
        Ok(())
    }
}

pub(super) fn check(text: &str) -> Result<(), YamlError> {
    let bytes = text.as_bytes();
    let mut s = Scan {
        bytes,
        depth: 0,
        line: 1,
        documents: 1,
    };
    let mut state = In::Structure;
    // In a plain scalar (between tokens when false).
    let mut scalar = false;
    // This line may continue a block plain scalar from the line before, where libyaml reads
    // quotes and indicators as text: quotes opened on it are not sure. A line continues one
    // only when indented past the block holding the scalar, which is at most `continues`.
    let mut maybe_continued = false;
    let mut continues: Option<isize> = None;
    // Where the current line's first token is, and whether the line holds a key or an entry.
    let (mut line_start, mut column, mut first) = (true, 0isize, 0isize);
    let mut indicator = false;
    let mut prev = b'\n';
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let next = bytes.get(i + 1).copied().unwrap_or(b'\n');
        let flow = s.depth > 0;
        if state == In::Structure && line_start && !matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
            line_start = false;
            first = column;
            if !flow || !maybe_continued {
                maybe_continued = continues.is_some_and(|c| column > c);
            }
        }
        match state {
            In::Structure => match b {
                b'\n' => {
                    // A block plain scalar may go on in the next line (a flow one does): past
                    // the key or entry that holds it, or past its own line without one.
                    if !flow {
                        continues = match (scalar, maybe_continued) {
                            (_, true) => continues,
                            (true, false) if indicator => Some(first),
                            (true, false) => Some(first - 1),
                            (false, false) => None,
                        };
                        scalar = false;
                    }
                    indicator = false;
                }
                b' ' | b'\t' | b'\r' => {}
                b'#' if prev.is_ascii_whitespace() => {
                    state = In::Comment;
                    scalar = false;
                    maybe_continued = false;
                    continues = None;
                }
                b'[' | b'{' if !scalar || flow => {
                    s.open()?;
                    scalar = false;
                }
                b']' | b'}' if !scalar || flow => {
                    s.depth = s.depth.saturating_sub(1);
                    scalar = false;
                }
                b',' if flow => scalar = false,
                b':' if next.is_ascii_whitespace()
                    || flow && matches!(next, b',' | b'[' | b']' | b'{' | b'}') =>
                {
                    // A key's end: what follows starts a token (or libyaml refuses the line).
                    scalar = false;
                    maybe_continued = false;
                    indicator = true;
                }
                _ if scalar => {}
                b'\'' | b'"' => {
                    let sure = !maybe_continued;
                    if sure {
                        continues = None;
                    }
                    state = if b == b'"' {
                        In::Double { sure }
                    } else {
                        In::Single { sure }
                    };
                }
                b'-' | b'?' if next.is_ascii_whitespace() => indicator = true,
                b'!' | b'&' | b'*' => state = In::Property,
                b'|' | b'>' if !flow && !maybe_continued && header_only(&bytes[i + 1..]) => {
                    let end = block_end(bytes, i, parent_indent(bytes, i));
                    for (at, &c) in bytes.iter().enumerate().take(end).skip(i) {
                        if c == b'\n' {
                            s.newline(at + 1)?;
                        }
                    }
                    i = end;
                    prev = b'\n';
                    (line_start, column, indicator, continues) = (true, 0, false, None);
                    continue;
                }
                _ => scalar = true,
            },
            In::Comment if b == b'\n' => state = In::Structure,
            In::Property if b.is_ascii_whitespace() => {
                state = In::Structure;
                if b == b'\n' && !maybe_continued {
                    continues = None;
                }
            }
            In::Property if b == b'[' || b == b'{' => s.open()?,
            In::Double { sure } if b == b'\\' => {
                if !sure && matches!(next, b'[' | b'{') {
                    s.open()?;
                }
                // The escaped byte neither closes the scalar nor opens anything.
                if next == b'\n' {
                    s.newline(i + 2)?;
                }
                prev = next;
                i += 2;
                continue;
            }
            In::Double { .. } if b == b'"' => state = In::Structure,
            In::Single { .. } if b == b'\'' => {
                if next == b'\'' {
                    i += 1;
                } else {
                    state = In::Structure;
                }
            }
            In::Single { sure: false } | In::Double { sure: false } if b == b'[' || b == b'{' => {
                s.open()?
            }
            _ => {}
        }
        if b == b'\n' {
            s.newline(i + 1)?;
            (line_start, column) = (true, 0);
        } else {
            column += 1;
        }
        prev = b;
        i += 1;
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

/// Where the block scalar whose header is at `at` ends, by libyaml's rule: its indentation
/// is the header's digit past `parent`, else the first non-blank line's (at least one past
/// `parent`), and it ends at the first non-blank line indented less, or at a document marker.
fn block_end(bytes: &[u8], at: usize, parent: isize) -> usize {
    let header_end = bytes[at..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(bytes.len(), |p| at + p);
    let explicit = bytes[at + 1..header_end]
        .iter()
        .find(|c| c.is_ascii_digit())
        .map(|d| (d - b'0') as isize);
    let mut pos = header_end + 1;
    let mut indent: Option<isize> = explicit.map(|n| parent.max(0) + n);
    while pos < bytes.len() {
        let line_end = bytes[pos..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(bytes.len(), |p| pos + p);
        let line = &bytes[pos..line_end];
        let spaces = line.iter().take_while(|&&c| c == b' ').count() as isize;
        let blank = line.iter().all(|c| c.is_ascii_whitespace());
        let marker = line.starts_with(b"---") || line.starts_with(b"...");
        if marker {
            return pos;
        }
        if !blank {
            let need = *indent.get_or_insert(spaces.max(parent + 1));
            if spaces < need {
                return pos;
            }
        }
        pos = line_end + 1;
    }
    bytes.len()
}
