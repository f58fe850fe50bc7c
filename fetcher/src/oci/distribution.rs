//! The pull half of the OCI distribution API, spoken through the guarded client of
//! `crate::net`: one `GET /v2/` ping that settles the protocol and the authentication, then
//! manifests (read whole, at most 4 MiB) and blobs (streamed).
//!
//! oci-client's `Client` builds its reqwest client privately: no DNS resolver, redirect policy
//! or body limit can be set on it, and it fetches token realms and follows blob redirects on
//! its own. So the requests are made here; oci-client still provides the manifest types and
//! the error envelope (`OciErrorCode`) the answers are classified by.
//!
//! Credentials go to the registry host they were configured for (reqwest drops them on a
//! redirect to another host) and, for a bearer challenge, to a token realm that passed
//! [`check_realm`] and the address guard.

use oci_client::errors::{OciEnvelope, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use serde_json::Value;

use crate::digest::Digest;
use crate::error::FetchError;
use crate::net;
use crate::settings::Settings;
use crate::shown::shown;

/// Manifests and indexes are small JSON documents; anything larger is not one.
pub const MANIFEST_LIMIT: usize = 4 << 20;
/// A token response is a few kilobytes.
pub const TOKEN_LIMIT: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One registry, one repository, one protocol, and what its ping said to send.
pub struct Distribution {
    http: reqwest::Client,
    /// For a push: the client upload requests go through, which follows no redirect.
    uploads: Option<reqwest::Client>,
    settings: Settings,
    registry: String,
    repository: String,
    scheme: Scheme,
    /// The API root on the host: `/v2`, or a mirror's path (`super::hosts`).
    root: String,
    /// For a mirror: the upstream registry it is asked on behalf of, sent as `?ns=` on every
    /// request as containerd sends it (one mirror endpoint can serve many registries).
    namespace: Option<String>,
    /// Unverified TLS or plain HTTP is allowed (`WASM_INSECURE_REGISTRIES`).
    insecure: bool,
    credentials: RegistryAuth,
    authorization: Option<HeaderValue>,
    access: Access,
}

/// What a token is asked for: a pull reads, a push (`crate::push`) also writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    #[default]
    Pull,
    Push,
}

impl Access {
    fn scope_actions(self) -> &'static str {
        match self {
            Access::Pull => "pull",
            Access::Push => "pull,push",
        }
    }
}

/// Why a ping failed: the transport error is kept so the caller can try the other protocol.
pub enum PingFailure {
    Send(reqwest::Error),
    /// The server answered HTTP 400: a TLS server reached in plain HTTP says so.
    BadRequest,
    Other(FetchError),
}

impl Distribution {
    /// `access`: what a token realm is asked for (set before the ping, which fetches the
    /// token); a push also gets the client for its uploads.
    pub fn new(
        registry: &str,
        repository: &str,
        scheme: Scheme,
        insecure: bool,
        credentials: RegistryAuth,
        settings: &Settings,
        access: Access,
    ) -> Result<Self, FetchError> {
        let deadline = net::Deadline::PerRead(settings.http_timeout);
        let uploads = match access {
            Access::Pull => None,
            Access::Push => Some(net::upload_client(settings, insecure, deadline)?),
        };
        Ok(Self {
            http: net::registry_client(settings, insecure, deadline)?,
            uploads,
            settings: settings.clone(),
            registry: registry.to_string(),
            repository: repository.to_string(),
            scheme,
            root: "/v2".into(),
            namespace: None,
            insecure,
            credentials,
            authorization: None,
            access,
        })
    }

    /// Requests go below `root` (a mirror's API root) instead of `/v2`.
    pub(crate) fn at_root(mut self, root: &str) -> Self {
        self.root = root.to_string();
        self
    }

    /// Every request carries `?ns=<upstream>`: this host is a mirror of `upstream` (given as
    /// a query value already, as the mirrors' module writes it).
    pub(crate) fn for_upstream(mut self, upstream: &str) -> Self {
        self.namespace = Some(upstream.to_string());
        self
    }

