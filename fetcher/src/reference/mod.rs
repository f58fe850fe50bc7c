//! What a module URL names: the scheme decides the source; an `oci://` URL is an image
//! reference (`oci://host[:port]/repo[:tag][@sha256:hex]`) whose tag and digest feed the pull
//! policy and pinning.

pub mod oci;

use crate::digest::Sha256;
use crate::error::FetchError;
use oci::OciRef;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(url::Url),
    Http(url::Url),
    Oci(OciRef),
}

impl Source {
    pub fn parse(url: &str) -> Result<Self, FetchError> {
        if let Some(rest) = url
            .get(..6)
            .filter(|scheme| scheme.eq_ignore_ascii_case("oci://"))
            .and_then(|_| url.get(6..))
        {
            return oci::parse(rest).map(Source::Oci);
        }
        let parsed = url::Url::parse(url).map_err(|e| FetchError::BadUrl {
            reason: format!("{e} (expected oci://, https://, http:// or file://)"),
        })?;
        match parsed.scheme() {
            "file" => Ok(Source::File(parsed)),
            "http" | "https" => Ok(Source::Http(parsed)),
            other => Err(FetchError::UnsupportedScheme {
                scheme: other.to_string(),
            }),
        }
    }

    /// The digest the URL itself pins (`oci://…@sha256:…`).
    pub fn pinned_digest(&self) -> Option<Sha256> {
        match self {
            Source::Oci(r) => r.digest,
            _ => None,
        }
    }

    /// The one name of this source in the index, the locks and the default resource, so a
    /// module written two ways is one entry and one download. Scheme and host are lower-case
    /// and a default port is dropped (`HTTPS://Host:443/m` is `https://host/m`); for `oci://`
    /// the tag `latest` is written out when there is neither tag nor digest (as every registry
    /// client resolves it), and a tag beside a digest is dropped (the digest alone is
    /// fetched). Userinfo is replaced by `***`: the index is world-readable.
    pub fn key(&self) -> String {
        match self {
            Source::File(u) | Source::Http(u) => redact_userinfo(u.as_str()),
            Source::Oci(r) => {
                let registry = r.registry.to_ascii_lowercase();
                let registry = registry.strip_suffix(":443").unwrap_or(&registry);
                match (&r.digest, &r.tag) {
                    (Some(d), _) => format!("oci://{registry}/{}@sha256:{}", r.repository, d.hex()),
                    (None, Some(t)) => format!("oci://{registry}/{}:{t}", r.repository),
                    (None, None) => format!("oci://{registry}/{}:latest", r.repository),
                }
            }
        }
    }
}

/// The canonical key (`Source::key`) of `text` if it names a source, else `text` as it is:
/// how names recorded before keys were canonical are read.
pub fn canonical_key(text: &str) -> String {
    Source::parse(text).map_or_else(|_| text.to_string(), |s| s.key())
}

/// `text` with the userinfo of every URL in it (`scheme://user:password@host`) replaced by
/// `***`: what a program prints or logs about a URL a user typed must not repeat a password.
pub fn redact_userinfo(text: &str) -> String {
    redact(text, false)
}

/// `text` as a log line, an error or `/readyz` may show it: [`redact_userinfo`], and every
/// URL's query string replaced by `?***` (a token or a signature often rides there).
pub fn redact_for_display(text: &str) -> String {
    redact(text, true)
}

