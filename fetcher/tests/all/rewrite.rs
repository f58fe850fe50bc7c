//! `rewrite`: the shipped bootstrap pointed at a cached module, and nothing else changed.

use crate::support::*;

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn rewrites_the_shipped_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b.yaml");
    let o = fetcher()
        .arg("rewrite")
        .arg(workspace().join("envoy-config/bootstrap.yaml"))
        .args(["--module", "/cache/modules/sha256/abc.wasm", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("filename: /cache/modules/sha256/abc.wasm"),
        "{text}"
    );
    assert!(!text.contains("wasm_filter.wasm"), "{text}");
    assert!(
        text.contains("x-added-by"),
        "the plugin configuration is kept: {text}"
    );
}

#[test]
fn a_config_without_wasm_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("plain.yaml");
    std::fs::write(&input, "static_resources: {listeners: []}\n").unwrap();
    let o = fetcher()
        .arg("rewrite")
        .arg(&input)
        .args(["--module", "/x.wasm"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no Wasm plugin"), "{}", stderr(&o));
}

/// `--module` naming a FIFO (or a directory): refused at once, never a hang waiting for a
/// writer.
#[test]
fn a_module_that_is_not_a_regular_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("libfilter.so");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for (module, words) in [
        (&fifo, "a FIFO"),
        (&dir.path().to_path_buf(), "a directory"),
    ] {
        let (o, _) = run_within(
            fetcher()
                .arg("rewrite")
                .arg(workspace().join("envoy-config/bootstrap.yaml"))
                .arg("--module")
                .arg(module),
            std::time::Duration::from_secs(10),
        );
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(words), "{}", stderr(&o));
    }
}
