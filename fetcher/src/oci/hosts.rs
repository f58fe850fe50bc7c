//! Registry mirrors, configured as containerd configures them: `DIR/<host>/hosts.toml` (or
//! `DIR/_default/hosts.toml`) lists `[host."URL"]` entries, tried in file order, then `server`
//! (the registry itself when absent). <https://github.com/containerd/containerd/blob/main/docs/hosts.md>
//!
//! A mirror is another party: it gets none of the upstream registry's credentials, and its
//! URL passes the same rules as a registry's (plain HTTP only to loopback or a host listed in
//! `WASM_INSECURE_REGISTRIES`, every address through the guard).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::distribution::Scheme;
use crate::error::FetchError;
use crate::settings::Settings;

/// A hosts.toml is a few dozen lines; anything larger is not one.
pub const HOSTS_TOML_LIMIT: u64 = 64 << 10;
/// `ca` files: the same bound as `--ca-file`.
const CA_LIMIT: u64 = crate::regular_file::CA_FILE_LIMIT;

/// One place to pull from, in the order to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]`.
    pub host: String,
    pub scheme: Scheme,
    /// The API root: `/v2` below the URL's path, or the path itself with `override_path`.
    pub root: String,
    /// `skip_verify`: TLS without verification (or plain HTTP for an `http` URL).
    pub skip_verify: bool,
    /// `ca`: PEM files trusted for this host only, resolved against the file's directory.
    pub ca: Vec<PathBuf>,
    /// `client`: the certificate and key files (PEM) presented to this host only.
    pub client: Option<(PathBuf, PathBuf)>,
    /// The registry itself (the reference's host): the only endpoint its credentials go to.
    pub upstream: bool,
    /// `capabilities`: what this host may be asked, as containerd asks it.
    pub may: May,
}

/// What a host may be asked (`capabilities`; `push` is no pull's business).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum May {
    /// `pull` and `resolve`: a tag, and the manifests and blobs.
    PullAndResolve,
    /// `pull` alone: content by digest only; a tag is resolved at another host first.
    Pull,
    /// `resolve` alone: asked nothing by a pull (see `Registry::resolve`).
    Resolve,
}

impl May {
    pub fn pull(self) -> bool {
        matches!(self, May::PullAndResolve | May::Pull)
    }
}

/// What a pull tries: the mirrors, then the server. `server` is `None` when hosts.toml names
/// none, so the registry is reached as without a hosts.toml (its protocol found by ping).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hosts {
    pub mirrors: Vec<Endpoint>,
    pub server: Option<Endpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    server: Option<String>,
    #[serde(default)]
    host: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    skip_verify: bool,
    ca: Option<OneOrMany>,
    client: Option<ClientFiles>,
    #[serde(default)]
    override_path: bool,
}

/// `client`, as containerd reads it: one PEM file holding the certificate and its key, a list
/// of such files, or a list of `[certificate, key]` pairs (an empty key: the key is in the
/// certificate's file).
#[derive(Deserialize)]
#[serde(untagged)]
enum ClientFiles {
    One(String),
    Many(Vec<ClientFile>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ClientFile {
    Combined(String),
    Pair(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The hosts to pull `registry`'s image from, from the hosts.toml under `dir` that names it
/// (or `_default`); none when neither exists.
pub fn load(dir: &Path, registry: &str, settings: &Settings) -> Result<Hosts, FetchError> {
    if !is_host_port(registry) {
        return Err(FetchError::BadUrl {
            reason: format!(
                "registry {:?} is not a host[:port], so it names no directory of the hosts directory",
                crate::shown::shown(registry)
            ),
        });
    }
    let own = dir.join(registry).join("hosts.toml");
    let path = if own.exists() {
        own
    } else {
        let fallback = dir.join("_default").join("hosts.toml");
        if !fallback.exists() {
            return Ok(Hosts::default());
        }
        fallback
    };
    let bytes = crate::regular_file::read_input(&path, "hosts.toml", HOSTS_TOML_LIMIT)?;
    parse(&bytes, &path, registry, settings)
}

/// Whether `registry` is a `host[:port]` that names one directory below the hosts directory:
/// DNS labels of letters, digits, `-` and `_` (never empty, so never `.` or `..`), or an IP
/// address (IPv6 in brackets), then an optional numeric port.
fn is_host_port(registry: &str) -> bool {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && !p.contains(']') => (h, Some(p)),
        _ => (registry, None),
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
        }
    };
    port_ok && host_ok
}

fn bad(path: &Path, reason: String) -> FetchError {
    FetchError::Read {
        what: "hosts.toml",
        path: path.to_path_buf(),
        reason,
    }
}

/// A parse error in words that quote none of the file's lines (the file may be a link to
/// something secret): where it is, and the parser's message alone, on one line.
fn not_valid(text: &str, e: &toml::de::Error) -> String {
    let at = match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            format!(" at line {line}")
        }
        None => String::new(),
    };
    let message = e.message().lines().next().unwrap_or_default();
    format!("not valid TOML{at}: {}", crate::shown::shown(message))
}

