//! The keyless tests' private Sigstore (testdata/sigstore/private_sigstore.py) and their
//! referee, sigstore-python (testdata/sigstore/reference_verify.py), both run by the
//! interpreter of `.venv` that `make sigstore` installs them into.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::support::stderr;

/// The identity and OIDC issuer every signature is made for.
pub(crate) const IDENTITY: &str = "signer@example.com";
pub(crate) const ISSUER: &str = "https://issuer.example";

/// sigstore-python's interpreter, where `make sigstore` installs it (`SIGSTORE_PYTHON`).
pub(crate) fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = std::env::var_os("SIGSTORE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python3"));
    assert!(
        python.exists(),
        "{} missing: `make sigstore` installs sigstore-python there",
        python.display()
    );
    python
}

pub(crate) fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/sigstore")
        .join(name)
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", stderr(&o));
    o
}

/// The private Sigstore in a temporary directory: its trusted root, keys and signatures.
pub(crate) struct PrivateSigstore {
    dir: tempfile::TempDir,
}

impl PrivateSigstore {
    pub(crate) fn init() -> Self {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new(python())
            .arg(script("private_sigstore.py"))
            .arg("init")
            .arg(dir.path()));
        Self { dir }
    }

    pub(crate) fn trusted_root(&self) -> PathBuf {
        self.dir.path().join("trusted_root.json")
    }

    /// Every format and case signed for `digest` at once: `<format>-<case>.json` in the
    /// returned directory.
    pub(crate) fn sign_all(&self, digest: &str, reference: &str) -> PathBuf {
        let out = self.dir.path().join("signed");
        run(Command::new(python())
            .arg(script("private_sigstore.py"))
            .arg("sign-all")
            .arg(self.dir.path())
            .args([
                "--digest",
                digest,
                "--identity",
                IDENTITY,
                "--issuer",
                ISSUER,
            ])
            .args(["--reference", reference, "--out"])
            .arg(&out));
        out
    }

    /// sigstore-python's verdicts on `(signature file, identity, issuer)` for `digest`, in
    /// one run: verified, or its reason.
    pub(crate) fn reference(
        &self,
        digest: &str,
        checks: &[(PathBuf, &str, &str)],
    ) -> Vec<Result<(), String>> {
        let cases: Vec<Value> = checks
            .iter()
            .map(|(file, identity, issuer)| {
                let legacy = file.file_name().unwrap().to_str().unwrap().starts_with("legacy-");
                json!({"bundle": file, "digest": digest, "identity": identity, "issuer": issuer, "legacy": legacy})
            })
            .collect();
        let batch = self.dir.path().join("reference-cases.json");
        std::fs::write(&batch, serde_json::to_vec(&cases).unwrap()).unwrap();
        let o = run(Command::new(python())
            .arg(script("reference_verify.py"))
            .arg("--trusted-root")
            .arg(self.trusted_root())
            .arg("--batch")
            .arg(&batch));
        let verdicts: Vec<Result<(), String>> = String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                match v["verified"].as_bool().unwrap() {
                    true => Ok(()),
                    false => Err(v["reason"].as_str().unwrap_or_default().to_string()),
                }
            })
            .collect();
        assert_eq!(verdicts.len(), checks.len());
        verdicts
    }
}
