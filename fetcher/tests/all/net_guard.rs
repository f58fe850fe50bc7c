//! The address guard end to end: no connection to a blocked address, whether named by the
//! source URL, a host name, a redirect, a proxy's target, or a registry's token realm; and no
//! credentials where they do not belong. Tests block a second loopback address (127.0.0.2) or
//! all of loopback, and count what the listeners there accepted: nothing.

use oci_client::secrets::RegistryAuth;

use crate::hostile_registry::{
    bearer_challenge, blob_path, layer, manifest, registry_routes, serve,
};
use crate::oci_registry::{Options, Registry};
use crate::support::*;

fn pull_blocking(cache: &std::path::Path, blocked: &str, args: &[&str]) -> std::process::Output {
    pull_env(cache, &[("BLOCKED_CIDRS_IN_WASM_FETCH", blocked)], args)
}

#[test]
fn a_blocked_address_is_refused_before_connecting() {
    let m = module("guarded");
    let server = Server::start_on("127.0.0.2", vec![("/m.wasm", Behaviour::Ok(m.clone()))]);
    let url = server.url("/m.wasm");
    let dir = tempfile::tempdir().unwrap();
    let o = pull_blocking(dir.path(), "10.0.0.0/8, 127.0.0.2/32", &[&url]);
    assert_failed(&o, dir.path(), &url, "blocked address");
    assert!(
        stderr(&o).contains(
            "127.0.0.2 is 127.0.0.2, in 127.0.0.2/32, listed in BLOCKED_CIDRS_IN_WASM_FETCH"
        ),
        "{}",
        stderr(&o)
    );
    // A registry at that address: not even its ping is sent.
    let image = format!("oci://{}/a/m:1", server.host());
    let o = pull_blocking(dir.path(), "127.0.0.2/32", &[&image]);
    assert_failed(&o, dir.path(), &image, "blocked address: 127.0.0.2");
    assert_eq!(server.connections(), 0, "the blocked address was dialled");
    // Not blocked, the same pull works: the refusal above was the guard's.
    let o = pull_blocking(dir.path(), "10.0.0.0/8", &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(server.connections(), 1);
}

#[test]
fn a_host_name_is_checked_once_resolved() {
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(module("named")))]);
    let url = format!(
        "http://localhost:{}/m.wasm",
        server.host().rsplit(':').next().unwrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let o = pull_blocking(dir.path(), "127.0.0.0/8,::1/128", &[&url]);
    assert_failed(&o, dir.path(), &url, "blocked address: localhost is ");
    assert_eq!(server.connections(), 0);
}