/// Parses a hosts.toml read from `path`.
pub fn parse(
    bytes: &[u8],
    path: &Path,
    registry: &str,
    settings: &Settings,
) -> Result<Hosts, FetchError> {
    let text = std::str::from_utf8(bytes).map_err(|_| bad(path, "not UTF-8 text".into()))?;
    let file: File = toml::from_str(text).map_err(|e| bad(path, not_valid(text, &e)))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut mirrors = Vec::new();
    for (url, value) in file.host {
        let entry: HostEntry = value
            .try_into()
            .map_err(|e| bad(path, format!("[host.{url:?}]: {e}")))?;
        let caps = entry
            .capabilities
            .unwrap_or_else(|| vec!["pull".into(), "resolve".into(), "push".into()]);
        for c in &caps {
            if !matches!(c.as_str(), "pull" | "resolve" | "push") {
                return Err(bad(
                    path,
                    format!("[host.{url:?}]: unknown capability {c:?} (pull, resolve, push)"),
                ));
            }
        }
        let has = |c: &str| caps.iter().any(|x| x == c);
        let ca = match entry.ca {
            None => Vec::new(),
            Some(OneOrMany::One(p)) => vec![base.join(p)],
            Some(OneOrMany::Many(ps)) => ps.into_iter().map(|p| base.join(p)).collect(),
        };
        let client = client_files(entry.client, base)
            .map_err(|reason| bad(path, format!("[host.{url:?}]: client: {reason}")))?;
        let may = match (has("pull"), has("resolve")) {
            (true, true) => May::PullAndResolve,
            (true, false) => May::Pull,
            (false, true) => May::Resolve,
            // `push` alone: a pull never asks it.
            (false, false) => continue,
        };
        let endpoint = endpoint(
            &url,
            entry.override_path,
            entry.skip_verify,
            ca,
            registry,
            settings,
        )
        .map_err(|reason| bad(path, format!("[host.{url:?}]: {reason}")))?;
        mirrors.push(Endpoint {
            may,
            client,
            ..endpoint
        });
    }
    let server = file
        .server
        .map(|url| {
            endpoint(&url, false, false, Vec::new(), registry, settings)
                .map_err(|reason| bad(path, format!("server {url:?}: {reason}")))
        })
        .transpose()?;
    Ok(Hosts { mirrors, server })
}

/// An endpoint from a URL of hosts.toml; plain HTTP is refused unless the host is loopback or
/// listed in `WASM_INSECURE_REGISTRIES`.
fn endpoint(
    raw: &str,
    override_path: bool,
    skip_verify: bool,
    ca: Vec<PathBuf>,
    registry: &str,
    settings: &Settings,
) -> Result<Endpoint, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL ({e})"))?;
    let scheme = match url.scheme() {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        other => return Err(format!("scheme {other:?}: only http and https")),
    };
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err("a host URL holds no credentials nor query".into());
    }
    let host = match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        (None, _) => return Err("no host".into()),
    };
    let loopback = crate::reference::oci::is_loopback_host(&host);
    if scheme == Scheme::Http && !loopback && !settings.is_insecure_registry(&host) {
        return Err(format!(
            "plain HTTP to {host}: only loopback hosts or hosts listed in WASM_INSECURE_REGISTRIES may be reached without TLS"
        ));
    }
    crate::guard::check_url(&url, &settings.blocked_cidrs).map_err(|r| r.to_string())?;
    let path = url.path().trim_end_matches('/');
    let root = if override_path || path.ends_with("/v2") {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    Ok(Endpoint {
        upstream: host == registry,
        may: May::PullAndResolve,
        host,
        scheme,
        root,
        skip_verify,
        ca,
        client: None,
    })
}

