//! `pull oci://...` against an in-process registry that lies: oversized manifests and tokens,
//! blobs longer or shorter than declared, digests that are paths, error envelopes that read
//! like other errors, foreign layer URLs. A real `docker-registry` would never serve these.

use serde_json::{json, Value};

use crate::support::*;

pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A layer descriptor for `bytes`.
pub fn layer(media_type: &str, bytes: &[u8]) -> Value {
    json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
    })
}

pub fn manifest(layers: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": layer("application/vnd.wasm.config.v0+json", b"{}"),
        "layers": layers,
    }))
    .unwrap()
}

/// What a registry serves for `a/m:1`: the ping, the manifest, then `more` routes.
pub fn registry_routes(
    manifest: Vec<u8>,
    more: Vec<(String, Behaviour)>,
) -> Vec<(String, Behaviour)> {
    let mut routes = vec![
        ("/v2/".to_string(), Behaviour::Ok(b"{}".to_vec())),
        (
            "/v2/a/m/manifests/1".to_string(),
            Behaviour::Respond(
                200,
                vec![("content-type".into(), MANIFEST.into())],
                manifest,
            ),
        ),
    ];
    routes.extend(more);
    routes
}

pub fn serve(routes: &[(String, Behaviour)]) -> Server {
    Server::start(
        routes
            .iter()
            .map(|(p, b)| (p.as_str(), b.clone()))
            .collect(),
    )
}

pub fn blob_path(bytes: &[u8]) -> String {
    format!("/v2/a/m/blobs/sha256:{}", sha256_hex(bytes))
}

/// A ping's answer asking for a token from `realm`.
pub fn bearer_challenge(realm: &str) -> Behaviour {
    Behaviour::Respond(
        401,
        vec![(
            "www-authenticate".into(),
            format!("Bearer realm=\"{realm}\",service=\"s\""),
        )],
        vec![],
    )
}

fn image_url(server: &Server) -> String {
    format!("oci://{}/a/m:1", server.host())
}

/// Pulls `a/m:1` from `server` into a fresh cache and asserts it fails with `words`.
fn pull_fails(server: &Server, words: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let url = image_url(server);
    let o = pull(dir.path(), &[&url]);
    assert_failed(&o, dir.path(), &url, words);
    o
}

#[test]
fn a_manifest_over_4_mib_is_refused() {
    let big = vec![b' '; (4 << 20) + 1];
    let server = serve(&registry_routes(big, vec![]));
    pull_fails(
        &server,
        "exceeds size limit: the manifest is larger than 4194304 bytes",
    );
}

#[test]
fn a_token_response_over_1_mib_is_refused() {
    // The realm must name the server that serves it: start it first, then point at itself.
    let server = Server::start_with_self(|base| {
        vec![
            (
                "/v2/".to_string(),
                bearer_challenge(&format!("{base}/token")),
            ),
            (
                "/token".to_string(),
                Behaviour::Ok(vec![b'x'; (1 << 20) + 1]),
            ),
        ]
    });
    pull_fails(
        &server,
        "exceeds size limit: the token response is larger than 1048576 bytes",
    );
}

#[test]
fn a_blob_longer_than_declared_is_too_long_and_a_shorter_one_truncated() {
    let m = module("declared");
    let mut longer = m.clone();
    longer.extend_from_slice(b"0123456789");
    for (served, words) in [
        (longer, "too long: the server sent more than"),
        (m[..m.len() - 4].to_vec(), "truncated download"),
    ] {
        let routes = registry_routes(
            manifest(vec![layer("application/wasm", &m)]),
            vec![(blob_path(&m), Behaviour::Ok(served))],
        );
        let server = serve(&routes);
        pull_fails(&server, words);
    }
}

#[test]
fn digests_from_a_manifest_or_index_are_checked_before_they_reach_a_url() {
    let bad_layer =
        json!({"mediaType": "application/wasm", "digest": "sha256:../../../v2/x", "size": 10});
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": MANIFEST, "digest": "sha256:../manifests/evil", "size": 10,
                       "platform": {"os": "wasip1", "architecture": "wasm"}}],
    }))
    .unwrap();
    for doc in [manifest(vec![bad_layer]), index] {
        let server = serve(&registry_routes(doc, vec![]));
        pull_fails(&server, "invalid digest");
        let asked: Vec<String> = server.seen().into_iter().map(|s| s.target).collect();
        assert!(
            asked
                .iter()
                .all(|t| !t.contains("..") && !t.contains("evil")),
            "a digest from the manifest reached a URL: {asked:?}"
        );
    }
}

