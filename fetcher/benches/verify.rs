//! `make bench` for signature verification: the CPU one pull spends checking a cosign 3
//! bundle by key (parse the bundle, decode the envelope, verify ECDSA P-256 over the DSSE
//! pre-authentication encoding, read the statement), measured in-process over many runs,
//! without the registry requests around it. Exits 1 when the median is over 10 ms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use base64::Engine;
use wasm_fetcher::{Digest, SignKey};

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
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        let verified = wasm_fetcher::verify_bundle(&public, &digest, &bundle);
        times.push(start.elapsed());
        assert!(verified.is_ok(), "{verified:?}");
    }
    times.sort();
    let median = times[RUNS / 2];
    println!(
        "bundle verification by key (DSSE, P-256), in-process, {RUNS} runs: median {:.3} ms, p99 {:.3} ms (target < {} ms)",
        median.as_secs_f64() * 1e3,
        times[RUNS * 99 / 100].as_secs_f64() * 1e3,
        TARGET.as_millis()
    );
    if median >= TARGET {
        eprintln!("verify: target missed");
        std::process::exit(1);
    }
}