#[test]
fn a_bad_blocked_range_is_a_named_setting_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = pull_blocking(
        dir.path(),
        "127.0.0.0/8,nonsense",
        &["http://127.0.0.1:9/x.wasm"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("BLOCKED_CIDRS_IN_WASM_FETCH") && stderr(&o).contains("nonsense"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn through_a_proxy_a_blocked_literal_is_refused_before_the_proxy_is_asked() {
    let proxy = Server::start(vec![]);
    let url = "http://127.0.0.2:9/filter.wasm";
    let dir = tempfile::tempdir().unwrap();
    let o = through_proxy(&proxy.base)
        .env("BLOCKED_CIDRS_IN_WASM_FETCH", "127.0.0.2/32")
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "1")
        .args(["pull", url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), url, "blocked address");
    assert_eq!(
        proxy.connections(),
        0,
        "the proxy was asked: {:?}",
        proxy.seen()
    );
    // A proxy at a blocked address is not dialled either.
    let blocked_proxy = Server::start_on("127.0.0.2", vec![]);
    let named = "http://wasm-modules.invalid/filter.wasm";
    let o = through_proxy(&blocked_proxy.base)
        .env("BLOCKED_CIDRS_IN_WASM_FETCH", "127.0.0.2/32")
        .args(["pull", named, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), named, "blocked address: 127.0.0.2");
    assert_eq!(blocked_proxy.connections(), 0);
    // Unblocked, the request does go to the proxy (which answers 404 for it).
    let o = through_proxy(&proxy.base)
        .args(["pull", url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), url, "HTTP 404");
    assert_eq!(proxy.seen()[0].target, url);
}

#[test]
fn a_redirect_to_a_blocked_address_is_refused() {
    let m = module("redirected");
    let target = Server::start_on("127.0.0.2", vec![("/m.wasm", Behaviour::Ok(m.clone()))]);
    let hop = Server::start(vec![(
        "/r",
        Behaviour::Respond(
            302,
            vec![("location".into(), target.url("/m.wasm"))],
            vec![],
        ),
    )]);
    let url = hop.url("/r");
    let dir = tempfile::tempdir().unwrap();
    let o = pull_blocking(dir.path(), "127.0.0.2/32", &[&url]);
    assert_failed(&o, dir.path(), &url, "blocked address: 127.0.0.2");
    assert_eq!(target.connections(), 0);
    assert_eq!(hop.hits("/r"), 1, "a refused redirect is not retried");
    let o = pull_blocking(dir.path(), "10.0.0.0/8", &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
}

#[test]
fn redirects_to_file_without_location_or_from_https_to_http_are_refused() {
    let plain = Server::start(vec![
        (
            "/to-file",
            Behaviour::Respond(
                302,
                vec![("location".into(), "file:///etc/passwd".into())],
                vec![],
            ),
        ),
        ("/nowhere", Behaviour::Respond(302, vec![], vec![])),
        (
            "/loop",
            Behaviour::Respond(302, vec![("location".into(), "/loop".into())], vec![]),
        ),
        ("/m.wasm", Behaviour::Ok(module("downgraded"))),
    ]);
    let dir = tempfile::tempdir().unwrap();
    for (path, words) in [
        ("/to-file", "refused redirect to file:///etc/passwd"),
        ("/nowhere", "redirect without Location"),
        ("/loop", "more than 10 redirects"),
    ] {
        let url = plain.url(path);
        assert_failed(&pull(dir.path(), &[&url]), dir.path(), &url, words);
        let expected = if path == "/loop" { 11 } else { 1 };
        assert_eq!(plain.hits(path), expected, "{path} was retried");
    }
    let tls = TlsServer::start(&format!(
        "HTTP/1.1 302 Found\r\nlocation: {}\r\n",
        plain.url("/m.wasm")
    ));
    let url = format!("{}/m.wasm", tls.base);
    let o = pull(dir.path(), &[&url, "--ca-file", tls.ca.to_str().unwrap()]);
    assert_failed(&o, dir.path(), &url, "insecure redirect");
    assert_eq!(plain.hits("/m.wasm"), 0, "the downgraded URL was fetched");
}

#[test]
fn a_token_realm_at_a_blocked_address_gets_no_request() {
    let realm_server = Server::start_on("127.0.0.2", vec![]);
    let realm: &'static str = Box::leak(realm_server.url("/token").into_boxed_str());
    let reg = Registry::start_with(Options {
        token_realm: Some(realm),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/a/m:1", reg.host);
    let secret = docker_config(dir.path(), &reg.host);
    let cache = dir.path().join("cache");
    let o = pull_blocking(
        &cache,
        "127.0.0.2/32",
        &[&url, "--pull-secret", secret.to_str().unwrap()],
    );
    assert_failed(&o, &cache, &url, "blocked address: 127.0.0.2");
    assert_eq!(realm_server.connections(), 0, "the realm was asked");
    // Not blocked, the realm is asked, with the pull secret's credentials.
    let o = pull_blocking(
        &cache,
        "10.0.0.0/8",
        &[&url, "--pull-secret", secret.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    let asked = realm_server.seen();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].target.contains("scope=repository%3Aa%2Fm%3Apull"),
        "{asked:?}"
    );
    assert_eq!(asked[0].header("authorization"), Some("Basic dXNlcjpwYXNz"));
}

#[test]
fn an_https_registry_may_not_name_an_http_realm() {
    let realm_server = Server::start(vec![]);
    let realm: &'static str = Box::leak(realm_server.url("/token").into_boxed_str());
    let reg = Registry::start_with(Options {
        tls: true,
        token_realm: Some(realm),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/a/m:1", reg.host);
    let o = pull(
        dir.path(),
        &[&url, "--ca-file", reg.ca_file().to_str().unwrap()],
    );
    assert_failed(&o, dir.path(), &url, "unsafe bearer realm");
    assert!(stderr(&o).contains("must be https"), "{}", stderr(&o));
    assert_eq!(realm_server.connections(), 0);
}

#[test]
fn registry_credentials_do_not_follow_a_redirect_to_another_host() {
    let m = module("cdn");
    let cdn = Server::start(vec![("/blob", Behaviour::Ok(m.clone()))]);
    let routes = registry_routes(
        manifest(vec![layer("application/wasm", &m)]),
        vec![(
            blob_path(&m),
            Behaviour::Respond(307, vec![("location".into(), cdn.url("/blob"))], vec![]),
        )],
    );
    // The registry asks for Basic credentials on its ping.
    let mut routes = routes;
    routes[0].1 = Behaviour::Respond(
        401,
        vec![("www-authenticate".into(), "Basic realm=\"r\"".into())],
        vec![],
    );
    let registry = serve(&routes);
    let dir = tempfile::tempdir().unwrap();
    let secret = docker_config(dir.path(), registry.host());
    let url = format!("oci://{}/a/m:1", registry.host());
    let cache = dir.path().join("cache");
    let o = pull(&cache, &[&url, "--pull-secret", secret.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
    let manifest_request = registry
        .seen()
        .into_iter()
        .find(|s| s.target.contains("/manifests/"))
        .unwrap();
    assert_eq!(
        manifest_request.header("authorization"),
        Some("Basic dXNlcjpwYXNz"),
        "the registry itself gets the credentials"
    );
    let at_cdn = cdn.seen();
    assert_eq!(at_cdn.len(), 1);
    assert_eq!(
        at_cdn[0].header("authorization"),
        None,
        "credentials went to the CDN"
    );
}

#[test]
fn an_unsupported_layout_lists_a_few_media_types() {
    let reg = Registry::start(false);
    let layers: Vec<(&str, Vec<u8>)> = (0..8)
        .map(|i| ("text/plain", format!("layer {i}").into_bytes()))
        .collect();
    reg.push(
        "many/layers:1",
        layers,
        "application/vnd.wasm.config.v0+json",
        &RegistryAuth::Anonymous,
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("oci://{}/many/layers:1", reg.host);
    let o = pull(dir.path(), &[&url]);
    assert_failed(&o, dir.path(), &url, "unsupported layout");
    assert!(
        stderr(&o)
            .contains("[text/plain, text/plain, text/plain, text/plain, text/plain, and 3 more]"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_tar_gz_layer_over_the_size_limit_is_refused_before_its_download() {
    let reg = Registry::start(false);
    // Incompressible bytes: the layer itself is over the limit.
    let big: Vec<u8> = (0..128u32)
        .flat_map(|i| {
            use sha2::Digest;
            sha2::Sha256::digest(i.to_le_bytes()).to_vec()
        })
        .collect();
    let mut m = module("big");
    m.extend_from_slice(&big);
    reg.push(
        "big/image:1",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            crate::registry::tar_gz_with("plugin.wasm", &m),
        )],
        "application/vnd.oci.image.config.v1+json",
        &RegistryAuth::Anonymous,
    );
    // A bomb: a small layer whose plugin.wasm is far over the limit.
    let zeros = vec![0u8; 1 << 20];
    reg.push(
        "bomb/image:1",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            crate::registry::tar_gz_with("plugin.wasm", &zeros),
        )],
        "application/vnd.oci.image.config.v1+json",
        &RegistryAuth::Anonymous,
    );
    let dir = tempfile::tempdir().unwrap();
    let before = reg.requests("GET", "/v2/big/image/blobs/");
    for repo in ["big/image", "bomb/image"] {
        let url = format!("oci://{}/{repo}:1", reg.host);
        let o = pull_env(
            dir.path(),
            &[("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", "2048")],
            &[&url],
        );
        assert_failed(&o, dir.path(), &url, "exceeds size limit of 2048 bytes");
    }
    assert_eq!(
        reg.requests("GET", "/v2/big/image/blobs/"),
        before,
        "the oversized layer was downloaded"
    );
}

#[test]
fn a_realm_named_by_a_host_the_ping_was_redirected_to_gets_no_credentials() {
    let m = module("redirected-ping");
    // The other origin answers the ping with its own bearer challenge and hands out a token.
    let other = Server::start_with_self(|base| {
        vec![
            (
                "/v2/".to_string(),
                bearer_challenge(&format!("{base}/token")),
            ),
            (
                "/token".to_string(),
                Behaviour::Ok(br#"{"token":"t"}"#.to_vec()),
            ),
        ]
    });
    let mut routes = registry_routes(
        manifest(vec![layer("application/wasm", &m)]),
        vec![(blob_path(&m), Behaviour::Ok(m.clone()))],
    );
    routes[0].1 = Behaviour::Respond(307, vec![("location".into(), other.url("/v2/"))], vec![]);
    let registry = serve(&routes);
    let dir = tempfile::tempdir().unwrap();
    let secret = docker_config(dir.path(), registry.host());
    let url = format!("oci://{}/a/m:1", registry.host());
    let o = pull(
        &dir.path().join("cache"),
        &[&url, "--pull-secret", secret.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let token_requests: Vec<Seen> = other
        .seen()
        .into_iter()
        .filter(|s| s.target.starts_with("/token"))
        .collect();
    assert_eq!(token_requests.len(), 1, "{token_requests:?}");
    assert_eq!(
        token_requests[0].header("authorization"),
        None,
        "the registry's credentials went to a realm it did not name"
    );
}

/// `wasm-fetcher pull ARGS` with `env`, in a private mount namespace whose /etc/hosts names
/// `plain.test` as 127.0.0.1: a host that is not loopback by name, reached on loopback.
fn pull_with_plain_test(
    cache: &std::path::Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    let hosts = cache.with_extension("hosts");
    std::fs::write(&hosts, "127.0.0.1 plain.test\n127.0.0.1 localhost\n").unwrap();
    std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$0\" /etc/hosts && shift && exec \"$@\"")
        .arg(&hosts)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_wasm-fetcher"))
        .args(["pull", "--cache-dir"])
        .arg(cache)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("WASM_CACHE_DIR")
        .output()
        .expect("unshare (util-linux) is needed")
}

/// A plain-HTTP loopback registry redirecting to another host over plain HTTP: refused before
/// that host is asked, unless that host may itself be spoken to in plain HTTP (listed in
/// WASM_INSECURE_REGISTRIES); a redirect on the same host still goes.
#[test]
fn a_plain_http_registry_may_not_redirect_to_another_plain_http_host() {
    let elsewhere = Server::start(vec![]);
    let port = elsewhere.host().rsplit(':').next().unwrap().to_string();
    let target = format!("http://plain.test:{port}/v2/a/m/manifests/1");
    let reg = Server::start(vec![
        ("/v2/", Behaviour::Ok(b"{}".to_vec())),
        (
            "/v2/a/m/manifests/1",
            Behaviour::Respond(302, vec![("location".into(), target.clone())], vec![]),
        ),
    ]);
    let url = format!("oci://{}/a/m:1", reg.host());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("c");
    let o = pull_with_plain_test(&cache, &[], &[&url]);
    assert_failed(&o, &cache, &url, "insecure redirect");
    assert!(
        stderr(&o).contains("WASM_INSECURE_REGISTRIES"),
        "{}",
        stderr(&o)
    );
    assert_eq!(reg.hits("/v2/a/m/manifests/1"), 1);
    assert_eq!(
        elsewhere.connections(),
        0,
        "the other plain-HTTP host was asked"
    );
    // Listed as insecure, that host may be asked (it has no such manifest: 404).
    let listed = format!("plain.test:{port}");
    let o = pull_with_plain_test(&cache, &[("WASM_INSECURE_REGISTRIES", &listed)], &[&url]);
    assert!(!o.status.success());
    assert_eq!(elsewhere.hits("/v2/a/m/manifests/1"), 1, "{}", stderr(&o));
}