/// The certificate file and the key file (the same file when the key is in it) a host's
/// `client` names, resolved against the hosts.toml's directory. One client certificate per
/// host: rustls presents one, where Go's TLS would pick among several by the server's CAs.
fn client_files(
    client: Option<ClientFiles>,
    base: &Path,
) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let mut pairs = match client {
        None => return Ok(None),
        Some(ClientFiles::One(p)) => vec![(p.clone(), p)],
        Some(ClientFiles::Many(files)) => files
            .into_iter()
            .map(|f| match f {
                ClientFile::Combined(p) => Ok((p.clone(), p)),
                ClientFile::Pair(pair) => match <[String; 2]>::try_from(pair) {
                    Ok([cert, key]) if key.is_empty() => Ok((cert.clone(), cert)),
                    Ok([cert, key]) => Ok((cert, key)),
                    Err(_) => Err("a pair is [certificate, key]".to_string()),
                },
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    if pairs.len() > 1 {
        return Err("more than one client certificate: give the one this host accepts".into());
    }
    Ok(pairs
        .pop()
        .map(|(cert, key)| (base.join(cert), base.join(key))))
}

/// Whether a host's failure sends the pull on to the next host, as containerd does: it could
/// not be reached, or answered an error (404, 5xx, a refusal to a mirror that got no
/// credentials). An answer that is wrong (a digest mismatch, a size over the limit) or a
/// guard refusal ends the pull: another host would not make it right.
pub fn falls_through(e: &FetchError) -> bool {
    matches!(
        e,
        FetchError::Network { .. }
            | FetchError::TimedOut { .. }
            | FetchError::NotFound { .. }
            | FetchError::HttpStatus { .. }
            | FetchError::Registry { .. }
            | FetchError::Unauthorized { .. }
            | FetchError::UntrustedCertificate { .. }
            | FetchError::Truncated { .. }
    )
}

/// A `host[:port]` as a query value, encoded as containerd encodes it (Go's `url.Values`):
/// letters, digits, `.`, `-`, `_`, `~` as they are, everything else (the port's `:`, an IPv6
/// literal's brackets) percent-encoded, so a mirror that compares `ns` byte for byte sees
/// the same value from both.
pub fn ns_value(ns: &str) -> String {
    ns.chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~') => c.to_string(),
            c => {
                let mut buf = [0u8; 4];
                c.encode_utf8(&mut buf)
                    .bytes()
                    .map(|b| format!("%{b:02X}"))
                    .collect()
            }
        })
        .collect()
}

