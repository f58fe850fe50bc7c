//! Cosign signatures against a real `docker-registry`: what `push --sign-key` writes verifies,
//! so does a signature made by `openssl` and pushed through the registry's HTTP API, and every
//! bad signature refuses the module with its own words and leaves the cache empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::oci_registry::Registry;
use crate::support::*;

const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const ANNOTATION: &str = "dev.cosignproject.cosign/signature";

fn openssl(args: &[&str]) -> Vec<u8> {
    let o = Command::new("openssl").args(args).output().unwrap();
    assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
    o.stdout
}

/// A P-256 key pair made by `openssl`: (private PKCS#8 PEM, public SPKI PEM).
pub fn key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub"));
    let (p, q) = (private.to_str().unwrap(), public.to_str().unwrap());
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        p,
    ]);
    openssl(&["pkey", "-in", p, "-pubout", "-out", q]);
    (private, public)
}

/// cosign's simple-signing payload naming `digest`.
fn payload(repo: &str, digest: &str) -> Vec<u8> {
    format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{repo}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    )
    .into_bytes()
}

/// `openssl dgst -sha256 -sign`: the DER signature of `payload`, in base64.
fn openssl_sign(dir: &Path, key: &Path, payload: &[u8]) -> String {
    let file = dir.join("payload.json");
    std::fs::write(&file, payload).unwrap();
    let der = openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        key.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    base64::engine::general_purpose::STANDARD.encode(der)
}

/// Pushes through the registry's HTTP API (oci-client, not this fetcher) a manifest under
/// `repo:tag` whose layers are `(media type, bytes, annotations)`.
fn push_raw(reg: &Registry, repo_tag: &str, layers: Vec<(&str, Vec<u8>, Option<&str>)>) {
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let reference: Reference = format!("{}/{repo_tag}", reg.host).parse().unwrap();
    let layers: Vec<ImageLayer> = layers
        .into_iter()
        .map(|(t, data, signature)| {
            let annotations =
                signature.map(|s| BTreeMap::from([(ANNOTATION.to_string(), s.to_string())]));
            ImageLayer::new(data, t.to_string(), annotations)
        })
        .collect();
    let config = Config::new(
        b"{}".to_vec(),
        "application/vnd.oci.image.config.v1+json".into(),
        None,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client.push(&reference, &layers, config, &RegistryAuth::Anonymous, None))
        .unwrap();
}

/// A module pushed under `repo:1`, unsigned; its manifest digest.
fn push_module(reg: &Registry, repo: &str) -> String {
    reg.push(
        &format!("{repo}:1"),
        vec![("application/wasm", module(repo))],
        "application/vnd.wasm.config.v1+json",
        &RegistryAuth::Anonymous,
    )
}

/// Signs `digest` in `repo` with one signature layer of this payload and annotation.
fn push_signature(reg: &Registry, repo: &str, digest: &str, payload: Vec<u8>, signature: &str) {
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    push_raw(
        reg,
        &format!("{repo}:{tag}"),
        vec![(SIMPLE_SIGNING, payload, Some(signature))],
    );
}

