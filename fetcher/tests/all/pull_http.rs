//! `pull http://...` against a loopback server that misbehaves on purpose.

use std::time::Duration;

use crate::support::*;

#[test]
fn pulls_over_http() {
    let bytes = module("http");
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(bytes.clone()))]);
    let dir = tempfile::tempdir().unwrap();
    let o = pull(
        dir.path(),
        &[&server.url("/m.wasm"), "--sha256", &sha256_hex(&bytes)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), bytes);
}

#[test]
fn a_cache_hit_makes_no_request() {
    let bytes = module("hit");
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(bytes.clone()))]);
    let dir = tempfile::tempdir().unwrap();
    let sha = sha256_hex(&bytes);
    assert_eq!(
        pull(dir.path(), &[&server.url("/m.wasm"), "--sha256", &sha])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(server.hits("/m.wasm"), 1);
    let o = pull(dir.path(), &[&server.url("/m.wasm"), "--sha256", &sha]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        server.hits("/m.wasm"),
        1,
        "the second pull must not touch the network"
    );
}

#[test]
fn http_404_fails_without_retry_and_caches_nothing() {
    let server = Server::start(vec![]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/missing.wasm");
    assert_failed(&pull(dir.path(), &[&url]), dir.path(), &url, "HTTP 404");
    assert_eq!(server.hits("/missing.wasm"), 1, "a 404 is not retried");
}

#[test]
fn a_503_then_200_succeeds_after_retries() {
    let bytes = module("flaky");
    let server = Server::start(vec![(
        "/flaky.wasm",
        Behaviour::FailThenOk(2, bytes.clone()),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let o = pull(dir.path(), &[&server.url("/flaky.wasm")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(server.hits("/flaky.wasm"), 3);
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), bytes);
}

#[test]
fn attempts_are_bounded_by_the_retry_setting() {
    let server = Server::start(vec![("/down.wasm", Behaviour::Status(503))]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/down.wasm");
    let o = fetcher()
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "3")
        .args(["pull", &url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), &url, "HTTP 503");
    assert_eq!(server.hits("/down.wasm"), 3);
}

#[test]
fn a_501_is_not_retried() {
    let server = Server::start(vec![("/x.wasm", Behaviour::Status(501))]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/x.wasm");
    assert_failed(&pull(dir.path(), &[&url]), dir.path(), &url, "HTTP 501");
    assert_eq!(server.hits("/x.wasm"), 1);
}

#[test]
fn a_truncated_body_fails_and_caches_nothing() {
    let mut bytes = module("trunc");
    bytes.resize(1000, 7);
    let server = Server::start(vec![("/t.wasm", Behaviour::Truncate(bytes, 100))]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/t.wasm");
    let o = fetcher()
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "2")
        .args(["pull", &url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), &url, "truncated download");
    assert_eq!(server.hits("/t.wasm"), 2, "a truncated body is retried");
}

#[test]
fn a_slow_server_times_out() {
    let server = Server::start(vec![(
        "/slow.wasm",
        Behaviour::Slow(Duration::from_secs(3), module("slow")),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/slow.wasm");
    let o = fetcher()
        .env("WASM_HTTP_REQUEST_TIMEOUT", "300ms")
        .env("WASM_HTTP_REQUEST_MAX_RETRIES", "2")
        .args(["pull", &url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_failed(&o, dir.path(), &url, "timed out");
}

#[test]
fn html_instead_of_wasm_fails() {
    let server = Server::start(vec![(
        "/page.wasm",
        Behaviour::Ok(b"<html>login</html>".to_vec()),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/page.wasm");
    assert_failed(
        &pull(dir.path(), &[&url]),
        dir.path(),
        &url,
        "not a Wasm module",
    );
}

#[test]
fn wrong_checksum_over_http_fails() {
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(module("tampered")))]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.wasm");
    let o = pull(
        dir.path(),
        &[&url, "--sha256", &sha256_hex(&module("original"))],
    );
    assert_failed(&o, dir.path(), &url, "checksum mismatch");
}

#[test]
fn a_bad_duration_setting_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let url = "http://127.0.0.1:9/x.wasm";
    let o = fetcher()
        .env("WASM_HTTP_REQUEST_TIMEOUT", "15")
        .args(["pull", url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("WASM_HTTP_REQUEST_TIMEOUT"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn concurrent_processes_make_one_download_and_agree_on_the_path() {
    let bytes = module("shared");
    let server = Server::start(vec![(
        "/s.wasm",
        Behaviour::Slow(Duration::from_millis(500), bytes.clone()),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/s.wasm");
    let sha = sha256_hex(&bytes);
    let children: Vec<_> = (0..4)
        .map(|_| {
            fetcher()
                .args(["pull", &url, "--sha256", &sha, "--cache-dir"])
                .arg(dir.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for o in &outputs {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    }
    let first = stdout_path(&outputs[0]);
    assert!(outputs.iter().all(|o| stdout_path(o) == first));
    assert_eq!(server.hits("/s.wasm"), 1, "one download for four processes");
}

#[test]
fn gzip_tar_and_tar_gz_bodies_are_unboxed_and_pinned_by_the_module() {
    use std::io::Write;
    let m = module("boxed");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&m).unwrap();
    let gz = gz.finish().unwrap();
    let tar = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(m.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, "filter.wasm", m.as_slice()).unwrap();
        b.into_inner().unwrap()
    };
    let tgz = crate::registry::tar_gz_with("anything.wasm", &m);
    let server = Server::start(vec![
        ("/m.wasm.gz", Behaviour::Ok(gz)),
        ("/m.tar", Behaviour::Ok(tar)),
        ("/m.tar.gz", Behaviour::Ok(tgz)),
    ]);
    for path in ["/m.wasm.gz", "/m.tar", "/m.tar.gz"] {
        let dir = tempfile::tempdir().unwrap();
        let o = pull(
            dir.path(),
            &[&server.url(path), "--sha256", &sha256_hex(&m)],
        );
        assert_eq!(o.status.code(), Some(0), "{path}: {}", stderr(&o));
        assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m, "{path}");
        let tmp_files = files_under(&dir.path().join("tmp"));
        assert!(tmp_files.is_empty(), "{path}: {tmp_files:?}");
    }
}

#[test]
fn proxy_environment_variables_are_honoured() {
    // The "proxy" is the loopback server: it receives the absolute-form request for a host that
    // does not exist and answers it, which only happens if the fetcher went through it.
    let url = "http://wasm-modules.invalid/filter.wasm";
    let m = module("proxied");
    let proxy = Server::start(vec![(url, Behaviour::Ok(m.clone()))]);
    let dir = tempfile::tempdir().unwrap();
    let o = through_proxy(&proxy.base)
        .args(["pull", url, "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(proxy.hits(url), 1);
    assert_eq!(std::fs::read(stdout_path(&o)).unwrap(), m);
    // NO_PROXY exempts a host: the request goes to it directly, not through the proxy.
    let direct = Server::start(vec![("/d.wasm", Behaviour::Ok(m.clone()))]);
    let direct_url = direct.url("/d.wasm");
    let other = tempfile::tempdir().unwrap();
    let o = fetcher()
        .env("HTTP_PROXY", &proxy.base)
        .env("NO_PROXY", "127.0.0.1")
        .args(["pull", &direct_url, "--cache-dir"])
        .arg(other.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(direct.hits("/d.wasm"), 1);
    assert_eq!(proxy.hits(&direct_url), 0, "NO_PROXY was ignored");
}

#[test]
fn a_long_pull_shows_a_progress_bar_on_a_terminal_and_nothing_when_piped() {
    let m = module("progress");
    let server = Server::start(vec![(
        "/slow.wasm",
        Behaviour::Trickle(m.clone(), 8, Duration::from_millis(100)),
    )]);
    let url = server.url("/slow.wasm");
    let dir = tempfile::tempdir().unwrap();
    // Piped: the path on stdout and not a byte on stderr.
    let o = pull(&dir.path().join("piped"), &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "stderr when piped: {}", stderr(&o));
    // On a terminal (util-linux `script` gives the process a pty): a bar naming the URL.
    let cmd = format!(
        "{} pull {url} --cache-dir {}",
        env!("CARGO_BIN_EXE_wasm-fetcher"),
        dir.path().join("tty").display()
    );
    let o = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("script (util-linux) is needed");
    let screen = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{screen}");
    assert!(
        screen.contains(&format!("pulling {url}")) && screen.contains("B/"),
        "no progress bar on the terminal: {screen:?}"
    );
}

/// A password in the URL is the user's secret: the failure line names the URL without it,
/// even where the transport's own message repeats the URL.
#[test]
fn a_failure_never_prints_the_password_of_the_url() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    for (url, shown) in [
        (
            format!("http://user:s3cret@127.0.0.1:{port}/m.wasm"),
            format!("http://***@127.0.0.1:{port}/m.wasm"),
        ),
        (
            "oci://user:s3cret@127.0.0.1:5000/a/m:1".to_string(),
            "oci://***@127.0.0.1:5000/a/m:1".to_string(),
        ),
    ] {
        let o = fetcher()
            .env("WASM_HTTP_REQUEST_MAX_RETRIES", "1")
            .args(["pull", &url, "--cache-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_ne!(o.status.code(), Some(0), "{err}");
        assert!(!err.contains("s3cret"), "the password was printed: {err}");
        assert!(
            err.starts_with(&format!("wasm-fetcher: {shown}: ")),
            "the URL is still named: {err}"
        );
    }
}

/// The cache index is world-readable: a URL's password is not written to it, nor printed by
/// `pull --json` or `ls`; the source is still known, so the next pull is served from cache.
#[test]
fn a_url_password_is_not_written_to_the_cache_or_printed() {
    let bytes = module("userinfo");
    let server = Server::start(vec![("/m.wasm", Behaviour::Ok(bytes.clone()))]);
    let dir = tempfile::tempdir().unwrap();
    let url = server
        .url("/m.wasm")
        .replace("http://", "http://user:s3cret@");
    for from_cache in [false, true] {
        let o = pull(dir.path(), &[&url, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("s3cret"), "{out}");
        assert!(
            out.contains(&format!("\"from_cache\":{from_cache}")),
            "{out}"
        );
    }
    assert_eq!(server.hits("/m.wasm"), 1);
    let index = std::fs::read_to_string(dir.path().join("index.json")).unwrap();
    assert!(!index.contains("s3cret"), "{index}");
    assert!(index.contains("http://***@127.0.0.1"), "{index}");
    let ls = fetcher()
        .args(["ls", "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ls.stdout).contains("s3cret"));
}