/// The settings to reach `e` with: its own `ca` files trusted beside the others, and its
/// `client` certificate presented (to it alone).
pub fn settings_for(e: &Endpoint, settings: &Settings) -> Result<Settings, FetchError> {
    let mut s = settings.clone();
    s.client_identity = None;
    if let Some((cert, key)) = &e.client {
        let mut pem = crate::regular_file::read_input(cert, "hosts.toml client", CA_LIMIT)?;
        if key != cert {
            pem.push(b'\n');
            pem.extend(crate::regular_file::read_input(
                key,
                "hosts.toml client key",
                CA_LIMIT,
            )?);
        }
        s.client_identity = Some(pem);
    }
    for path in &e.ca {
        let pem = crate::regular_file::read_input(path, "hosts.toml ca", CA_LIMIT)?;
        s.add_ca_pem(pem).map_err(|reason| FetchError::Read {
            what: "hosts.toml ca",
            path: path.clone(),
            reason,
        })?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_host_port_names_a_directory() {
        for ok in [
            "reg.example",
            "reg.example:5000",
            "127.0.0.1:5000",
            "[::1]:5000",
            "my_reg",
        ] {
            assert!(is_host_port(ok), "{ok}");
        }
        for bad in [
            "..",
            ".",
            "",
            "a/b",
            "a..b",
            "reg:",
            "reg:x",
            "[::1",
            "a\\b",
            "reg:123456",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }

    #[test]
    fn a_parse_error_says_where_without_quoting_the_line() {
        let e = parsed("# mirrors\nroot:$6$s3cr3t:19000\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid TOML at line 2"), "{e}");
        assert!(!e.contains("s3cr3t") && !e.contains("root"), "{e}");
    }

    fn parsed(text: &str) -> Result<Hosts, FetchError> {
        parse(
            text.as_bytes(),
            Path::new("/etc/mirrors/reg.example/hosts.toml"),
            "reg.example",
            &Settings::default(),
        )
    }

    #[test]
    fn a_client_certificate_is_one_file_or_one_pair_beside_the_file() {
        let client = |value: &str| {
            parsed(&format!(
                "[host.\"https://m.example\"]\n  client = {value}\n"
            ))
            .map(|h| h.mirrors[0].client.clone())
        };
        let dir = Path::new("/etc/mirrors/reg.example");
        let both = |c: &str, k: &str| Some((dir.join(c), dir.join(k)));
        assert_eq!(client("\"c.pem\"").unwrap(), both("c.pem", "c.pem"));
        assert_eq!(client("[\"c.pem\"]").unwrap(), both("c.pem", "c.pem"));
        assert_eq!(
            client("[[\"c.pem\", \"/k/c.key\"]]").unwrap(),
            Some((dir.join("c.pem"), PathBuf::from("/k/c.key")))
        );
        assert_eq!(
            client("[[\"c.pem\", \"\"]]").unwrap(),
            both("c.pem", "c.pem")
        );
        for bad in ["[[\"a\", \"b\", \"c\"]]", "[\"a.pem\", \"b.pem\"]", "3"] {
            assert!(client(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_keep_file_order_with_what_each_may_be_asked() {
        let h = parsed(
            r#"
server = "https://reg.example"
[host."https://z.mirror/cache"]
  capabilities = ["pull", "resolve"]
  ca = "z.pem"
[host."https://push.only"]
  capabilities = ["push"]
[host."http://127.0.0.1:5001"]
[host."https://a.mirror/v2/custom"]
  override_path = true
  skip_verify = true
[host."https://blobs.only"]
  capabilities = ["pull"]
"#,
        )
        .unwrap();
        let hosts: Vec<_> = h.mirrors.iter().map(|m| m.host.as_str()).collect();
        assert_eq!(
            hosts,
            ["z.mirror", "127.0.0.1:5001", "a.mirror", "blobs.only"]
        );
        let may: Vec<May> = h.mirrors.iter().map(|m| m.may).collect();
        assert_eq!(
            may,
            [
                May::PullAndResolve,
                May::PullAndResolve,
                May::PullAndResolve,
                May::Pull
            ]
        );
        assert_eq!(h.mirrors[0].root, "/cache/v2");
        assert_eq!(
            h.mirrors[0].ca,
            [PathBuf::from("/etc/mirrors/reg.example/z.pem")]
        );
        assert_eq!(h.mirrors[1].scheme, Scheme::Http);
        assert_eq!(h.mirrors[2].root, "/v2/custom");
        assert!(h.mirrors[2].skip_verify);
        assert!(h.mirrors.iter().all(|m| !m.upstream));
        let server = h.server.unwrap();
        assert!(server.upstream);
        assert_eq!(server.root, "/v2");
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_the_fault() {
        for (text, words) in [
            ("server = ", "not valid"),
            ("[host.\"https://m\"]\ncolour = 1\n", "colour"),
            ("[host.\"https://m\"]\ncapabilities = [\"fly\"]\n", "fly"),
            ("[host.\"http://m.example\"]\n", "plain HTTP to m.example"),
            ("[host.\"ftp://m\"]\n", "only http and https"),
            ("[host.\"https://u:p@m\"]\n", "credentials"),
            ("[host.\"https://169.254.169.254\"]\n", "169.254.169.254"),
        ] {
            let e = parsed(text).unwrap_err().to_string();
            assert!(
                e.contains("/etc/mirrors/reg.example/hosts.toml") && e.contains(words),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn listed_insecure_hosts_may_be_plain_http() {
        let s = Settings {
            insecure_registries: vec!["m.example".into()],
            ..Settings::default()
        };
        let h = parse(
            b"[host.\"http://m.example\"]\n",
            Path::new("hosts.toml"),
            "reg.example",
            &s,
        )
        .unwrap();
        assert_eq!(h.mirrors[0].scheme, Scheme::Http);
    }
}
