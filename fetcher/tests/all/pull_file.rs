//! `pull file://...`: success, pinning, cache hits, and each failure leaving nothing behind.

use std::os::unix::fs::PermissionsExt;

use crate::support::*;

#[test]
fn pulls_a_file_into_the_cache_with_mode_0644() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    let bytes = module("file");
    std::fs::write(&src, &bytes).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let sha = sha256_hex(&bytes);
    let o = pull(&cache, &[&url, "--sha256", &sha]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let path = stdout_path(&o);
    assert!(path.is_absolute());
    assert!(path.starts_with(&cache));
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert!(path.to_string_lossy().ends_with(&format!("{sha}.wasm")));
}

#[test]
fn a_pinned_module_in_the_cache_is_served_without_reading_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    let bytes = module("cached");
    std::fs::write(&src, &bytes).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let sha = sha256_hex(&bytes);
    let first = pull(&cache, &[&url, "--sha256", &sha]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    std::fs::remove_file(&src).unwrap();
    let second = pull(&cache, &[&url, "--sha256", &sha, "--json"]);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let v: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(v["from_cache"], true);
    assert_eq!(
        v["path"].as_str().unwrap(),
        stdout_path(&first).to_str().unwrap()
    );
}

#[test]
fn wrong_sha256_fails_and_caches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    std::fs::write(&src, module("x")).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let o = pull(&cache, &[&url, "--sha256", &"0".repeat(64)]);
    assert_failed(&o, &cache, &url, "checksum mismatch");
}

#[test]
fn a_non_wasm_file_fails_and_caches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("index.html");
    std::fs::write(&src, "<html>not a module</html>").unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    assert_failed(&pull(&cache, &[&url]), &cache, &url, "not a Wasm module");
}

#[test]
fn a_wasm_component_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("c.wasm");
    std::fs::write(&src, b"\0asm\x0d\0\x01\0").unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    assert_failed(&pull(&cache, &[&url]), &cache, &url, "Wasm component");
}

#[test]
fn an_endless_device_is_refused_at_its_first_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = "file:///dev/zero";
    let (o, _) = run_within(
        fetcher().args(["pull", url, "--cache-dir"]).arg(&cache),
        std::time::Duration::from_secs(20),
    );
    assert_failed(&o, &cache, url, "not a Wasm module");
}

#[test]
fn a_missing_file_fails_and_caches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = "file:///nonexistent/filter.wasm";
    assert_failed(&pull(&cache, &[url]), &cache, url, "no such file");
}

#[test]
fn an_unsupported_scheme_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = "ftp://127.0.0.1/x.wasm";
    assert_failed(&pull(&cache, &[url]), &cache, url, "unsupported scheme");
}

#[test]
fn a_malformed_sha256_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = pull(dir.path(), &["file:///x.wasm", "--sha256", "abc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("64 hex"), "{}", stderr(&o));
}

#[test]
fn a_module_over_the_size_limit_fails() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.wasm");
    let mut bytes = module("big");
    bytes.resize(4096, 0);
    std::fs::write(&src, &bytes).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let o = fetcher()
        .env("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", "1000")
        .args(["pull", &url, "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert_failed(&o, &cache, &url, "exceeds size limit");
}

#[test]
fn ls_shows_modules_and_purge_removes_only_expired_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut urls = Vec::new();
    for tag in ["one", "two"] {
        let src = dir.path().join(format!("{tag}.wasm"));
        std::fs::write(&src, module(tag)).unwrap();
        let url = format!("file://{}", src.display());
        assert_eq!(pull(&cache, &[&url]).status.code(), Some(0));
        urls.push(url);
    }
    let ls = fetcher()
        .args(["ls", "--json", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(listed
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["source"] == urls[0].as_str()));
    let expires = listed[0]["expires"].as_u64().unwrap() - listed[0]["last_used"].as_u64().unwrap();
    assert_eq!(expires, 24 * 3600, "WASM_MODULE_EXPIRY defaults to 24h");

    let purge = |expiry: &str| {
        fetcher()
            .env("WASM_MODULE_EXPIRY", expiry)
            .args(["purge", "--cache-dir"])
            .arg(&cache)
            .output()
            .unwrap()
    };
    let o = purge("1h");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "nothing is an hour old");
    // 0 would mean the default (24h), as in Istio: the shortest expiry is 1ns.
    let o = purge("1ns");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .matches("purged sha256:")
            .count(),
        2
    );
    assert!(files_under(&cache)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".wasm")));
    let o = pull(&cache, &[&urls[0], "--pull-policy", "Never"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not in cache"), "{}", stderr(&o));
    let o = purge("soon");
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("WASM_MODULE_EXPIRY"), "{}", stderr(&o));
}

#[test]
fn a_damaged_cached_module_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    let bytes = module("intact");
    std::fs::write(&src, &bytes).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let sha = sha256_hex(&bytes);
    let cached = stdout_path(&pull(&cache, &[&url, "--sha256", &sha]));
    // Same length, other bytes (a flipped bit on disk): the mtime gives it away.
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let truncated = bytes[..bytes.len() / 2].to_vec();
    for damage in [flipped, truncated] {
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&cached, &damage).unwrap();
        // Never may not fetch, and will not serve what is there.
        let o = pull(&cache, &[&url, "--sha256", &sha, "--pull-policy", "Never"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("not in cache"), "{}", stderr(&o));
        // IfNotPresent fetches it again and replaces the damaged file.
        let o = pull(&cache, &[&url, "--sha256", &sha, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["from_cache"], false);
        assert_eq!(std::fs::read(&cached).unwrap(), bytes);
    }
    // A file that was only touched is re-hashed once, found intact, and served.
    let t = std::fs::File::options().append(true).open(&cached).unwrap();
    t.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let o = pull(&cache, &[&url, "--sha256", &sha, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["from_cache"], true, "{}", stderr(&o));
}
