//! A real cosign 3 keyless signature from Sigstore's public instance, checked offline against
//! the public trusted root as sigstore-python ships it (in the `.venv` that `make sigstore`
//! installs): the fixture (testdata/sigstore/public-good/) is the bundle kubewarden's release
//! workflow attached to an image in April 2026, with Fulcio's certificate, its SCT, the
//! Rekor v1 entry (SET, inclusion proof, checkpoint) and an RFC 3161 timestamp, which is not
//! read. What the private Sigstore's tests show against our own CA, this shows against the
//! real one: our verdicts and sigstore-python's agree.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use wasm_fetcher::keyless::{Identity, Matcher, TrustedRoot};
use wasm_fetcher::{Digest, Requirement, Sha256};

use crate::private_sigstore::{python, script};

const WORKFLOW: &str =
    "https://github.com/kubewarden/kubewarden-controller/.github/workflows/release.yml@refs/tags/v1.34.0";
const GITHUB: &str = "https://token.actions.githubusercontent.com";
const SIGNED: &str = "c811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172";

fn bundle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/sigstore/public-good/kubewarden-controller-v1.34.0.sigstore.json")
}

/// The public instance's `trusted_root.json` inside the installed sigstore-python.
fn public_root() -> PathBuf {
    let o = Command::new(python())
        .args([
            "-c",
            "import pathlib, sigstore; print(pathlib.Path(sigstore.__file__).parent / '_store' / 'https%3A%2F%2Ftuf-repo-cdn.sigstore.dev' / 'trusted_root.json')",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

fn reference(root: &PathBuf, digest: &str, identity: &str, issuer: &str) -> bool {
    let o = Command::new(python())
        .arg(script("reference_verify.py"))
        .arg("--trusted-root")
        .arg(root)
        .arg("--bundle")
        .arg(bundle())
        .args(["--digest", &format!("sha256:{digest}")])
        .args(["--identity", identity, "--issuer", issuer])
        .output()
        .unwrap();
    match o.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!(
            "reference_verify.py: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
}

#[test]
fn a_real_cosign_3_keyless_bundle_verifies_offline_against_the_public_trusted_root() {
    let root_path = public_root();
    let root = Arc::new(TrustedRoot::from_json(&std::fs::read(&root_path).unwrap()).unwrap());
    let bytes = std::fs::read(bundle()).unwrap();
    let signed = Digest(Sha256::parse(SIGNED).unwrap());
    let other_digest = "ab".repeat(32);
    let exact = |subject: &str, issuer: &str| {
        Requirement::Identity(Identity::new(
            root.clone(),
            Matcher::Exact(subject.into()),
            Matcher::Exact(issuer.into()),
        ))
    };
    let cases = [
        (WORKFLOW, GITHUB, SIGNED, true),
        (
            "https://github.com/kubewarden/policy-server/.github/workflows/release.yml@refs/tags/v1.34.0",
            GITHUB,
            SIGNED,
            false,
        ),
        (WORKFLOW, "https://accounts.google.com", SIGNED, false),
        (WORKFLOW, GITHUB, other_digest.as_str(), false),
    ];
    for (subject, issuer, digest, verifies) in cases {
        let d = Digest(Sha256::parse(digest).unwrap());
        let ours = wasm_fetcher::verify_bundle(&exact(subject, issuer), &d, &bytes);
        assert_eq!(
            ours.is_ok(),
            verifies,
            "{subject} {issuer} {digest}: {ours:?}"
        );
        assert_eq!(
            reference(&root_path, digest, subject, issuer),
            verifies,
            "sigstore-python on {subject} {issuer} {digest}"
        );
    }
    // A pattern for the organisation's release workflows, as a platform team would pin it.
    let pattern = Requirement::Identity(Identity::new(
        root.clone(),
        Matcher::from_pair(
            None,
            Some(r"https://github\.com/kubewarden/[^/]+/\.github/workflows/release\.yml@refs/tags/v.*"),
            ("-", "-"),
        )
        .unwrap(),
        Matcher::Exact(GITHUB.into()),
    ));
    assert!(wasm_fetcher::verify_bundle(&pattern, &signed, &bytes).is_ok());
    // The same bytes with one log-entry field changed no longer verify.
    let text = String::from_utf8(bytes.clone()).unwrap();
    let moved = text.replace(
        "\"integratedTime\": \"1775719409\"",
        "\"integratedTime\": \"1775719410\"",
    );
    assert_ne!(moved, text);
    let e = wasm_fetcher::verify_bundle(&exact(WORKFLOW, GITHUB), &signed, moved.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("signed entry timestamp"), "{e}");
}
