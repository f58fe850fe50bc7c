//! Where the fetcher may connect. A module source, a redirect, a registry's token realm or an
//! image's foreign layer URL is chosen by someone else; inside a pod or on a node, an address
//! such as the cloud metadata service answers whoever asks. So, as Istio's agent does at dial
//! time, every address is checked after DNS resolution, before the connection is made:
//! link-local and cloud metadata addresses are always refused, and `BLOCKED_CIDRS_IN_WASM_FETCH`
//! adds more.
//!
//! The check has three homes, one per way an address reaches a connection:
//! - [`GuardedResolver`]: the HTTP client's DNS resolver, so every host name, on the first
//!   request, each redirect hop, the token realm and the proxy itself, is checked;
//! - [`check_url`] before a request is sent: a resolver never sees an IP literal, and through a
//!   proxy the dial goes to the proxy, which would reach the literal from its own network;
//! - [`redirect_policy`]: the same literal check on every hop, plus no `https` to `http`
//!   downgrade and no scheme other than `http`/`https`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// 169.254.0.0/16, fe80::/10 and link-local multicast.
    LinkLocal,
    /// 169.254.169.254 (AWS, GCP, Azure, ...), fd00:ec2::/32 (AWS IMDSv6), 100.100.100.200
    /// (Alibaba Cloud).
    CloudMetadata,
    /// A range of `BLOCKED_CIDRS_IN_WASM_FETCH`.
    Listed(IpNet),
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::LinkLocal => f.write_str("a link-local address (always refused)"),
            Rule::CloudMetadata => f.write_str("a cloud metadata address (always refused)"),
            Rule::Listed(net) => write!(f, "in {net}, listed in BLOCKED_CIDRS_IN_WASM_FETCH"),
        }
    }
}

/// A connection or request the guard stopped before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("blocked address: {host} is {addr}, {rule}")]
    Blocked {
        host: String,
        addr: IpAddr,
        rule: Rule,
    },
    #[error("insecure redirect from {from} to {to}: an https source may not redirect to http")]
    InsecureRedirect { from: String, to: String },
    #[error("insecure redirect from {from} to {to}: a registry may redirect to another host over plain http only if that host is loopback or listed in WASM_INSECURE_REGISTRIES")]
    PlainRedirect { from: String, to: String },
    #[error("refused redirect to {to}: only http and https are followed")]
    RedirectScheme { to: String },
    #[error("refused redirect to {to}: more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects { to: String },
}

/// As Go's HTTP client (Istio): at most 10 hops.
pub const MAX_REDIRECTS: usize = 10;

const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
];

/// The rule that refuses `addr`, if any. IPv4 addresses written as IPv6 (`::ffff:a.b.c.d`,
/// and NAT64's `64:ff9b::/96`) are judged as the IPv4 address they reach.
pub fn rule_for(addr: IpAddr, listed: &[IpNet]) -> Option<Rule> {
    let addr = match addr {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let always = match addr {
        IpAddr::V4(v4) if METADATA_V4.contains(&v4) => Some(Rule::CloudMetadata),
        IpAddr::V4(v4) if v4.is_link_local() => Some(Rule::LinkLocal),
        // 224.0.0.0/24: link-local multicast.
        IpAddr::V4(v4) if v4.octets()[..3] == [224, 0, 0] => Some(Rule::LinkLocal),
        IpAddr::V6(v6) if v6.segments()[..2] == [0xfd00, 0x0ec2] => Some(Rule::CloudMetadata),
        // fe80::/10, and ff02::/16 (link-local multicast).
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 || v6.segments()[0] == 0xff02 => {
            Some(Rule::LinkLocal)
        }
        _ => None,
    };
    always.or_else(|| {
        listed
            .iter()
            .find(|net| net.contains(&addr))
            .map(|net| Rule::Listed(*net))
    })
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]).then(|| {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    })
}

/// `BLOCKED_CIDRS_IN_WASM_FETCH`: comma-separated CIDRs (a bare address is a /32 or /128).
/// Unlike Istio, which logs and skips an entry it cannot parse, a bad entry is an error: a
/// typo must not silently unblock a range.
pub fn parse_cidrs(text: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map(|n| n.trunc())
                .map_err(|_| format!("{s:?} is not a CIDR (expected e.g. 10.0.0.0/8 or fd00::/8)"))
        })
        .collect()
}