    pub fn registry(&self) -> &str {
        &self.registry
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// A request to `/v2/<rest>` on this registry, with the authorization its ping settled.
    pub(crate) fn request(&self, method: reqwest::Method, rest: &str) -> reqwest::RequestBuilder {
        self.request_to(method, &self.url(rest))
    }

    /// An upload request of a push (the `POST` that opens an upload, the `PUT` of a blob or
    /// the manifest) to `location`: a `/v2/…` path or a URL the registry named (an upload
    /// `Location`), resolved against the registry and checked by the address guard. The
    /// authorization goes only to the registry's own scheme, host and port, and no redirect
    /// is followed: the caller refuses one.
    pub(crate) fn upload(
        &self,
        method: reqwest::Method,
        location: &str,
    ) -> Result<reqwest::RequestBuilder, FetchError> {
        let client = self.uploads.as_ref().unwrap_or(&self.http);
        let base = url::Url::parse(&self.url("")).map_err(|e| FetchError::Registry {
            message: format!("registry URL: {e}"),
        })?;
        let shown: String = location.chars().take(200).collect();
        let target = base.join(location).map_err(|e| FetchError::Registry {
            message: format!(
                "{} answered an unusable Location {shown:?}: {e}",
                self.registry
            ),
        })?;
        if !matches!(target.scheme(), "http" | "https") {
            return Err(crate::guard::Refusal::RedirectScheme { to: shown }.into());
        }
        crate::guard::check_url(&target, &self.settings.blocked_cidrs)?;
        let same_origin = target.origin() == base.origin();
        let mut req = client.request(method, target);
        if same_origin {
            if let Some(auth) = &self.authorization {
                req = req.header(AUTHORIZATION, auth.clone());
            }
        }
        Ok(req)
    }

    fn request_to(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, url);
        if let Some(auth) = &self.authorization {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        req
    }

    fn url(&self, rest: &str) -> String {
        let url = format!(
            "{}://{}{}/{rest}",
            self.scheme.as_str(),
            self.registry,
            self.root
        );
        match &self.namespace {
            Some(ns) => format!("{url}?ns={ns}"),
            None => url,
        }
    }

    /// `GET /v2/`: any answer proves the protocol; a 401 names the authentication to use.
    pub async fn ping(&mut self) -> Result<(), PingFailure> {
        let url = self.url("");
        // Every request of this registry goes to this host: a literal address is checked once,
        // here, before anything is sent (names are checked as they resolve).
        if let Ok(parsed) = url::Url::parse(&url) {
            crate::guard::check_url(&parsed, &self.settings.blocked_cidrs)
                .map_err(|r| PingFailure::Other(r.into()))?;
        }
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| match net::refused(&e) {
                Some(refused) => PingFailure::Other(refused),
                None => PingFailure::Send(e),
            })?;
        if let Some(e) = net::unfollowed_redirect(&resp) {
            return Err(PingFailure::Other(e));
        }
        match resp.status().as_u16() {
            400 => Err(PingFailure::BadRequest),
            401 => {
                // A ping redirected to another origin brings back that origin's challenge: its
                // realm is not one the registry named, and gets no credentials.
                let from_registry = url::Url::parse(&url).is_ok_and(|asked| {
                    let got = resp.url();
                    (got.scheme(), got.host_str(), got.port_or_known_default())
                        == (
                            asked.scheme(),
                            asked.host_str(),
                            asked.port_or_known_default(),
                        )
                });
                let challenges: Vec<String> = resp
                    .headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(str::to_string))
                    .collect();
                self.authorization = self
                    .answer(&challenges, from_registry)
                    .await
                    .map_err(PingFailure::Other)?;
                Ok(())
            }
            // Authentication is not needed, or not announced here: a token from the pull
            // secret is still presented.
            _ => {
                if let RegistryAuth::Bearer(t) = &self.credentials {
                    self.authorization = header(&format!("Bearer {t}"));
                }
                Ok(())
            }
        }
    }

    /// The `Authorization` to send after a challenge; `from_registry`: the registry itself
    /// issued it, so its token realm may be sent the registry's credentials.
    async fn answer(
        &self,
        challenges: &[String],
        from_registry: bool,
    ) -> Result<Option<HeaderValue>, FetchError> {
        if let RegistryAuth::Bearer(t) = &self.credentials {
            return Ok(header(&format!("Bearer {t}")));
        }
        let parsed = challenges.iter().flat_map(|c| {
            http_auth::ChallengeParser::new(c)
                .filter_map(Result::ok)
                .map(|c| {
                    let param = |name: &str| {
                        c.params
                            .iter()
                            .find(|(k, _)| k.eq_ignore_ascii_case(name))
                            .map(|(_, v)| v.to_unescaped())
                    };
                    (
                        c.scheme.to_ascii_lowercase(),
                        param("realm"),
                        param("service"),
                    )
                })
                .collect::<Vec<_>>()
        });
        let mut basic = false;
        for (scheme, realm, service) in parsed {
            match (scheme.as_str(), realm) {
                ("bearer", Some(realm)) => {
                    let token = self
                        .token(&realm, service.as_deref(), from_registry)
                        .await?;
                    return Ok(header(&format!("Bearer {token}")));
                }
                ("basic", _) => basic = true,
                _ => {}
            }
        }
        match (&self.credentials, basic) {
            (RegistryAuth::Basic(u, p), true) => Ok(header(&format!(
                "Basic {}",
                base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    format!("{u}:{p}")
                )
            ))),
            _ => Err(self.unauthorized()),
        }
    }

    /// A pull token from the realm a bearer challenge named, asked with the registry's
    /// credentials when `with_credentials`, anonymously otherwise.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        with_credentials: bool,
    ) -> Result<String, FetchError> {
        let realm_url = check_realm(
            realm,
            self.scheme == Scheme::Http || self.insecure,
            &self.settings,
        )?;
        let scope = format!(
            "repository:{}:{}",
            self.repository,
            self.access.scope_actions()
        );
        let mut query = vec![("scope", scope.as_str())];
        if let Some(s) = service {
            query.push(("service", s));
        }
        let mut req = self.http.get(realm_url.clone()).query(&query);
        match &self.credentials {
            RegistryAuth::Basic(u, p) if with_credentials => req = req.basic_auth(u, Some(p)),
            _ => {}
        }
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        if let Some(e) = net::unfollowed_redirect(&resp) {
            return Err(e);
        }
        match resp.status().as_u16() {
            200 => {}
            401 | 403 => return Err(self.unauthorized()),
            status => {
                let text = net::error_text(resp).await;
                return Err(FetchError::Registry {
                    message: format!(
                        "token realm {} answered HTTP {status}: {}",
                        shown(realm_url.as_str()),
                        shown(String::from_utf8_lossy(&text).trim())
                    ),
                });
            }
        }
        let body = net::read_limited(resp, TOKEN_LIMIT, "token response").await?;
        let doc: Value = serde_json::from_slice(&body).map_err(|e| FetchError::Registry {
            message: format!(
                "token realm {} answered something not JSON: {e}",
                shown(realm_url.as_str())
            ),
        })?;
        ["token", "access_token"]
            .iter()
            .find_map(|k| doc.get(k).and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| FetchError::Registry {
                message: format!(
                    "token realm {} answered no token",
                    shown(realm_url.as_str())
                ),
            })
    }

    async fn get(&self, rest: &str, accept: Option<&str>) -> Result<reqwest::Response, FetchError> {
        let url = self.url(rest);
        let mut req = self.request_to(reqwest::Method::GET, &url);
        if let Some(a) = accept {
            req = req.header(ACCEPT, a);
        }
        let resp = req.send().await.map_err(|e| self.send_error(e))?;
        if let Some(e) = net::unfollowed_redirect(&resp) {
            return Err(e);
        }
        if !resp.status().is_success() {
            return Err(self.status_error(resp, &url).await);
        }
        Ok(resp)
    }

    /// A manifest or index by tag or digest: its bytes and their digest. A digest reference is
    /// checked against the bytes, whatever the registry claims.
    pub async fn manifest(
        &self,
        reference: &str,
        accept: &str,
    ) -> Result<(Vec<u8>, Digest), FetchError> {
        let resp = self
            .get(
                &format!("{}/manifests/{reference}", self.repository),
                Some(accept),
            )
            .await?;
        let bytes = net::read_limited(resp, MANIFEST_LIMIT, "manifest").await?;
        let digest = Digest(crate::digest::Sha256::of(&bytes));
        if reference.starts_with("sha256:") && reference != digest.to_string() {
            return Err(FetchError::ChecksumMismatch {
                expected: reference.to_string(),
                actual: digest.to_string(),
            });
        }
        Ok((bytes, digest))
    }

    /// A blob, to stream.
    pub async fn blob(&self, digest: &Digest) -> Result<reqwest::Response, FetchError> {
        self.get(&format!("{}/blobs/{digest}", self.repository), None)
            .await
    }

    /// A foreign layer from a URL its descriptor lists: no credentials, the same guard.
    pub async fn foreign(&self, url: &str) -> Result<reqwest::Response, FetchError> {
        // The manifest's word, not the user's: a bad URL here is the registry's error.
        let shown = shown(url);
        let parsed = url::Url::parse(url).map_err(|e| FetchError::Registry {
            message: format!("foreign layer URL {shown:?}: {e}"),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(FetchError::Registry {
                message: format!("foreign layer URL {shown:?}: only http and https are fetched"),
            });
        }
        crate::guard::check_url(&parsed, &self.settings.blocked_cidrs)?;
        let resp = self
            .http
            .get(parsed)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        if let Some(e) = net::unfollowed_redirect(&resp) {
            return Err(e);
        }
        if !resp.status().is_success() {
            return Err(FetchError::HttpStatus {
                status: resp.status().as_u16(),
                reason: format!("from foreign layer URL {shown}"),
            });
        }
        Ok(resp)
    }

    fn unauthorized(&self) -> FetchError {
        FetchError::Unauthorized {
            registry: self.registry.clone(),
        }
    }

    pub fn send_error(&self, e: reqwest::Error) -> FetchError {
        send_error(&self.registry, self.settings.http_timeout, e)
    }

    /// A registry's refusal, classified by its status and error codes.
    pub(crate) async fn status_error(&self, resp: reqwest::Response, url: &str) -> FetchError {
        let status = resp.status().as_u16();
        let text = net::error_text(resp).await;
        let envelope = serde_json::from_slice::<OciEnvelope>(&text).ok();
        let codes: Vec<&OciErrorCode> = envelope
            .iter()
            .flat_map(|e| e.errors.iter().map(|e| &e.code))
            .collect();
        let any = |wanted: &[OciErrorCode]| codes.iter().any(|c| wanted.contains(c));
        if matches!(status, 401 | 403) || any(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]) {
            return self.unauthorized();
        }
        if status == 404
            || any(&[
                OciErrorCode::ManifestUnknown,
                OciErrorCode::BlobUnknown,
                OciErrorCode::NameUnknown,
                OciErrorCode::NotFound,
            ])
        {
            return FetchError::NotFound {
                what: url.to_string(),
            };
        }
        let message = match &envelope {
            Some(e) => e
                .errors
                .iter()
                .take(3)
                .map(|e| format!("{:?}: {}", e.code, shown(&e.message)))
                .collect::<Vec<_>>()
                .join("; "),
            None => shown(&String::from_utf8_lossy(&text)),
        };
        FetchError::Registry {
            message: format!("{url}: HTTP {status}: {}", message.trim()),
        }
    }
}

