//! A message's bytes in the pieces an HTTP/1.1 peer writes one at a time. Envoy's HTTP/1
//! codec hands the filters what one socket read holds, so the `--envoy` driver writes each
//! piece once Envoy has read the one before, and each piece is one body callback.

use crate::envoy::http::HeaderMap;

/// How a body is framed: by a `content-length` or chunked (the only framing with room for
/// trailers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    Length,
    Chunked,
}

/// The body after the head, a piece per chunk: each chunk as it is, or framed as one
/// HTTP/1.1 chunk; chunked, the last chunk and the trailers are a piece of their own.
pub fn body_pieces(chunks: &[Vec<u8>], trailers: &HeaderMap, framing: BodyFraming) -> Vec<Vec<u8>> {
    let chunks = chunks.iter().filter(|c| !c.is_empty());
    match framing {
        BodyFraming::Length => chunks.cloned().collect(),
        BodyFraming::Chunked => {
            let mut pieces: Vec<Vec<u8>> = chunks
                .map(|c| {
                    let mut piece = format!("{:x}\r\n", c.len()).into_bytes();
                    piece.extend_from_slice(c);
                    piece.extend_from_slice(b"\r\n");
                    piece
                })
                .collect();
            let mut last = b"0\r\n".to_vec();
            for (k, v) in trailers {
                last.extend_from_slice(k.as_bytes());
                last.extend_from_slice(b": ");
                last.extend_from_slice(v);
                last.extend_from_slice(b"\r\n");
            }
            last.extend_from_slice(b"\r\n");
            pieces.push(last);
            pieces
        }
    }
}

/// The pieces of a whole message: the head goes with the first piece of the body.
pub fn with_head(head: Vec<u8>, mut body: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    if body.is_empty() {
        return vec![head];
    }
    let mut first = head;
    first.append(&mut body[0]);
    body[0] = first;
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_pieces_end_with_the_last_chunk_and_the_trailers() {
        let chunks = vec![b"ab".to_vec(), Vec::new(), b"cde".to_vec()];
        let trailers = vec![("x-sum".to_string(), b"1".to_vec())];
        assert_eq!(
            body_pieces(&chunks, &trailers, BodyFraming::Chunked),
            vec![
                b"2\r\nab\r\n".to_vec(),
                b"3\r\ncde\r\n".to_vec(),
                b"0\r\nx-sum: 1\r\n\r\n".to_vec()
            ]
        );
        let pieces = with_head(
            b"H\r\n\r\n".to_vec(),
            body_pieces(&chunks, &Vec::new(), BodyFraming::Length),
        );
        assert_eq!(pieces, vec![b"H\r\n\r\nab".to_vec(), b"cde".to_vec()]);
        assert_eq!(with_head(b"H".to_vec(), Vec::new()), vec![b"H".to_vec()]);
    }
}