#[test]
fn signed_by_push_or_by_openssl_verifies_and_every_bad_signature_refuses() {
    let reg = Registry::start(false);
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(keys.path(), "signer");
    let (other_private, other_public) = key_pair(keys.path(), "other");
    let public = public.to_str().unwrap();

    // push --sign-key, then pull --verify-key (and WASM_VERIFY_KEY) take it.
    let filter = crate::push::filter_wasm();
    let pushed_url = format!("oci://{}/signed/by-push:1", reg.host);
    let o = fetcher()
        .env("HOME", keys.path())
        .args(["push", filter.to_str().unwrap(), &pushed_url, "--json"])
        .arg("--sign-key")
        .arg(&private)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cache = tempfile::tempdir().unwrap();
    let o = pull(cache.path(), &[&pushed_url, "--verify-key", public]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(stdout_path(&o)).unwrap(),
        std::fs::read(&filter).unwrap()
    );
    let o = pull_env(
        cache.path(),
        &[("WASM_VERIFY_KEY", public)],
        &[&pushed_url, "--json"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["from_cache"], true,
        "an unchanged, verified image is not downloaded again"
    );
    // Signed again by another key: both signatures stand, each verifies.
    let o = fetcher()
        .env("HOME", keys.path())
        .args(["push", filter.to_str().unwrap(), &pushed_url])
        .arg("--sign-key")
        .arg(&other_private)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for key in [public, other_public.to_str().unwrap()] {
        let o = pull(
            tempfile::tempdir().unwrap().path(),
            &[&pushed_url, "--verify-key", key],
        );
        assert_eq!(o.status.code(), Some(0), "{key}: {}", stderr(&o));
    }

    // A signature made by openssl, pushed by another client, verifies.
    let repo = "signed/by-openssl";
    let digest = push_module(&reg, repo);
    let signed = payload(&format!("{}/{repo}", reg.host), &digest);
    let signature = openssl_sign(keys.path(), &private, &signed);
    push_signature(&reg, repo, &digest, signed, &signature);
    let url = format!("oci://{}/{repo}:1", reg.host);
    let o = pull(
        tempfile::tempdir().unwrap().path(),
        &[&url, "--verify-key", public],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // Each bad signature: refused with its own words, nothing cached.
    let sign = |payload: &[u8]| openssl_sign(keys.path(), &private, payload);
    let other_sign = |payload: &[u8]| openssl_sign(keys.path(), &other_private, payload);
    type Case<'a> = (
        &'a str,
        &'a str,
        Box<dyn Fn(&str, &str) -> (Vec<u8>, String) + 'a>,
    );
    let cases: Vec<Case> = vec![
        (
            "tampered",
            "signature wrong",
            Box::new(|repo, digest| {
                let p = payload(repo, digest);
                let s = sign(&p);
                let mut tampered = p.clone();
                tampered.extend_from_slice(b" ");
                (tampered, s)
            }),
        ),
        (
            "other-key",
            "signature wrong",
            Box::new(|repo, digest| {
                let p = payload(repo, digest);
                let s = other_sign(&p);
                (p, s)
            }),
        ),
        (
            "other-digest",
            "signature for another image",
            Box::new(|repo, _| {
                let p = payload(repo, &format!("sha256:{}", "ab".repeat(32)));
                let s = sign(&p);
                (p, s)
            }),
        ),
        (
            "not-base64",
            "signature malformed",
            Box::new(|repo, digest| (payload(repo, digest), "%%% not base64 %%%".into())),
        ),
        (
            "not-der",
            "signature malformed",
            Box::new(|repo, digest| (payload(repo, digest), "AAECAwQFBgc=".into())),
        ),
        (
            "oversized",
            "signature oversized",
            Box::new(|repo, digest| {
                let mut p = payload(repo, digest);
                p.extend(std::iter::repeat_n(b' ', 70 << 10));
                let s = sign(&p);
                (p, s)
            }),
        ),
    ];
    for (name, words, make) in &cases {
        let repo = format!("bad/{name}");
        let digest = push_module(&reg, &repo);
        let (p, s) = make(&format!("{}/{repo}", reg.host), &digest);
        push_signature(&reg, &repo, &digest, p, &s);
        let url = format!("oci://{}/{repo}:1", reg.host);
        let cache = tempfile::tempdir().unwrap();
        let o = pull(cache.path(), &[&url, "--verify-key", public]);
        assert_failed(&o, cache.path(), &url, words);
    }

    // Unsigned: missing. Without a verify key the same module pulls.
    let digest = push_module(&reg, "bad/unsigned");
    let url = format!("oci://{}/bad/unsigned:1", reg.host);
    let cache = tempfile::tempdir().unwrap();
    let o = pull(cache.path(), &[&url, "--verify-key", public]);
    assert_failed(&o, cache.path(), &url, "signature missing");
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    assert!(stderr(&o).contains(&tag), "{}", stderr(&o));
    let o = pull(cache.path(), &[&url]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn a_verify_key_refuses_what_carries_no_signature_location_and_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(dir.path(), "k");
    let module_path = dir.path().join("m.wasm");
    std::fs::write(&module_path, module("plain")).unwrap();
    let url = format!("file://{}", module_path.display());
    let cache = tempfile::tempdir().unwrap();
    let o = pull(
        cache.path(),
        &[&url, "--verify-key", public.to_str().unwrap()],
    );
    assert_failed(&o, cache.path(), &url, "signature cannot be checked");
    let o = pull(
        cache.path(),
        &[
            "oci://127.0.0.1:1/a:1",
            "--verify-key",
            public.to_str().unwrap(),
            "--pull-policy",
            "Never",
        ],
    );
    assert_failed(
        &o,
        cache.path(),
        "oci://127.0.0.1:1/a:1",
        "pull policy Never",
    );
    // A private key where a public one belongs is refused before anything is fetched.
    let o = pull(
        cache.path(),
        &[&url, "--verify-key", private.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("PUBLIC KEY"), "{}", stderr(&o));
    assert!(files_under(cache.path()).is_empty());
}