fn redact(text: &str, hide_query: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let (authority, after) = tail.split_at(end);
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = after;
        if hide_query {
            let url_end = rest
                .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '>' | ','))
                .unwrap_or(rest.len());
            if let Some(q) = rest[..url_end].find('?') {
                out.push_str(&rest[..q]);
                out.push_str("?***");
                rest = &rest[url_end..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oci(s: &str) -> OciRef {
        match Source::parse(s).unwrap() {
            Source::Oci(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_oci_url_that_does_not_parse_is_quoted_without_its_query() {
        for bad in [
            "oci://h/a?token=s3cr3t",
            "oci://h/a:t?token=s3cr3t",
            "oci://h/A#token=s3cr3t",
            "oci://h/a?x=@token=s3cr3t",
        ] {
            let e = Source::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cr3t"), "{bad}: {e}");
            assert!(e.contains("oci://h/"), "{bad}: {e}");
        }
    }

    #[test]
    fn display_hides_userinfo_and_query_strings() {
        assert_eq!(
            redact_for_display("GET (http://u:p@h/m.wasm?token=t&x=1#f) then https://k/a?sig=s b"),
            "GET (http://***@h/m.wasm?***) then https://k/a?*** b"
        );
        assert_eq!(
            redact_for_display("oci://h/a:1 no query"),
            "oci://h/a:1 no query"
        );
    }

    #[test]
    fn userinfo_is_redacted_wherever_a_url_appears() {
        for (text, shown) in [
            ("oci://user:hunter2@host/a:1", "oci://***@host/a:1"),
            (
                "http://u:p@127.0.0.1:8/m.wasm",
                "http://***@127.0.0.1:8/m.wasm",
            ),
            ("https://tok@h", "https://***@h"),
            (
                "error for url (http://a:b@h/x): then https://c:d@k?q=@x",
                "error for url (http://***@h/x): then https://***@k?q=@x",
            ),
            ("oci://host/a@sha256:00", "oci://host/a@sha256:00"),
            ("no url here: a@b", "no url here: a@b"),
            ("ünï://ü:ß@ħ/é", "ünï://***@ħ/é"),
        ] {
            assert_eq!(redact_userinfo(text), shown, "{text}");
        }
    }

    #[test]
    fn parses_oci_references() {
        let r = oci("oci://127.0.0.1:5000/team/filter:1.0");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "team/filter", Some("1.0"))
        );
        assert!(!r.is_latest() && r.is_loopback());
        let r = oci("oci://ghcr.io/a/b");
        assert!(r.tag.is_none() && r.is_latest() && !r.is_loopback());
        assert_eq!(r.to_reference().whole(), "ghcr.io/a/b:latest");
        let d = "ab".repeat(32);
        let r = oci(&format!("oci://localhost:5000/a:v1@sha256:{d}"));
        assert_eq!(r.digest.unwrap().hex(), d);
        assert!(!r.is_latest());
        assert_eq!(
            r.to_reference().whole(),
            format!("localhost:5000/a@sha256:{d}")
        );
    }

    #[test]
    fn one_source_written_two_ways_has_one_key() {
        let d = "ab".repeat(32);
        for (a, b) in [
            (
                "HTTPS://Example.COM:443/m.wasm",
                "https://example.com/m.wasm",
            ),
            ("http://Example.com:80/m.wasm", "http://example.com/m.wasm"),
            ("http://user:pw@h:8080/m.wasm", "http://***@h:8080/m.wasm"),
            ("OCI://Reg.Example:443/a/b", "oci://reg.example/a/b:latest"),
            (
                "oci://reg.example/a/b:latest",
                "oci://reg.example/a/b:latest",
            ),
            (
                &format!("oci://127.0.0.1:5000/a:v1@sha256:{d}"),
                &format!("oci://127.0.0.1:5000/a@sha256:{d}"),
            ),
            ("file:///tmp/m.wasm", "file:///tmp/m.wasm"),
        ] {
            assert_eq!(Source::parse(a).unwrap().key(), b, "{a}");
            assert_eq!(canonical_key(a), b, "{a}");
            assert_eq!(canonical_key(b), b, "a key is its own key: {b}");
        }
        for kept in [
            "oci://reg.example:5000/a:1",
            "https://h:8443/m.wasm",
            "oci://h/a:LATEST",
        ] {
            assert_eq!(canonical_key(kept), kept);
        }
        assert_eq!(
            canonical_key("extensions.istio.io/wasmplugin/ns.name"),
            "extensions.istio.io/wasmplugin/ns.name",
            "a resource name that is no URL is left alone"
        );
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "oci://host",
            "oci://host/Repo",
            "oci://host/a@md5:00",
            "oci://host/a:bad tag",
            "oci://host/../etc:1",
            "oci://host/a/./b:1",
            "oci://host/a//b:1",
            "oci://host/a/:1",
            "oci://host/-a:1",
            "oci://host:99999/a:1",
            "oci://host:port/a:1",
            "oci://[::1/a:1",
            "oci://::1:5000/a:1",
            "oci://host?x/a:1",
            "oci://user:pass@host/a:1",
            "oci://../repo:1",
            "oci://./repo:1",
            "oci://a..b/repo:1",
            "oci://-host.example/repo:1",
            "oci://host_1.example/repo:1",
        ] {
            assert!(
                matches!(Source::parse(bad), Err(FetchError::BadUrl { .. })),
                "{bad}"
            );
        }
        let e = Source::parse("oci://user:secret@host/a:1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("credentials"), "{e}");
        let e = Source::parse("oci://host:99999/a:1")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("invalid URL") && e.contains("port"), "{e}");
        let r = oci("oci://[::1]:5000/a/b:1");
        assert_eq!(r.registry, "[::1]:5000");
        assert!(matches!(
            Source::parse("ftp://x/y"),
            Err(FetchError::UnsupportedScheme { .. })
        ));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn any_text_parses_or_is_refused_without_panic(s in "\\PC{0,120}") {
                let _ = Source::parse(&s);
                let _ = Source::parse(&format!("oci://{s}"));
            }

            #[test]
            fn an_accepted_reference_has_no_traversal_and_no_credentials(
                registry in "[a-z0-9.:@\\[\\]-]{0,24}",
                path in "[a-z0-9A-Z._/:@-]{0,48}",
            ) {
                if let Ok(Source::Oci(r)) = Source::parse(&format!("oci://{registry}/{path}")) {
                    prop_assert!(!r.registry.contains('@') && !r.registry.contains('/'));
                    prop_assert!(r
                        .repository
                        .split('/')
                        .all(|seg| !seg.is_empty() && seg != "." && seg != ".."));
                    let endpoint = format!("https://{}/v2/{}/manifests/x", r.registry, r.repository);
                    prop_assert!(url::Url::parse(&endpoint).is_ok(), "{}", endpoint);
                }
            }
        }
    }
}
