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

/// Many names someone else chose (an index's platforms or versions), as one short part of a
/// message: each distinct name [`shown`] and cut to 40 characters, at most 10 of them, then how
/// many more there are.
pub fn listed<I: IntoIterator<Item = String>>(items: I) -> String {
    const MOST: usize = 10;
    let mut seen: Vec<String> = Vec::new();
    let mut more = 0usize;
    for item in items {
        let item: String = shown(&item).chars().take(40).collect();
        if seen.contains(&item) {
            continue;
        }
        if seen.len() < MOST {
            seen.push(item);
        } else {
            more += 1;
        }
    }
    let mut out = seen.join(", ");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_list_of_hostile_names_is_one_short_line() {
        let names = (0..5000).map(|i| format!("linux/\u{1b}[31m{i}\nX{}", "y".repeat(100)));
        let text = listed(names);
        assert!(text.len() < 600, "{}", text.len());
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(text.ends_with(" and 4990 more"), "{text}");
        assert_eq!(listed(["a".into(), "a".into(), "b".into()]), "a, b");
    }
}
