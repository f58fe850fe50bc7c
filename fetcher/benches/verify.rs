//! `make bench` for signature verification: the CPU one pull spends checking a cosign 3
//! bundle, measured in-process over many runs, without the registry requests around it.
//! By key: parse the bundle, decode the envelope, verify ECDSA P-256 over the DSSE
//! pre-authentication encoding, read the statement. Keyless: the same, plus the log entry
//! (SET, inclusion proof, checkpoint, body), the certificate chain to the trusted root, the
//! SCT and the identity policy, with a bundle the tests' private Sigstore makes
//! (testdata/sigstore/private_sigstore.py, in the `.venv` that `make sigstore` sets up).
//! Exits 1 when either median is over 10 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use wasm_fetcher::keyless::{Identity, Matcher, TrustedRoot};
use wasm_fetcher::{Digest, Requirement, SignKey};

const RUNS: usize = 1001;
const TARGET: Duration = Duration::from_millis(10);

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("k.pem");
    let o = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ])
        .arg(&private)
        .output()
        .unwrap();
    assert!(o.status.success());
    let key = SignKey::read(&private).unwrap();
    let public = key.verify_key().unwrap();
    let hex = "5d".repeat(32);
    let digest: Digest = wasm_fetcher::Digest(wasm_fetcher::Sha256::parse(&hex).unwrap());
    let statement = format!(
        r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"digest":{{"sha256":"{hex}"}},"annotations":{{}}}}],"predicateType":"https://sigstore.dev/cosign/sign/v1","predicate":{{}}}}"#
    );
    let payload_type = "application/vnd.in-toto+json";
    let pae = format!(
        "DSSEv1 {} {payload_type} {} {statement}",
        payload_type.len(),
        statement.len()
    );
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let bundle = serde_json::to_vec(&serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": b64(&[0; 32])}},
        "dsseEnvelope": {"payload": b64(statement.as_bytes()), "payloadType": payload_type,
                         "signatures": [{"sig": key.sign(pae.as_bytes())}]},
    }))
    .unwrap();
    let by_key = measure(
        "bundle verification by key (DSSE, P-256)",
        &Requirement::Key(public),
        &digest,
        &bundle,
    );
    let (identity, keyless) = keyless_bundle(dir.path(), &hex);
    let keyless = measure(
        "keyless bundle verification (DSSE, chain, SCT, SET, inclusion proof, identity)",
        &Requirement::Identity(identity),
        &digest,
        &keyless,
    );
    if by_key >= TARGET || keyless >= TARGET {
        eprintln!("verify: target missed");
        std::process::exit(1);
    }
}

/// The median of `RUNS` verifications, printed with the p99.
fn measure(what: &str, requirement: &Requirement, digest: &Digest, bundle: &[u8]) -> Duration {
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        let verified = wasm_fetcher::verify_bundle(requirement, digest, bundle);
        times.push(start.elapsed());
        assert!(verified.is_ok(), "{verified:?}");
    }
    times.sort();
    let median = times[RUNS / 2];
    println!(
        "{what}, in-process, {RUNS} runs: median {:.3} ms, p99 {:.3} ms (target < {} ms)",
        median.as_secs_f64() * 1e3,
        times[RUNS * 99 / 100].as_secs_f64() * 1e3,
        TARGET.as_millis()
    );
    median
}

/// A keyless DSSE bundle for `hex` from a fresh private Sigstore, and the policy it meets.
fn keyless_bundle(dir: &Path, hex: &str) -> (Identity, Vec<u8>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = std::env::var_os("SIGSTORE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python3"));
    let script = root.join("testdata/sigstore/private_sigstore.py");
    let sigstore = dir.join("sigstore");
    let out = dir.join("keyless.json");
    let (subject, issuer) = ("bench@example.com", "https://issuer.example");
    for args in [
        vec!["init".into(), sigstore.display().to_string()],
        vec![
            "sign".into(),
            sigstore.display().to_string(),
            "--digest".into(),
            format!("sha256:{hex}"),
            "--format".into(),
            "dsse".into(),
            "--identity".into(),
            subject.into(),
            "--issuer".into(),
            issuer.into(),
            "--out".into(),
            out.display().to_string(),
        ],
    ] {
        let o = Command::new(&python)
            .arg(&script)
            .args(&args)
            .output()
            .expect("the private Sigstore's python (`make sigstore`)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let trusted =
        TrustedRoot::from_json(&std::fs::read(sigstore.join("trusted_root.json")).unwrap())
            .unwrap();
    let identity = Identity::new(
        Arc::new(trusted),
        Matcher::Exact(subject.into()),
        Matcher::Exact(issuer.into()),
    );
    (identity, std::fs::read(out).unwrap())
}
