//! What the cache serves when its files were changed, lost or cannot be written: a pin is
//! checked against the bytes, a lost index is rebuilt, a read-only cache still answers.

use std::path::Path;

use crate::support::*;

pub fn ls_json(cache: &Path, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let o = fetcher()
        .envs(env.iter().copied())
        .args(["ls", "--json", "--cache-dir"])
        .arg(cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

pub fn purge(cache: &Path, expiry: &str) -> std::process::Output {
    fetcher()
        .env("WASM_MODULE_EXPIRY", expiry)
        .args(["purge", "--cache-dir"])
        .arg(cache)
        .output()
        .unwrap()
}

/// Writes `bytes` (of the same length) over `path` and puts its mtime back: size and mtime,
/// all the index's stamp records, say nothing changed.
fn replace_keeping_stamp(path: &Path, bytes: &[u8]) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

#[test]
fn a_pinned_hit_is_rehashed_so_a_module_changed_with_its_mtime_restored_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    let good = module("good-bytes");
    let evil = module("evil-bytes");
    assert_eq!(good.len(), evil.len());
    std::fs::write(&src, &good).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let sha = sha256_hex(&good);
    let cached = stdout_path(&pull(&cache, &[&url, "--sha256", &sha]));
    replace_keeping_stamp(&cached, &evil);
    let o = pull(&cache, &[&url, "--sha256", &sha, "--pull-policy", "Never"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "served a changed module as pinned"
    );
    assert!(stderr(&o).contains("not in cache"), "{}", stderr(&o));
    let o = pull(&cache, &[&url, "--sha256", &sha, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["from_cache"], false, "fetched again from the source");
    assert_eq!(v["pin"], "module_sha256");
    assert_eq!(std::fs::read(&cached).unwrap(), good);
}

#[test]
fn an_oci_pin_is_checked_against_the_bytes_not_the_stamp() {
    let reg = crate::oci_registry::Registry::start(false);
    let good = module("oci-good");
    let evil = module("oci-evil");
    let manifest = reg.push(
        "pin/m:1.0",
        vec![("application/wasm", good.clone())],
        "application/vnd.wasm.config.v0+json",
        &oci_client::secrets::RegistryAuth::Anonymous,
    );
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let url = format!("oci://{}/pin/m:1.0", reg.host);
    let module_pin = sha256_hex(&good);
    let manifest_pin = manifest.trim_start_matches("sha256:").to_string();
    let o = pull(&cache, &[&url, "--sha256", &module_pin]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cached = stdout_path(&o);
    for (pin, matched) in [
        (&module_pin, "module_sha256"),
        (&manifest_pin, "manifest_digest"),
    ] {
        replace_keeping_stamp(&cached, &evil);
        let o = pull(&cache, &[&url, "--sha256", pin, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["pin"], matched);
        assert_eq!(
            v["from_cache"], false,
            "{matched}: the layer is downloaded again"
        );
        assert_eq!(std::fs::read(&cached).unwrap(), good, "{matched}");
    }
}

#[test]
fn a_missing_empty_or_damaged_index_is_rebuilt_from_the_modules() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let index = cache.join("index.json");
    // A valid document that lists nothing while modules are on disk is damage too.
    for damage in [
        None,
        Some(""),
        Some("{\"modules\": {"),
        Some("[1, 2, 3]"),
        Some("{}"),
        Some("{\"format\": 2, \"modules\": {}}"),
    ] {
        let mut shas = Vec::new();
        for tag in ["one", "two"] {
            let src = dir.path().join(format!("{tag}.wasm"));
            std::fs::write(&src, module(tag)).unwrap();
            let url = format!("file://{}", src.display());
            assert_eq!(pull(&cache, &[&url]).status.code(), Some(0));
            shas.push(sha256_hex(&module(tag)));
        }
        match damage {
            None => std::fs::remove_file(&index).unwrap(),
            Some(text) => std::fs::write(&index, text).unwrap(),
        }
        let listed = ls_json(&cache, &[]);
        let mut found: Vec<&str> = listed
            .iter()
            .map(|m| m["sha256"].as_str().unwrap())
            .collect();
        found.sort();
        shas.sort();
        assert_eq!(found, shas, "{damage:?}: every module is listed again");
        assert!(listed.iter().all(|m| m["size"].as_u64().unwrap() > 8));
        let text = fetcher()
            .args(["ls", "--cache-dir"])
            .arg(&cache)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&text.stdout)
                .contains("(unknown: the cache index was rebuilt)"),
            "{}",
            String::from_utf8_lossy(&text.stdout)
        );
        // A pinned pull finds its module without its source.
        let src = dir.path().join("one.wasm");
        std::fs::remove_file(&src).unwrap();
        let url = format!("file://{}", src.display());
        let pin = sha256_hex(&module("one"));
        let o = pull(&cache, &[&url, "--sha256", &pin, "--pull-policy", "Never"]);
        assert_eq!(o.status.code(), Some(0), "{damage:?}: {}", stderr(&o));
        // And everything is purgeable again.
        let o = purge(&cache, "1ns");
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout)
                .matches("purged sha256:")
                .count(),
            2,
            "{damage:?}"
        );
        assert!(files_under(&cache)
            .iter()
            .all(|p| p.extension().is_none_or(|x| x != "wasm")));
    }
}

