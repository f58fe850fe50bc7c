//! Local files given beside the URL (`--pull-secret`, `--ca-file`, the bootstrap `rewrite`
//! reads): only regular files are read, with a limit; anything else is named in the error.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

/// Not regular files, each with the words the error must use for it.
fn not_regular_files(dir: &Path) -> Vec<(std::path::PathBuf, &'static str)> {
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    vec![
        (Path::new("/dev/zero").to_path_buf(), "a character device"),
        (fifo, "a FIFO"),
        (dir.to_path_buf(), "a directory"),
    ]
}

/// Nothing listens there: the secret is read before any connection.
const OCI_URL: &str = "oci://127.0.0.1:9/wasm/m:v1";

fn pull_with_secret(secret: &Path, cache: &Path) -> std::process::Output {
    let (o, _) = run_within(
        fetcher()
            .args(["pull", OCI_URL, "--pull-secret"])
            .arg(secret)
            .arg("--cache-dir")
            .arg(cache),
        Duration::from_secs(20),
    );
    o
}

#[test]
fn a_pull_secret_that_is_not_a_regular_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    for (secret, kind) in not_regular_files(&inputs_dir(dir.path())) {
        let o = pull_with_secret(&secret, &cache);
        assert_failed(&o, &cache, OCI_URL, "cannot read --pull-secret");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("not a regular file ({kind})")),
            "{err}"
        );
        assert!(err.contains(&secret.display().to_string()), "{err}");
    }
}

#[test]
fn an_oversized_pull_secret_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let secret = dir.path().join("config.json");
    // Sparse: 2 GiB on paper, nothing on disk; reading it would be the bug.
    std::fs::File::create(&secret)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let o = pull_with_secret(&secret, &cache);
    assert_failed(
        &o,
        &cache,
        OCI_URL,
        "larger than the limit of 1048576 bytes",
    );
}

#[test]
fn the_default_docker_config_is_read_with_the_same_limit_and_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = dir.path().join("config.json");
    std::fs::File::create(&config)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let (o, _) = run_within(
        fetcher()
            .env("DOCKER_CONFIG", dir.path())
            .args(["pull", OCI_URL, "--cache-dir"])
            .arg(&cache),
        Duration::from_secs(20),
    );
    assert_failed(
        &o,
        &cache,
        OCI_URL,
        &format!(
            "cannot read Docker config {}: larger than the limit of 1048576 bytes",
            config.display()
        ),
    );
}

#[test]
fn a_ca_file_that_is_not_a_regular_file_or_holds_no_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let src = dir.path().join("m.wasm");
    std::fs::write(&src, module("ca")).unwrap();
    let url = format!("file://{}", src.display());
    let inputs = inputs_dir(dir.path());
    let no_cert = dir.path().join("empty.pem");
    std::fs::write(&no_cert, "# a bundle someone forgot to fill\n").unwrap();
    let key_only = dir.path().join("key.pem");
    std::fs::write(
        &key_only,
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let mut cases = not_regular_files(&inputs);
    cases.push((no_cert, "no certificate in it"));
    cases.push((key_only, "no certificate in it"));
    for (ca, words) in cases {
        let (o, _) = run_within(
            fetcher()
                .args(["pull", &url, "--ca-file"])
                .arg(&ca)
                .arg("--cache-dir")
                .arg(&cache),
            Duration::from_secs(20),
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", ca.display());
        assert!(err.contains("cannot read --ca-file"), "{err}");
        assert!(err.contains(words), "expected {words:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn rewrite_reads_only_a_regular_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    for (input, kind) in not_regular_files(&inputs_dir(dir.path())) {
        let (o, _) = run_within(
            fetcher()
                .arg("rewrite")
                .arg(&input)
                .args(["--module", "/x.wasm"]),
            Duration::from_secs(20),
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with(&format!(
                "wasm-fetcher: rewrite: cannot read bootstrap {}: not a regular file ({kind})",
                input.display()
            )),
            "{err}"
        );
    }
}

/// A fresh directory for the odd inputs, apart from the cache.
fn inputs_dir(dir: &Path) -> std::path::PathBuf {
    let d = dir.join("inputs");
    std::fs::create_dir_all(&d).unwrap();
    d
}