/// The guard's verdict on one address of `host`.
pub fn check(host: &str, addr: IpAddr, listed: &[IpNet]) -> Result<(), Refusal> {
    match rule_for(addr, listed) {
        Some(rule) => Err(Refusal::Blocked {
            host: host.to_string(),
            addr,
            rule,
        }),
        None => Ok(()),
    }
}

/// Checks a URL whose host is an IP literal; a host name is left to [`GuardedResolver`].
pub fn check_url(url: &url::Url, listed: &[IpNet]) -> Result<(), Refusal> {
    let addr = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    check(url.host_str().unwrap_or_default(), addr, listed)
}

/// The HTTP clients' DNS resolver: the system's answer, refused whole when any address in it
/// is blocked (a name that also resolves to the metadata service is not one to trust), within
/// `deadline`.
#[derive(Clone)]
pub struct GuardedResolver {
    listed: Arc<[IpNet]>,
    deadline: Duration,
}

impl GuardedResolver {
    pub fn new(listed: &[IpNet], deadline: Duration) -> Self {
        Self {
            listed: listed.into(),
            deadline,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot resolve {host}: {reason}")]
struct ResolveFailed {
    host: String,
    reason: String,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let listed = self.listed.clone();
        let deadline = self.deadline;
        Box::pin(async move {
            let failed = |reason: String| ResolveFailed {
                host: crate::shown::shown(&host),
                reason,
            };
            let found = tokio::time::timeout(deadline, tokio::net::lookup_host((host.as_str(), 0)))
                .await
                .map_err(|_| failed(format!("no answer within {deadline:?}")))?
                .map_err(|e| failed(e.to_string()))?;
            let addrs: Vec<SocketAddr> = found.collect();
            for a in &addrs {
                check(&host, a.ip(), &listed)?;
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Who may be spoken to in plain HTTP after a redirect.
#[derive(Debug, Clone)]
pub enum PlainHttp {
    /// Any host (an `http://` module source: the user chose plain HTTP for it).
    Anywhere,
    /// A registry's hosts: the host already spoken to, loopback hosts, and these
    /// `WASM_INSECURE_REGISTRIES` entries (`host[:port]`, or `*` for all).
    Registries(Arc<[String]>),
}

/// Whether `url` may be reached over plain HTTP as a registry is: its host is a loopback
/// literal or `localhost` (the bytes stay on the machine), or its `host[:port]` is listed in
/// `insecure` (or `*` is). A name that merely resolves to loopback is not enough: what it
/// resolves to can change between the check and the request.
pub fn plain_http_allowed(url: &url::Url, insecure: &[String]) -> bool {
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    let listed = url.host_str().is_some_and(|host| {
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        insecure.iter().any(|r| r == "*" || *r == authority)
    });
    loopback || listed
}

/// Redirects: at most [`MAX_REDIRECTS`] hops, `http`/`https` only, never from `https` down to
/// `http`, for a registry never on to another host over `http` unless that host may be spoken
/// to in plain HTTP itself ([`PlainHttp`]), and every literal address checked. reqwest drops
/// `Authorization` on a hop to another host, port or scheme, so credentials stay with the host
/// they were meant for.
pub fn redirect_policy(listed: &[IpNet], plain: PlainHttp) -> reqwest::redirect::Policy {
    let listed: Arc<[IpNet]> = listed.into();
    reqwest::redirect::Policy::custom(move |attempt| {
        let to = crate::shown::shown(attempt.url().as_str());
        let from = attempt.previous().last().cloned();
        let shown_from = || {
            from.as_ref()
                .map(|f| crate::shown::shown(f.as_str()))
                .unwrap_or_default()
        };
        let same_origin = from
            .as_ref()
            .is_some_and(|f| f.origin() == attempt.url().origin());
        let refusal = if attempt.previous().len() > MAX_REDIRECTS {
            Some(Refusal::TooManyRedirects { to })
        } else {
            match attempt.url().scheme() {
                "https" => None,
                "http" if from.as_ref().is_some_and(|f| f.scheme() == "https") => {
                    Some(Refusal::InsecureRedirect {
                        from: shown_from(),
                        to,
                    })
                }
                "http" => match &plain {
                    PlainHttp::Registries(insecure)
                        if !same_origin && !plain_http_allowed(attempt.url(), insecure) =>
                    {
                        Some(Refusal::PlainRedirect {
                            from: shown_from(),
                            to,
                        })
                    }
                    _ => None,
                },
                _ => Some(Refusal::RedirectScheme { to }),
            }
            .or_else(|| check_url(attempt.url(), &listed).err())
        };
        match refusal {
            Some(r) => attempt.error(r),
            None => attempt.follow(),
        }
    })
}

/// The guard's refusal inside an error chain (reqwest wraps what the resolver and the redirect
/// policy return).
pub fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn link_local_and_metadata_are_always_refused() {
        for (addr, rule) in [
            ("169.254.169.254", Rule::CloudMetadata),
            ("100.100.100.200", Rule::CloudMetadata),
            ("fd00:ec2::254", Rule::CloudMetadata),
            ("fd00:ec2::1", Rule::CloudMetadata),
            ("169.254.0.1", Rule::LinkLocal),
            ("169.254.255.255", Rule::LinkLocal),
            ("fe80::1", Rule::LinkLocal),
            ("febf::1", Rule::LinkLocal),
            ("224.0.0.251", Rule::LinkLocal),
            ("ff02::fb", Rule::LinkLocal),
            // The same addresses written as IPv6.
            ("::ffff:169.254.169.254", Rule::CloudMetadata),
            ("::ffff:169.254.1.1", Rule::LinkLocal),
            ("64:ff9b::a9fe:a9fe", Rule::CloudMetadata),
        ] {
            assert_eq!(rule_for(ip(addr), &[]), Some(rule), "{addr}");
        }
    }

    #[test]
    fn loopback_private_and_public_pass_unless_listed() {
        for addr in [
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "192.168.1.1",
            "100.100.100.201",
            "169.253.255.255",
            "169.255.0.0",
            "fec0::1",
            "fd00:ec3::1",
            "8.8.8.8",
        ] {
            assert_eq!(rule_for(ip(addr), &[]), None, "{addr}");
        }
        let listed = parse_cidrs(" 127.0.0.0/8 , 10.0.0.0/8,::1").unwrap();
        assert_eq!(
            rule_for(ip("127.0.0.2"), &listed),
            Some(Rule::Listed("127.0.0.0/8".parse().unwrap()))
        );
        assert_eq!(
            rule_for(ip("::ffff:10.9.9.9"), &listed),
            Some(Rule::Listed("10.0.0.0/8".parse().unwrap()))
        );
        assert_eq!(
            rule_for(ip("::1"), &listed),
            Some(Rule::Listed("::1/128".parse().unwrap()))
        );
        assert_eq!(rule_for(ip("192.168.0.1"), &listed), None);
    }

    #[test]
    fn cidr_lists_parse_strictly() {
        assert_eq!(parse_cidrs("").unwrap(), vec![]);
        assert_eq!(
            parse_cidrs("10.1.2.3/8").unwrap(),
            vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
        );
        let e = parse_cidrs("10.0.0.0/8,not-a-cidr").unwrap_err();
        assert!(e.contains("not-a-cidr"), "{e}");
        assert!(parse_cidrs("10.0.0.0/33").is_err());
    }

    #[test]
    fn literal_urls_are_checked_and_names_are_left_to_the_resolver() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        let e = check_url(&u("http://169.254.169.254/latest/meta-data"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "blocked address: 169.254.169.254 is 169.254.169.254, a cloud metadata address (always refused)"
        );
        assert!(check_url(&u("http://[fe80::1]:8080/x"), &[]).is_err());
        assert!(check_url(&u("http://[::ffff:a9fe:a9fe]/x"), &[]).is_err());
        assert!(check_url(&u("http://metadata.example/x"), &[]).is_ok());
        assert!(check_url(&u("http://127.0.0.1/x"), &[]).is_ok());
    }
}
