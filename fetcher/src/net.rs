//! The one HTTP client setup every request of the fetcher goes through (HTTP sources,
//! registries, token realms, foreign layers): the address guard on DNS answers and redirects,
//! the trusted roots, and the timeouts; and bounded reads of the small bodies (manifests,
//! tokens, error messages) that are read into memory.

use std::time::Duration;

use crate::error::FetchError;
use crate::guard;
use crate::settings::Settings;

/// How long one request may take.
#[derive(Debug, Clone, Copy)]
pub enum Deadline {
    /// The whole request, body included (an HTTP source: `WASM_HTTP_REQUEST_TIMEOUT` per attempt).
    Total(Duration),
    /// Connecting, and each read: a large blob may take long, but never stalls longer.
    PerRead(Duration),
}

/// The proxy variables reqwest reads from the environment.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// A proxy named by an address the guard refuses. A proxy's host name goes through the
/// resolver like any other; an address literal would be dialled without it.
pub fn blocked_proxy(
    var: impl Fn(&str) -> Option<String>,
    listed: &[ipnet::IpNet],
) -> Result<(), guard::Refusal> {
    for name in PROXY_VARS {
        let Some(value) = var(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let value = value.trim();
        let with_scheme = if value.contains("://") {
            value.to_string()
        } else {
            format!("http://{value}")
        };
        if let Ok(url) = url::Url::parse(&with_scheme) {
            guard::check_url(&url, listed)?;
        }
    }
    Ok(())
}

/// A client with the guard, `--ca-file` roots and, when `insecure`, no certificate checks.
pub fn client(
    settings: &Settings,
    insecure: bool,
    deadline: Deadline,
) -> Result<reqwest::Client, FetchError> {
    build(
        settings,
        insecure,
        deadline,
        guard::redirect_policy(&settings.blocked_cidrs, guard::PlainHttp::Anywhere),
    )
}

/// [`client`] for a registry (its API, token realm and foreign layers): a redirect goes on in
/// plain HTTP only to the host already spoken to, or to one a registry may be reached at in
/// plain HTTP (loopback, `WASM_INSECURE_REGISTRIES`).
pub fn registry_client(
    settings: &Settings,
    insecure: bool,
    deadline: Deadline,
) -> Result<reqwest::Client, FetchError> {
    let plain = guard::PlainHttp::Registries(settings.insecure_registries.clone().into());
    build(
        settings,
        insecure,
        deadline,
        guard::redirect_policy(&settings.blocked_cidrs, plain),
    )
}

/// [`client`] that follows no redirect: an upload's answer is taken as it comes, so a
/// redirect is refused the same way for every upload request (`crate::push`), whether or not
/// its body could be sent again.
pub fn upload_client(
    settings: &Settings,
    insecure: bool,
    deadline: Deadline,
) -> Result<reqwest::Client, FetchError> {
    build(
        settings,
        insecure,
        deadline,
        reqwest::redirect::Policy::none(),
    )
}

fn build(
    settings: &Settings,
    insecure: bool,
    deadline: Deadline,
    redirects: reqwest::redirect::Policy,
) -> Result<reqwest::Client, FetchError> {
    ensure_provider();
    blocked_proxy(|name| std::env::var(name).ok(), &settings.blocked_cidrs)?;
    let dns_deadline = match deadline {
        Deadline::Total(d) | Deadline::PerRead(d) => d,
    };
    let mut builder = reqwest::Client::builder()
        .dns_resolver(guard::GuardedResolver::new(
            &settings.blocked_cidrs,
            dns_deadline,
        ))
        .redirect(redirects)
        .tls_danger_accept_invalid_certs(insecure);
    builder = match deadline {
        Deadline::Total(d) => builder.timeout(d),
        Deadline::PerRead(d) => builder.connect_timeout(d).read_timeout(d),
    };
    for ca in &settings.extra_roots {
        for cert in
            reqwest::Certificate::from_pem_bundle(&ca.data).map_err(|e| FetchError::Network {
                attempts: 0,
                message: format!("--ca-file is not PEM: {e}"),
            })?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some(pem) = &settings.client_identity {
        let identity = reqwest::Identity::from_pem(pem).map_err(|e| FetchError::Network {
            attempts: 0,
            message: format!("the client certificate is not a PEM certificate and key: {e}"),
        })?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| FetchError::Network {
        attempts: 0,
        message: format!("cannot build HTTP client: {e}"),
    })
}

/// What a refused address, redirect or send error becomes, when the guard is why.
pub fn refused(e: &reqwest::Error) -> Option<FetchError> {
    guard::refusal_in(e).map(FetchError::from)
}

/// A response that is a redirect reqwest did not follow: it had no `Location`, or one that is
/// not an `http`/`https` URL (`file:`, ...), which is never followed.
pub fn unfollowed_redirect(resp: &reqwest::Response) -> Option<FetchError> {
    let status = resp.status();
    if !status.is_redirection() {
        return None;
    }
    Some(match resp.headers().get(reqwest::header::LOCATION) {
        Some(to) => guard::Refusal::RedirectScheme {
            to: crate::shown::shown(&String::from_utf8_lossy(to.as_bytes())),
        }
        .into(),
        None => FetchError::RedirectWithoutLocation {
            from: crate::shown::shown(resp.url().as_str()),
            status: status.as_u16(),
        },
    })
}

/// Reads a body of at most `limit` bytes: a declared length above it is refused before any
/// read, and a body that grows past it stops at the limit.
pub async fn read_limited(
    mut resp: reqwest::Response,
    limit: usize,
    what: &'static str,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::ResponseTooLarge { what, limit };
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(|e| read_error(e, what))? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The start of an error body, as far as a message needs: a registry's error envelope or a
/// line of text. Whatever is beyond is not read.
pub async fn error_text(mut resp: reqwest::Response) -> Vec<u8> {
    const ENOUGH: usize = 16 * 1024;
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = ENOUGH - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == ENOUGH {
            break;
        }
    }
    body
}

fn read_error(e: reqwest::Error, what: &str) -> FetchError {
    FetchError::Network {
        attempts: 1,
        message: format!("reading the {what}: {}", crate::error::chain(&e)),
    }
}

/// The TLS crypto provider (ring), installed once before any HTTP client is built: reqwest and
/// oci-client are built without a provider of their own (see the workspace Cargo.toml for why).
/// Idempotent; a provider the embedding program installed first is kept.
pub fn ensure_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_at_a_blocked_literal_is_refused() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let listed = crate::guard::parse_cidrs("10.0.0.0/8").unwrap();
        assert!(blocked_proxy(env(&[]), &listed).is_ok());
        assert!(blocked_proxy(env(&[("HTTP_PROXY", "http://proxy.corp:3128")]), &listed).is_ok());
        assert!(blocked_proxy(env(&[("https_proxy", "192.168.1.1:3128")]), &listed).is_ok());
        for (name, value) in [
            ("HTTP_PROXY", "http://169.254.169.254:80"),
            ("https_proxy", "10.1.2.3:3128"),
            ("ALL_PROXY", "socks5://[fe80::1]:1080"),
        ] {
            let vars: &'static [(&str, &str)] = Box::leak(Box::new([(name, value)]));
            let e = blocked_proxy(env(vars), &listed).unwrap_err();
            assert!(
                e.to_string().starts_with("blocked address"),
                "{name}={value}: {e}"
            );
        }
    }
}
