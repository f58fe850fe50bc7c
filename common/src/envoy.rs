//! The real Envoy the test suites run and compare with: `$ENVOY_BIN`, else the workspace's
//! `.venv/bin/envoy` (`make envoy`). It is checked once per test binary by running
//! `envoy --version`, so a missing, unrunnable or wrong-version binary fails with one clear
//! message instead of a confusing failure deep in a test.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The Envoy release the configurations and comparisons are written for.
pub const VERSION: &str = "1.40.";

/// The workspace root (the directory holding `Cargo.lock`).
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// The path of a runnable Envoy 1.40; panics, saying how to get one, if there is none.
// Test support only (the `test-support` feature): a test without Envoy fails here, once, with
// the way to get one, which is what a panic in a test is for.
#[allow(clippy::panic)]
pub fn envoy() -> PathBuf {
    static CHECKED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match CHECKED.get_or_init(|| {
        let path = std::env::var_os("ENVOY_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(".venv/bin/envoy"));
        check(&path).map(|()| path)
    }) {
        Ok(path) => path.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn check(path: &Path) -> Result<(), String> {
    let how = "run `make envoy` (or set ENVOY_BIN to an Envoy 1.40 binary)";
    let out = std::process::Command::new(path)
        .arg("--version")
        .output()
        .map_err(|e| format!("envoy not runnable at {}: {e}; {how}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`
    let version = text
        .split("version:")
        .nth(1)
        .and_then(|v| v.trim().split('/').nth(1))
        .unwrap_or_default();
    if !out.status.success() || !version.starts_with(VERSION) {
        return Err(format!(
            "{} is not Envoy {VERSION}x (it says {:?}); {how}",
            path.display(),
            text.trim()
        ));
    }
    Ok(())
}
