//! An image reference as an `oci://` URL writes it (`oci://host[:port]/repo[:tag][@sha256:hex]`),
//! checked against the distribution spec's grammar before any request is made; its tag and
//! digest feed the pull policy and pinning.

use crate::digest::Sha256;
use crate::error::FetchError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciRef {
    /// `host[:port]`.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Sha256>,
}

impl OciRef {
    /// The reference oci-client takes: `registry/repository[:tag][@sha256:…]`, tag defaulting
    /// to `latest` when there is neither tag nor digest (as every registry client does).
    pub fn to_reference(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                format!("sha256:{}", d.hex()),
            ),
            (Some(t), None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                t.clone(),
            ),
            (None, None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                "latest".into(),
            ),
        }
    }

    /// A tag that may move: `latest`, or no tag and no digest.
    pub fn is_latest(&self) -> bool {
        self.digest.is_none() && self.tag.as_deref().is_none_or(|t| t == "latest")
    }

    /// Loopback registries may fall back to plain HTTP, as go-containerregistry (Istio) allows.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.registry)
    }
}

/// Whether `host[:port]` names this machine (`localhost` or a loopback address).
pub fn is_loopback_host(host_port: &str) -> bool {
    let host = host_port
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host_port, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The reference after `oci://`: `host[:port]/repo[:tag][@sha256:hex]`.
pub(crate) fn parse(rest: &str) -> Result<OciRef, FetchError> {
    // A query or fragment is no part of a reference, and a token often rides there: never
    // quoted (nor is userinfo, refused below without repeating it).
    let shown = match rest.find(['?', '#']) {
        Some(at) => format!("{}?***", crate::shown::shown(&rest[..at])),
        None => crate::shown::shown(rest),
    };
    let bad = |reason: &str| FetchError::BadUrl {
        reason: format!("oci://{shown}: {reason}"),
    };
    // An `@` before the first `/` is userinfo, not a digest.
    if let Some(at) = rest.find('@') {
        if rest.find('/').is_none_or(|slash| at < slash) {
            // Not repeated in the message: they are secret.
            return Err(FetchError::BadUrl {
                reason: "credentials in an oci:// URL are refused (they would end up in logs and the cache index); pass them with --pull-secret".into(),
            });
        }
    }
    let (name, digest) = match rest.split_once('@') {
        Some((n, d)) => {
            let hex = d
                .strip_prefix("sha256:")
                .ok_or_else(|| bad("only sha256 digests are supported"))?;
            (n, Some(Sha256::parse(hex).map_err(|e| bad(&e))?))
        }
        None => (rest, None),
    };
    let (registry, path) = name
        .split_once('/')
        .ok_or_else(|| bad("expected oci://registry/repository[:tag]"))?;
    if registry.is_empty() || path.is_empty() {
        return Err(bad("expected oci://registry/repository[:tag]"));
    }
    check_registry(registry).map_err(|reason| bad(&reason))?;
    let (repository, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
        _ => (path, None),
    };
    if repository.is_empty()
        || !repository
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c))
    {
        return Err(bad(
            "the repository must be lower-case letters, digits, '.', '_', '-' and '/'",
        ));
    }
    // Each path component starts and ends with a letter or digit (the distribution spec's
    // grammar): no empty, `.` or `..` segment can reach a registry URL.
    let component_ok = |c: &str| {
        let alnum = |ch: Option<char>| ch.is_some_and(|ch| ch.is_ascii_alphanumeric());
        alnum(c.chars().next()) && alnum(c.chars().last())
    };
    if !repository.split('/').all(component_ok) {
        return Err(bad(
            "empty, '.' and '..' path segments are not allowed; each segment starts and ends with a letter or digit",
        ));
    }
    if let Some(t) = &tag {
        if t.is_empty()
            || t.len() > 128
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad("invalid tag"));
        }
    }
    Ok(OciRef {
        registry: registry.to_string(),
        repository: repository.to_string(),
        tag,
        digest,
    })
}

/// `host[:port]` as a URL authority: a valid port, a bracketed IPv6 literal, nothing else.
fn check_registry(registry: &str) -> Result<(), String> {
    let parsed = url::Url::parse(&format!("https://{registry}/"))
        .map_err(|e| format!("invalid registry {registry:?}: {e}"))?;
    let plain = parsed.path() == "/"
        && parsed.query().is_none()
        && parsed.fragment().is_none()
        && parsed.username().is_empty()
        && parsed.host_str().is_some_and(|h| !h.is_empty());
    if !plain {
        return Err(format!(
            "invalid registry {registry:?}: expected host[:port]"
        ));
    }
    // A name is dot-separated labels of letters, digits and inner hyphens (the distribution
    // reference grammar's domain components): `..` or `a..b` would name a directory, not a
    // host, wherever the registry becomes a path (hosts.toml, the cache, the credentials).
    if let Some(url::Host::Domain(name)) = parsed.host() {
        let label = |l: &str| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        if !name.split('.').all(label) {
            return Err(format!(
                "invalid registry {registry:?}: a host name is dot-separated labels of letters, \
                 digits and inner hyphens"
            ));
        }
    }
    Ok(())
}