/// What a failed send becomes: the guard's refusal, a timeout, an untrusted certificate, or
/// the transport's own words.
pub fn send_error(
    registry: &str,
    per_attempt: std::time::Duration,
    e: reqwest::Error,
) -> FetchError {
    if let Some(refused) = net::refused(&e) {
        return refused;
    }
    if e.is_timeout() {
        return FetchError::TimedOut {
            attempts: 1,
            per_attempt,
        };
    }
    crate::error::untrusted_certificate(registry, &e).unwrap_or_else(|| FetchError::Registry {
        message: crate::error::chain(&e),
    })
}

/// A bearer challenge's realm: an absolute `https` URL, with a host, and not an address the
/// guard refuses. Plain `http` only when both hold: the registry itself is spoken to in plain
/// HTTP or is listed insecure (`registry_plain`: no downgrade from a TLS registry), and
/// [`realm_may_be_plain_http`] (the registry's credentials go to the realm, and Basic
/// credentials in clear must not leave the machine for a host nobody listed).
pub fn check_realm(
    realm: &str,
    registry_plain: bool,
    settings: &Settings,
) -> Result<url::Url, FetchError> {
    let unsafe_realm = |reason: &str| FetchError::UnsafeRealm {
        realm: shown(realm),
        reason: reason.to_string(),
    };
    let url = url::Url::parse(realm).map_err(|e| unsafe_realm(&format!("not a URL: {e}")))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(unsafe_realm("it has no host"));
    }
    match url.scheme() {
        "https" => {}
        "http" if !registry_plain => {
            return Err(unsafe_realm(
                "a token realm must be https (http only for a registry listed in WASM_INSECURE_REGISTRIES or spoken to in plain HTTP)",
            ))
        }
        "http" if realm_may_be_plain_http(&url, settings) => {}
        "http" => {
            return Err(unsafe_realm(
                "a plain-http token realm must be on loopback or a host listed in WASM_INSECURE_REGISTRIES; use https",
            ))
        }
        _ => return Err(unsafe_realm("a token realm must be https")),
    }
    crate::guard::check_url(&url, &settings.blocked_cidrs)?;
    Ok(url)
}

