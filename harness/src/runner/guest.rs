//! Building a filter crate's Wasm module from that crate's own tests, so `cargo test` alone
//! checks the filter in the host: the test asks for the module, cargo builds it for
//! `wasm32-wasip1` if it is stale (a no-op otherwise) and says where it is.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target proxy-wasm filters are built for (WASI preview 1, what Envoy's runtimes load).
pub const WASM_TARGET: &str = "wasm32-wasip1";

#[derive(Debug, thiserror::Error)]
pub enum GuestBuildError {
    #[error("cannot run cargo ({cargo}): {source}")]
    Cargo {
        cargo: String,
        source: std::io::Error,
    },
    #[error("the {WASM_TARGET} target is not installed: run `rustup target add {WASM_TARGET}`")]
    NoTarget,
    #[error("cargo build of {manifest} for {WASM_TARGET} failed:\n{stderr}")]
    Failed { manifest: PathBuf, stderr: String },
    #[error("{manifest} built no .wasm: its [lib] needs crate-type = [\"cdylib\"]")]
    NoModule { manifest: PathBuf },
}

/// Builds the library of the crate at `crate_dir` (pass `env!("CARGO_MANIFEST_DIR")`) for
/// `wasm32-wasip1` with cargo profile `profile` (`release`, or a profile of your own) and
/// returns the `.wasm` path. Uses the cargo running the tests (`$CARGO`), and its target
/// directory, so the module is the one `cargo build --target wasm32-wasip1` makes.
pub fn build(crate_dir: impl AsRef<Path>, profile: &str) -> Result<PathBuf, GuestBuildError> {
    let manifest = crate_dir.as_ref().join("Cargo.toml");
    let manifest = std::fs::canonicalize(&manifest).unwrap_or(manifest);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(&cargo)
        .args([
            "build",
            "--lib",
            "--target",
            WASM_TARGET,
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--message-format", "json-render-diagnostics"])
        .output()
        .map_err(|source| GuestBuildError::Cargo {
            cargo: cargo.clone(),
            source,
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        if stderr.contains("target may not be installed")
            || stderr.contains("can't find crate for `core`")
            || stderr.contains("can't find crate for `std`")
        {
            return Err(GuestBuildError::NoTarget);
        }
        return Err(GuestBuildError::Failed {
            manifest,
            stderr: stderr.trim_end().to_string(),
        });
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            // The crate's own artifact, not a dependency's.
            m["manifest_path"]
                .as_str()
                .is_some_and(|p| Path::new(p) == manifest)
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
        })
        .find(|f| f.extension().is_some_and(|e| e == "wasm"))
        .ok_or(GuestBuildError::NoModule { manifest })
}
