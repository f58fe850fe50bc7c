//! Pulls through registry mirrors configured in containerd's hosts.toml
//! (`--registry-config-dir`): a real `docker-registry` pull-through cache in front of another,
//! the fallback to the upstream, the credential rule, and the files refused; `serve` and
//! `render` pull through the mirror too.

use std::path::Path;

use oci_client::secrets::RegistryAuth;

use crate::image_volume::ecds_module;
use crate::oci_registry::{Options, Registry};
use crate::serve_support::{dirs, wasm_plugin, write_plugin};
use crate::support::*;

fn hosts_toml(dir: &Path, registry: &str, text: &str) -> std::path::PathBuf {
    let d = dir.join(registry);
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("hosts.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A registry holding one module, a `docker-registry` pull-through cache in front of it, and
/// the hosts directory that names the cache as the registry's mirror.
struct Mirrored {
    upstream: Registry,
    mirror: Registry,
    tmp: tempfile::TempDir,
    config: std::path::PathBuf,
    url: String,
    module: Vec<u8>,
}

fn mirrored(tls: bool) -> Mirrored {
    let upstream = Registry::start(false);
    let module = module("mirrored");
    upstream.push_module("mods/m:v1", &module, &RegistryAuth::Anonymous);
    let mirror = Registry::start_with(Options {
        proxy_remote: Some(format!("http://{}", upstream.host)),
        tls,
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    hosts_toml(
        &config,
        &upstream.host,
        &format!(
            "server = \"http://{up}\"\n\n[host.\"{scheme}://{m}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            up = upstream.host,
            m = mirror.host,
            scheme = if tls { "https" } else { "http" },
        ),
    );
    let url = format!("oci://{}/mods/m:v1", upstream.host);
    Mirrored {
        upstream,
        mirror,
        tmp,
        config,
        url,
        module,
    }
}

#[test]
fn a_pull_goes_through_the_mirror_and_falls_back_to_the_upstream_when_it_is_down() {
    let Mirrored {
        upstream,
        mut mirror,
        tmp,
        config,
        url,
        module,
    } = mirrored(false);
    let dir = config.to_str().unwrap();

    let o = pull(
        &tmp.path().join("c1"),
        &["--registry-config-dir", dir, "--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    assert_eq!(mirror.requests("GET", "/v2/mods/m/manifests/v1"), 1);
    assert_eq!(mirror.requests("GET", "/v2/mods/m/blobs/"), 1);

    mirror.stop();
    let before = upstream.requests("GET", "/v2/mods/m/manifests/v1");
    let o = pull_env(
        &tmp.path().join("c2"),
        &[("WASM_REGISTRY_CONFIG_DIR", dir)],
        &["--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    assert_eq!(
        upstream.requests("GET", "/v2/mods/m/manifests/v1"),
        before + 1,
        "the upstream served the pull the mirror could not"
    );
}

#[test]
fn a_mirror_gets_no_upstream_credentials_and_its_404_falls_through() {
    let upstream = Registry::start(true);
    let module = module("private");
    let basic = RegistryAuth::Basic("user".into(), "pass".into());
    upstream.push_module("mods/p:v1", &module, &basic);
    let mirror = Server::start(vec![]);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    hosts_toml(
        &config,
        &upstream.host,
        &format!("[host.\"{}\"]\n", mirror.base),
    );
    let secret = docker_config(tmp.path(), &upstream.host);
    let o = pull(
        &tmp.path().join("c"),
        &[
            "--registry-config-dir",
            config.to_str().unwrap(),
            "--pull-secret",
            secret.to_str().unwrap(),
            "--json",
            &format!("oci://{}/mods/p:v1", upstream.host),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    let seen = mirror.seen();
    assert!(!seen.is_empty(), "the mirror was asked first");
    assert!(
        seen.iter().all(|s| s.header("authorization").is_none()),
        "{seen:?}"
    );
}

#[test]
fn a_malformed_or_oversized_hosts_toml_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    let registry = "127.0.0.1:9";
    let url = format!("oci://{registry}/mods/m:v1");
    for (text, words) in [
        ("[host.\"http://127.0.0.1:8\"\n".to_string(), "not valid"),
        (
            "[host.\"http://127.0.0.1:8\"]\nmirror = true\n".to_string(),
            "unknown field `mirror`",
        ),
        (format!("# {}\n", "x".repeat(70 << 10)), "65536"),
    ] {
        let path = hosts_toml(&config, registry, &text);
        let o = pull(
            &tmp.path().join("c"),
            &["--registry-config-dir", config.to_str().unwrap(), &url],
        );
        let err = stderr(&o);
        assert!(!o.status.success());
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(words),
            "{words}: {err}"
        );
    }
}

#[test]
fn serve_pulls_through_the_mirror_of_its_registry_config_dir() {
    let m = mirrored(false);
    let d = dirs();
    write_plugin(&d.plugins.join("m.yaml"), &wasm_plugin("m", &m.url, ""));
    let serve = d.serve_ready(&[], &["--registry-config-dir", m.config.to_str().unwrap()]);
    let path = ecds_module(&d.ecds.join("test.m.yaml"));
    assert_eq!(std::fs::read(path).unwrap(), m.module);
    assert_eq!(m.mirror.requests("GET", "/v2/mods/m/manifests/v1"), 1);
    assert_eq!(m.mirror.requests("GET", "/v2/mods/m/blobs/"), 1);
    assert!(serve.stop().success());
}

#[test]
fn render_pulls_through_the_mirror_of_its_registry_config_dir() {
    let m = mirrored(false);
    let plugin = m.tmp.path().join("m.yaml");
    std::fs::write(&plugin, wasm_plugin("m", &m.url, "")).unwrap();
    let out = m.tmp.path().join("ecds");
    let o = fetcher()
        .arg("render")
        .arg(&plugin)
        .arg("-o")
        .arg(&out)
        .arg("--cache-dir")
        .arg(m.tmp.path().join("cache"))
        .arg("--registry-config-dir")
        .arg(&m.config)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let path = ecds_module(&out.join("test.m.yaml"));
    assert_eq!(std::fs::read(path).unwrap(), m.module);
    assert_eq!(m.mirror.requests("GET", "/v2/mods/m/manifests/v1"), 1);
}

/// A mirror serving TLS with a certificate of its own CA (IP SAN 127.0.0.1): its `ca` lets the
/// pull through; without it the mirror is refused for that certificate and the pull falls back
/// to the upstream, as containerd does; `skip_verify` lets it through unverified.
#[test]
fn a_tls_mirror_is_trusted_by_its_ca_or_skip_verify_and_refused_otherwise() {
    let m = mirrored(true);
    let upstream_pulls = || m.upstream.requests("GET", "/v2/mods/m/manifests/v1");
    let mirror_pulls = || m.mirror.requests("GET", "/v2/mods/m/manifests/v1");
    let head = format!(
        "server = \"http://{}\"\n\n[host.\"https://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        m.upstream.host, m.mirror.host
    );
    let ca = format!("  ca = \"{}\"\n", m.mirror.ca_file().display());
    for (n, (extra, through_mirror)) in [
        (ca.as_str(), true),
        ("", false),
        ("  skip_verify = true\n", true),
    ]
    .into_iter()
    .enumerate()
    {
        hosts_toml(&m.config, &m.upstream.host, &format!("{head}{extra}"));
        let (upstream_before, mirror_before) = (upstream_pulls(), mirror_pulls());
        let o = pull_env(
            &m.tmp.path().join(format!("c{n}")),
            &[("WASM_FETCHER_LOG", "warn")],
            &[
                "--registry-config-dir",
                m.config.to_str().unwrap(),
                "--json",
                &m.url,
            ],
        );
        assert!(o.status.success(), "{extra}: {}", stderr(&o));
        assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), m.module);
        let by_mirror = (
            mirror_pulls() - mirror_before,
            upstream_pulls() - upstream_before,
        );
        if through_mirror {
            assert_eq!(by_mirror.0, 1, "{extra}: {}", stderr(&o));
        } else {
            assert_eq!(by_mirror, (0, 1), "{extra}: {}", stderr(&o));
            let err = stderr(&o);
            assert!(
                err.contains(&m.mirror.host) && err.contains("certificate"),
                "the refusal names the mirror and its certificate: {err}"
            );
        }
    }
}

/// A mirror served under a path (`http: prefix: /mirror/`): a host URL without `/v2` gets it
/// added, and with `override_path` its path is the API root as written, so `/mirror` then asks
/// `/mirror/mods/...`, which that mirror does not serve, and the pull falls back.
#[test]
fn override_path_takes_the_host_path_as_the_api_root() {
    let upstream = Registry::start(false);
    let module = module("prefixed");
    upstream.push_module("mods/m:v1", &module, &RegistryAuth::Anonymous);
    let mirror = Registry::start_with(Options {
        proxy_remote: Some(format!("http://{}", upstream.host)),
        prefix: Some("/mirror/"),
        ..Default::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    let url = format!("oci://{}/mods/m:v1", upstream.host);
    for (n, (path, override_path, asked)) in [
        ("/mirror", false, "/mirror/v2/mods/m/manifests/v1"),
        ("/mirror/v2", true, "/mirror/v2/mods/m/manifests/v1"),
        ("/mirror", true, "/mirror/mods/m/manifests/v1"),
    ]
    .into_iter()
    .enumerate()
    {
        hosts_toml(
            &config,
            &upstream.host,
            &format!(
                "server = \"http://{}\"\n\n[host.\"http://{}{path}\"]\n  override_path = {override_path}\n",
                upstream.host, mirror.host
            ),
        );
        let upstream_before = upstream.requests("GET", "/v2/mods/m/manifests/v1");
        let asked_before = mirror.requests("GET", asked);
        let o = pull(
            &tmp.path().join(format!("c{n}")),
            &[
                "--registry-config-dir",
                config.to_str().unwrap(),
                "--json",
                &url,
            ],
        );
        assert!(o.status.success(), "{path}: {}", stderr(&o));
        assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
        assert_eq!(mirror.requests("GET", asked), asked_before + 1, "{path}");
        // A mirror miss is the pull-through's own fetch from the upstream; a fallback is ours.
        let upstream_after = upstream.requests("GET", "/v2/mods/m/manifests/v1");
        let fell_back = asked.starts_with("/mirror/mods");
        assert_eq!(
            upstream_after - upstream_before,
            usize::from(n == 0 || fell_back),
            "{path}"
        );
    }
}

fn stdout_json_path(o: &std::process::Output) -> std::path::PathBuf {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["path"].as_str().unwrap().into()
}

/// A hosts.toml that is a link to a secret file (a password hash): the parse error says where,
/// never what the line holds.
#[test]
fn a_hosts_toml_parse_error_quotes_none_of_its_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    let registry = "127.0.0.1:9";
    let secret = tmp.path().join("shadow");
    std::fs::write(&secret, "root:$6$s3cr3thash$xyz:19000:0:99999:7:::\n").unwrap();
    std::fs::create_dir_all(config.join(registry)).unwrap();
    std::os::unix::fs::symlink(&secret, config.join(registry).join("hosts.toml")).unwrap();
    let url = format!("oci://{registry}/mods/m:v1");
    let o = pull(
        &tmp.path().join("c"),
        &["--registry-config-dir", config.to_str().unwrap(), &url],
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("not valid TOML at line 1"), "{err}");
    assert!(
        !err.contains("s3cr3thash") && !err.contains("root:"),
        "{err}"
    );
}

/// A registry named `..` (or anything that is not a host[:port]) names no directory of the
/// hosts directory: refused, and the hosts.toml of the directory above is never read.
#[test]
fn a_registry_that_is_not_a_host_reads_no_hosts_toml() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("certs.d");
    std::fs::create_dir_all(&config).unwrap();
    // What `certs.d/../hosts.toml` would be: a mirror the test can count.
    let mirror = Server::start(vec![]);
    std::fs::write(
        tmp.path().join("hosts.toml"),
        format!("[host.\"{}\"]\n", mirror.base),
    )
    .unwrap();
    let url = "oci://../mods/m:v1";
    let o = pull(
        &tmp.path().join("c"),
        &["--registry-config-dir", config.to_str().unwrap(), url],
    );
    let err = stderr(&o);
    assert!(!o.status.success(), "{url}");
    // Refused as a reference already: `..` names no host.
    assert!(err.contains("invalid registry \"..\""), "{url}: {err}");
    assert_eq!(mirror.connections(), 0, "{url}: the file above was read");
}

/// As containerd does, every request to a mirror names the upstream registry it is made for
/// (`?ns=<registry host>`); a request to the registry itself carries none.
#[test]
fn mirror_requests_carry_the_upstream_as_ns_and_upstream_requests_do_not() {
    let Mirrored {
        upstream,
        mut mirror,
        tmp,
        config,
        url,
        module,
    } = mirrored(false);
    let dir = config.to_str().unwrap();
    let o = pull(
        &tmp.path().join("c1"),
        &["--registry-config-dir", dir, "--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_json_path(&o)).unwrap(), module);
    // Encoded as containerd encodes it (Go's url.Values): the port's colon as %3A.
    let ns = format!("?ns={}", upstream.host.replace(':', "%3A"));
    assert_eq!(
        mirror.requests("GET", &format!("/v2/mods/m/manifests/v1{ns}")),
        1
    );
    assert_eq!(mirror.requests("GET", "/v2/mods/m/blobs/"), 1);
    assert_eq!(
        mirror.requests("GET", "/v2/mods/m/blobs/"),
        mirror.requests_with("GET", "/v2/mods/m/blobs/", &ns),
        "a blob request to the mirror without ns"
    );
    // The mirror down: the pull falls back to the upstream, which is asked without ns.
    mirror.stop();
    let o = pull(
        &tmp.path().join("c2"),
        &["--registry-config-dir", dir, "--json", &url],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(upstream.requests("GET", "/v2/mods/m/manifests/v1") >= 1);
    assert_eq!(upstream.requests_with("GET", "/v2/", "ns="), 0);
}