/// Whether a token realm may be asked over plain HTTP: its host is a loopback literal or
/// `localhost` (the credentials stay on the machine), or its `host[:port]` is listed in
/// `WASM_INSECURE_REGISTRIES` (or `*` is). A name that merely resolves to loopback is not
/// enough: what it resolves to can change between the check and the request.
pub fn realm_may_be_plain_http(url: &url::Url, settings: &Settings) -> bool {
    crate::guard::plain_http_allowed(url, &settings.insecure_registries)
}

fn header(value: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(value).ok().map(|mut v| {
        v.set_sensitive(true);
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_realms_only_for_a_plain_registry_and_on_loopback_or_listed_hosts() {
        let s = Settings {
            blocked_cidrs: crate::guard::parse_cidrs("10.0.0.0/8").unwrap(),
            insecure_registries: vec!["auth.listed:5001".into(), "[::2]".into()],
            ..Settings::default()
        };
        assert!(check_realm("https://auth.example/token", true, &s).is_ok());
        for plain in [
            "http://127.0.0.1:5000/token",
            "http://127.0.0.2/token",
            "http://localhost:8080/token",
            "http://[::1]/token",
            "http://auth.listed:5001/token",
            "http://[::2]/token",
        ] {
            assert!(check_realm(plain, true, &s).is_ok(), "{plain}");
        }
        for unlisted in [
            "http://auth.example/token",
            "http://auth.listed/token",
            "http://auth.listed:5002/token",
            "http://localhost.auth.example/token",
            "http://192.168.1.1/token",
        ] {
            let e = check_realm(unlisted, true, &s).unwrap_err();
            assert!(
                e.to_string().starts_with("unsafe bearer realm")
                    && e.to_string().contains("on loopback or a host listed"),
                "{unlisted}: {e}"
            );
        }
        // A registry spoken to over verified TLS never hands its credentials to plain http.
        let e = check_realm("http://127.0.0.1:5000/token", false, &s).unwrap_err();
        assert!(e.to_string().contains("must be https"), "{e}");
        let every = Settings {
            insecure_registries: vec!["*".into()],
            ..Settings::default()
        };
        assert!(check_realm("http://auth.example/token", true, &every).is_ok());
        for bad in ["file:///etc/passwd", "/token", "https://", "ftp://x/y"] {
            assert!(
                matches!(
                    check_realm(bad, true, &s),
                    Err(FetchError::UnsafeRealm { .. })
                ),
                "{bad}"
            );
        }
        for blocked in [
            "https://169.254.169.254/token",
            "https://[fd00:ec2::254]/token",
            "https://10.1.1.1/token",
        ] {
            let e = check_realm(blocked, true, &s).unwrap_err();
            assert!(e.to_string().starts_with("blocked address"), "{e}");
        }
    }
}