#[test]
fn purge_removes_lock_files_no_one_holds_and_keeps_held_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut urls = Vec::new();
    for tag in ["a", "b"] {
        let src = dir.path().join(format!("{tag}.wasm"));
        std::fs::write(&src, module(tag)).unwrap();
        urls.push(format!("file://{}", src.display()));
        assert_eq!(
            pull(&cache, &[&urls[urls.len() - 1]]).status.code(),
            Some(0)
        );
    }
    let locks = lock_files(&cache);
    assert_eq!(locks.len(), 2);
    let held = std::fs::File::options()
        .write(true)
        .open(&locks[0])
        .unwrap();
    held.lock().unwrap();
    let o = purge(&cache, "24h");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        lock_files(&cache),
        vec![locks[0].clone()],
        "only the held lock stays"
    );
    drop(held);
    assert_eq!(purge(&cache, "24h").status.code(), Some(0));
    assert_eq!(lock_files(&cache), Vec::<std::path::PathBuf>::new());
    // Pulls still coordinate through fresh lock files.
    let o = pull(&cache, &[&urls[0], "--pull-policy", "Always"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn never_is_served_from_a_cache_this_process_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.wasm");
    let bytes = module("read-only");
    std::fs::write(&src, &bytes).unwrap();
    let cache = dir.path().join("cache");
    let url = format!("file://{}", src.display());
    let sha = sha256_hex(&bytes);
    let cached = stdout_path(&pull(&cache, &[&url]));
    // Last used long ago: a hit wants to record its use, which a read-only cache refuses.
    let index = cache.join("index.json");
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    doc["modules"][&sha]["last_used"] = 0.into();
    std::fs::write(&index, serde_json::to_vec(&doc).unwrap()).unwrap();
    // A cache shipped without its scratch directory, which it cannot create now.
    std::fs::remove_dir(cache.join("tmp")).unwrap();
    let read_only = "mount --bind -o ro \"$0\" \"$0\"";
    let cache_dir = cache.to_str().unwrap();
    for pin in [vec![], vec!["--sha256", &sha]] {
        let mut args = vec![
            "pull",
            &url,
            "--pull-policy",
            "Never",
            "--cache-dir",
            cache_dir,
        ];
        args.extend(pin);
        let o = fetcher_in_namespace(read_only, &cache, &args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stdout_path(&o), cached);
    }
    // What it does not hold, it cannot fetch: the error says why.
    let other = dir.path().join("other.wasm");
    std::fs::write(&other, module("other")).unwrap();
    let other_url = format!("file://{}", other.display());
    let o = fetcher_in_namespace(
        read_only,
        &cache,
        &["pull", &other_url, "--cache-dir", cache_dir],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot write (Read-only file system"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read(&index).unwrap(),
        serde_json::to_vec(&doc).unwrap()
    );
}

#[test]
fn an_io_error_is_printed_once_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // A directory as the module.
    let url = format!("file://{}", dir.path().display());
    let o = pull(&cache, &[&url]);
    assert_failed(&o, &cache, &url, "not a regular file (a directory)");
    assert!(stderr(&o).contains(&format!("cannot read file {}", dir.path().display())));
    // A disk that fills up during the download.
    let src = dir.path().join("big.wasm");
    let mut big = module("big");
    big.resize(256 << 10, 0);
    std::fs::write(&src, &big).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let url = format!("file://{}", src.display());
    let o = fetcher_in_namespace(
        "mount -t tmpfs -o size=64k tmpfs \"$0\"",
        &cache,
        &["pull", &url, "--cache-dir", cache.to_str().unwrap()],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("No space left on device").count(), 1, "{err}");
    assert!(
        err.contains(&format!("cache error at {}/tmp/download-", cache.display())),
        "{err}"
    );
}
