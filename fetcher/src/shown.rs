//! How text someone else chose reaches a message: every error, log line and refusal quotes
//! URLs, headers and servers' words through here, so none can split a line or flood a log.

/// Text someone else chose (a URL, a header, a server's message) as a message may quote it:
/// at most 200 characters, on one line.
pub fn shown(text: &str) -> String {
    text.chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