#[test]
fn registry_errors_are_classified_by_their_code_not_their_words() {
    // NAME_INVALID whose message says "Unknown": a registry error, not "not found"; DENIED with
    // status 400 is a refusal of access whatever its message says.
    for (envelope, words) in [
        (
            r#"{"errors":[{"code":"NAME_INVALID","message":"Unknown repository name format"}]}"#,
            "registry error: ",
        ),
        (
            r#"{"errors":[{"code":"DENIED","message":"manifest unknown"}]}"#,
            "unauthorized",
        ),
    ] {
        let server = serve(&[
            ("/v2/".to_string(), Behaviour::Ok(b"{}".to_vec())),
            (
                "/v2/a/m/manifests/1".to_string(),
                Behaviour::Respond(400, vec![], envelope.as_bytes().to_vec()),
            ),
        ]);
        let o = pull_fails(&server, words);
        assert!(!stderr(&o).contains("not found"), "{}", stderr(&o));
    }
}

#[test]
fn foreign_layer_urls_are_ignored_unless_allowed_and_then_guarded() {
    let m = module("foreign");
    let elsewhere = Server::start(vec![("/layer", Behaviour::Ok(m.clone()))]);
    let blocked = Server::start_on("127.0.0.2", vec![("/layer", Behaviour::Ok(m.clone()))]);
    let with_urls = |url: String| {
        let mut l = layer("application/wasm", &m);
        l["urls"] = json!([url]);
        manifest(vec![l])
    };
    // The registry does not have the blob: only the foreign URL does.
    let server = serve(&registry_routes(with_urls(elsewhere.url("/layer")), vec![]));
    let url = image_url(&server);
    let dir = tempfile::tempdir().unwrap();
    assert_failed(&pull(dir.path(), &[&url]), dir.path(), &url, "not found");
    assert_eq!(
        elsewhere.connections(),
        0,
        "a foreign URL was used by default"
    );
    let o = pull(dir.path(), &[&url, "--allow-foreign-layers"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
    assert_eq!(elsewhere.hits("/layer"), 1);
    // Allowed, a foreign URL still passes the guard.
    let server = serve(&registry_routes(with_urls(blocked.url("/layer")), vec![]));
    let url = image_url(&server);
    let other = tempfile::tempdir().unwrap();
    let o = fetcher()
        .env("BLOCKED_CIDRS_IN_WASM_FETCH", "127.0.0.2/32")
        .args(["pull", &url, "--allow-foreign-layers", "--cache-dir"])
        .arg(other.path())
        .output()
        .unwrap();
    assert_failed(&o, other.path(), &url, "blocked address");
    assert_eq!(blocked.connections(), 0);
}

#[test]
fn an_ipv6_registry_literal_works_and_a_bad_port_is_a_usage_error() {
    let m = module("v6");
    let routes = registry_routes(
        manifest(vec![layer("application/wasm", &m)]),
        vec![(blob_path(&m), Behaviour::Ok(m.clone()))],
    );
    let server = Server::start_on(
        "::1",
        routes
            .iter()
            .map(|(p, b)| (p.as_str(), b.clone()))
            .collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    let o = pull(dir.path(), &[&image_url(&server)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
    for (url, words) in [
        ("oci://127.0.0.1:99999/a/m:1", "invalid port"),
        ("http://127.0.0.1:99999/m.wasm", "invalid port"),
        ("https://[::1/m.wasm", "invalid IPv6"),
        ("oci://[::1/a/m:1", "invalid registry"),
        ("oci://user:hunter2@127.0.0.1:5000/a/m:1", "credentials"),
        ("oci://127.0.0.1:5000/a/../m:1", "'..'"),
        ("oci://127.0.0.1:5000/a//m:1", "path segments"),
    ] {
        let o = pull(dir.path(), &[url]);
        assert_eq!(o.status.code(), Some(2), "{url}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("invalid URL") && err.contains(words),
            "{url}: {err}"
        );
        assert!(!err.contains("hunter2"), "the password was printed: {err}");
    }
}

#[test]
fn a_token_realm_error_is_quoted_short_and_on_one_line() {
    let padding = "a".repeat(20_000);
    let server = Server::start_with_self(|base| {
        vec![
            (
                "/v2/".to_string(),
                bearer_challenge(&format!("{base}/token?pad={padding}")),
            ),
            (
                "/token".to_string(),
                Behaviour::Respond(
                    500,
                    vec![],
                    format!("first line\nsecond line\n{padding}").into_bytes(),
                ),
            ),
        ]
    });
    let o = pull_fails(&server, "answered HTTP 500: first line second line");
    let err = stderr(&o);
    assert!(err.len() < 1000, "{} bytes: {err}", err.len());
}

/// A plain-http token realm on a host that is neither loopback nor listed would be sent the
/// registry's Basic credentials in clear: refused before anything is asked of it, though the
/// registry itself is on loopback and spoken to in plain HTTP.
#[test]
fn a_plain_http_realm_on_an_unlisted_host_gets_no_credentials() {
    let server = serve(&[(
        "/v2/".to_string(),
        bearer_challenge("http://realm.invalid/token"),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let secret = docker_config(dir.path(), server.host());
    let cache = dir.path().join("cache");
    let url = image_url(&server);
    let o = pull(&cache, &[&url, "--pull-secret", secret.to_str().unwrap()]);
    assert_failed(
        &o,
        &cache,
        &url,
        "unsafe bearer realm \"http://realm.invalid/token\"",
    );
    assert!(
        stderr(&o).contains("must be on loopback or a host listed in WASM_INSECURE_REGISTRIES"),
        "{}",
        stderr(&o)
    );
}

/// A registry that lies about referrers: every bound is checked before the bytes are read,
/// and each refusal has its own words, with nothing cached.
#[test]
fn referrer_listings_and_bundles_past_their_bounds_are_refused_before_they_are_read() {
    use crate::attach::{BUNDLE, EMPTY, INDEX};
    use crate::signature::key_pair;
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = key_pair(dir.path(), "k");
    let module_bytes = module("hostile-referrers");
    let image = manifest(vec![layer("application/wasm", &module_bytes)]);
    let digest = format!("sha256:{}", sha256_hex(&image));
    let referrers = format!("/v2/a/m/referrers/{digest}");
    let pull_fails = |routes: Vec<(String, Behaviour)>, words: &str| {
        let server = serve(&registry_routes(image.clone(), routes));
        let url = format!("oci://{}/a/m:1", server.host());
        let cache = tempfile::tempdir().unwrap();
        let o = pull(
            cache.path(),
            &[&url, "--verify-key", public.to_str().unwrap()],
        );
        assert_failed(&o, cache.path(), &url, words);
        server
    };

    // A listing over 1 MiB.
    let huge = vec![b' '; (1 << 20) + 1];
    pull_fails(
        vec![(referrers.clone(), Behaviour::Ok(huge))],
        "referrers listing is 1048577 bytes, over the limit of 1048576",
    );

    // A referrer whose bundle declares 300 KiB: refused from the descriptor, never fetched.
    let bundle_path = format!("/v2/a/m/blobs/sha256:{}", "ab".repeat(32));
    let referrer = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": MANIFEST, "artifactType": BUNDLE,
        "config": {"mediaType": EMPTY, "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{"mediaType": BUNDLE, "digest": format!("sha256:{}", "ab".repeat(32)), "size": 300 << 10}],
        "subject": {"mediaType": MANIFEST, "digest": digest, "size": image.len()},
    }))
    .unwrap();
    let referrer_digest = format!("sha256:{}", sha256_hex(&referrer));
    let listing = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": INDEX,
        "manifests": [{"mediaType": MANIFEST, "artifactType": BUNDLE, "digest": referrer_digest, "size": referrer.len()}],
    }))
    .unwrap();
    let server = pull_fails(
        vec![
            (referrers.clone(), Behaviour::Ok(listing.clone())),
            (
                format!("/v2/a/m/manifests/{referrer_digest}"),
                Behaviour::Ok(referrer.clone()),
            ),
            (bundle_path.clone(), Behaviour::Ok(vec![b'{'; 300 << 10])),
        ],
        "the bundle is 307200 bytes, over the limit of 262144",
    );
    assert_eq!(server.hits(&bundle_path), 0, "the bundle was not read");

    // A listed referrer whose manifest is not what the listing's digest names.
    pull_fails(
        vec![
            (referrers, Behaviour::Ok(listing)),
            (
                format!("/v2/a/m/manifests/{referrer_digest}"),
                Behaviour::Ok(b"{\"schemaVersion\":2}".to_vec()),
            ),
        ],
        "signature malformed",
    );
}
