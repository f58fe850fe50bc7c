//! Cosign 3's storage, verified by key against a real `docker-registry`: Sigstore bundles
//! (DSSE and message signature) and legacy simple-signing manifests, attached as OCI 1.1
//! referrers and found through the referrers API (a front that serves it, see
//! `referrers_front`) or the fallback tag `sha256-<hex>`, and the `.sig` tag. Every bundle and
//! signature here is made by the test, with `openssl` and JSON written here, not by the
//! fetcher; each case's verdict is also reached by a reference check (`openssl dgst -verify`
//! over the same signed bytes, the subject read from the same statement), and the two agree.

use std::path::Path;
use std::process::Command;

use base64::Engine;
use serde_json::{json, Value};

use crate::attach::{get_manifest, Attach, Store, BUNDLE, EMPTY, LEGACY_TYPE, SIMPLE_SIGNING};
use crate::oci_registry::Registry;
use crate::referrers_front::Front;
use crate::signature::{key_pair, openssl};
use crate::support::*;

const IN_TOTO: &str = "application/vnd.in-toto+json";
const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `openssl dgst -sha256 -sign`: the DER ECDSA signature of `bytes`.
fn sign(dir: &Path, key: &Path, bytes: &[u8]) -> Vec<u8> {
    let file = dir.join("to-sign");
    std::fs::write(&file, bytes).unwrap();
    openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        key.to_str().unwrap(),
        file.to_str().unwrap(),
    ])
}

/// The reference check of one signature: `openssl dgst -sha256 -verify`.
fn openssl_verifies(dir: &Path, public: &Path, bytes: &[u8], signature: &[u8]) -> bool {
    let (file, sig) = (dir.join("to-verify"), dir.join("sig"));
    std::fs::write(&file, bytes).unwrap();
    std::fs::write(&sig, signature).unwrap();
    Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-verify",
            public.to_str().unwrap(),
            "-signature",
        ])
        .args([&sig, &file])
        .output()
        .unwrap()
        .status
        .success()
}

/// DSSE's pre-authentication encoding, from the DSSE protocol text.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The statement `cosign sign` (3.0.5 and later) signs for an image.
fn statement(hex: &str, predicate_type: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"digest": {"sha256": hex}, "annotations": {}}],
        "predicateType": predicate_type,
        "predicate": {},
    }))
    .unwrap()
}

/// The bundle `cosign sign --key` writes: a DSSE envelope, the key named by its hint only.
fn dsse_bundle(
    envelope_payload: &[u8],
    payload_type: &str,
    signature: &[u8],
    material: Value,
) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "mediaType": BUNDLE,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": b64(envelope_payload),
            "payloadType": payload_type,
            "signatures": [{"sig": b64(signature)}],
        },
    }))
    .unwrap()
}

fn key_material() -> Value {
    json!({"publicKey": {"hint": "aGludA=="}})
}

/// A message-signature bundle over the image manifest's bytes.
fn message_bundle(manifest_sha256: &[u8], signature: &[u8]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "mediaType": BUNDLE,
        "verificationMaterial": key_material(),
        "messageSignature": {
            "messageDigest": {"algorithm": "SHA2_256", "digest": b64(manifest_sha256)},
            "signature": b64(signature),
        },
    }))
    .unwrap()
}

/// What the fetcher says about pulling `repo:1` from `host` with `public`: the JSON on
/// success, the error line otherwise.
fn ours(host: &str, repo: &str, public: &Path) -> Result<Value, String> {
    let url = format!("oci://{host}/{repo}:1");
    let cache = tempfile::tempdir().unwrap();
    let o = pull(
        cache.path(),
        &[&url, "--verify-key", public.to_str().unwrap(), "--json"],
    );
    match o.status.code() {
        Some(0) => Ok(serde_json::from_slice(&o.stdout).unwrap()),
        _ => {
            assert_failed(&o, cache.path(), &url, "signature");
            Err(stderr(&o))
        }
    }
}

#[test]
fn cosign_3_bundles_and_legacy_signatures_verify_by_key_in_every_storage() {
    let reg = Registry::start(false);
    let front = Front::start(&reg.host);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (private, public) = key_pair(d, "signer");
    let (other_private, _) = key_pair(d, "other");

    // A case: the repository's signature made by `make`, stored as `store`; whether the
    // fetcher and the reference take it, and the words of the fetcher's refusal.
    type Make<'a> = Box<dyn Fn(&str, &[u8]) -> (Vec<u8>, bool) + 'a>;
    let dsse = |key: &Path,
                payload_type: &'static str,
                predicate: &'static str,
                tamper: bool,
                other_digest: bool|
     -> Make {
        let key = key.to_path_buf();
        let public = public.clone();
        Box::new(move |digest: &str, _manifest: &[u8]| {
            let hex = if other_digest {
                "ab".repeat(32)
            } else {
                digest.trim_start_matches("sha256:").to_string()
            };
            let st = statement(&hex, predicate);
            let sig = sign(d, &key, &pae(payload_type, &st));
            let mut sent = st.clone();
            if tamper {
                sent = statement(&"cd".repeat(32), predicate);
            }
            // The reference: the signature over the PAE of what is sent, then the statement.
            let signed = openssl_verifies(d, &public, &pae(payload_type, &sent), &sig);
            let doc: Value = serde_json::from_slice(&sent).unwrap();
            let names =
                doc["subject"][0]["digest"]["sha256"] == digest.trim_start_matches("sha256:");
            let reference = signed
                && names
                && payload_type == IN_TOTO
                && doc["predicateType"] == SIGN_PREDICATE;
            (
                dsse_bundle(&sent, payload_type, &sig, key_material()),
                reference,
            )
        })
    };
    let message: Make = Box::new(|_digest: &str, manifest: &[u8]| {
        let sig = sign(d, &private, manifest);
        let reference = openssl_verifies(d, &public, manifest, &sig);
        let sha = hex::decode(sha256_hex(manifest)).unwrap();
        (message_bundle(&sha, &sig), reference)
    });
    let keyless: Make = Box::new(|digest: &str, _| {
        let st = statement(digest.trim_start_matches("sha256:"), SIGN_PREDICATE);
        let sig = sign(d, &private, &pae(IN_TOTO, &st));
        // Signed by the key, but the bundle says a certificate vouches for it: cosign
        // verify --key refuses a certificate bundle, and so does the reference.
        (
            dsse_bundle(
                &st,
                IN_TOTO,
                &sig,
                json!({"certificate": {"rawBytes": "MAA="}}),
            ),
            false,
        )
    });

    struct Case<'a> {
        name: &'a str,
        make: Make<'a>,
        listed_type: &'a str,
        manifest_type: &'a str,
        words: &'a str,
        format: &'a str,
    }
    let cases = vec![
        Case {
            name: "dsse",
            make: dsse(&private, IN_TOTO, SIGN_PREDICATE, false, false),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "",
            format: "dsse-bundle",
        },
        Case {
            name: "dsse-empty-listed",
            make: dsse(&private, IN_TOTO, SIGN_PREDICATE, false, false),
            listed_type: EMPTY,
            manifest_type: BUNDLE,
            words: "",
            format: "dsse-bundle",
        },
        Case {
            name: "message",
            make: message,
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "",
            format: "message-bundle",
        },
        Case {
            name: "other-key",
            make: dsse(&other_private, IN_TOTO, SIGN_PREDICATE, false, false),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "signature wrong",
            format: "",
        },
        Case {
            name: "tampered",
            make: dsse(&private, IN_TOTO, SIGN_PREDICATE, true, false),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "signature wrong",
            format: "",
        },
        Case {
            name: "other-digest",
            make: dsse(&private, IN_TOTO, SIGN_PREDICATE, false, true),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "signature for another image",
            format: "",
        },
        Case {
            name: "attestation",
            make: dsse(
                &private,
                IN_TOTO,
                "https://slsa.dev/provenance/v1",
                false,
                false,
            ),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "predicateType",
            format: "",
        },
        Case {
            name: "payload-type",
            make: dsse(&private, "text/plain", SIGN_PREDICATE, false, false),
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "payloadType",
            format: "",
        },
        Case {
            name: "keyless-material",
            make: keyless,
            listed_type: BUNDLE,
            manifest_type: BUNDLE,
            words: "certificate",
            format: "",
        },
        Case {
            name: "lying-type",
            make: dsse(&private, IN_TOTO, SIGN_PREDICATE, false, false),
            listed_type: BUNDLE,
            manifest_type: LEGACY_TYPE,
            words: "signature malformed",
            format: "",
        },
    ];
    for case in &cases {
        for store in [Store::Api, Store::Tag] {
            let repo: &'static str = Box::leak(
                format!("bundle/{}-{store:?}", case.name)
                    .to_lowercase()
                    .into_boxed_str(),
            );
            let host = if store == Store::Api {
                front.host.as_str()
            } else {
                reg.host.as_str()
            };
            let digest = reg.push_module(
                &format!("{repo}:1"),
                &module(repo),
                &oci_client::secrets::RegistryAuth::Anonymous,
            );
            let manifest = get_manifest(&reg.host, repo, &digest);
            let (blob, signed) = (case.make)(&digest, &manifest);
            // A referrer is a bundle only when its manifest says so: one listed as a bundle
            // whose manifest is a legacy signature's holds no signature either way.
            let reference = signed && case.manifest_type == BUNDLE;
            let subject: &'static str = Box::leak(digest.clone().into_boxed_str());
            Attach {
                host,
                repo,
                subject,
                manifest_type: case.manifest_type,
                listed_type: case.listed_type,
                layer_type: BUNDLE,
                annotations: Value::Null,
            }
            .push(store, &blob);
            let verdict = ours(host, repo, &public);
            let label = format!("{} via {store:?}", case.name);
            assert_eq!(
                verdict.is_ok(),
                reference,
                "{label}: ours {verdict:?}, the reference {reference}"
            );
            match verdict {
                Ok(v) => {
                    let signer = &v["signature"]["signers"][0];
                    assert_eq!(signer["format"], case.format, "{label}: {v}");
                    let storage = if store == Store::Api {
                        "referrers-api"
                    } else {
                        "referrers-tag"
                    };
                    assert_eq!(signer["storage"], storage, "{label}: {v}");
                    assert_eq!(v["signature"]["digest"], digest.as_str());
                }
                Err(e) => assert!(e.contains(case.words), "{label}: {e}"),
            }
        }
    }

    // Legacy simple-signing stored as a referrer (cosign 3 with --new-bundle-format=false
    // --registry-referrers-mode=oci-1-1), in either listing, and under the .sig tag.
    for store in [Store::Api, Store::Tag] {
        let repo: &'static str = Box::leak(
            format!("legacy/referrer-{store:?}")
                .to_lowercase()
                .into_boxed_str(),
        );
        let host = if store == Store::Api {
            front.host.as_str()
        } else {
            reg.host.as_str()
        };
        let digest = reg.push_module(
            &format!("{repo}:1"),
            &module(repo),
            &oci_client::secrets::RegistryAuth::Anonymous,
        );
        let payload = crate::signature::payload(&format!("{}/{repo}", reg.host), &digest);
        let sig = sign(d, &private, &payload);
        assert!(openssl_verifies(d, &public, &payload, &sig));
        let subject: &'static str = Box::leak(digest.clone().into_boxed_str());
        Attach {
            host,
            repo,
            subject,
            manifest_type: LEGACY_TYPE,
            listed_type: LEGACY_TYPE,
            layer_type: SIMPLE_SIGNING,
            annotations: json!({"dev.cosignproject.cosign/signature": b64(&sig)}),
        }
        .push(store, &payload);
        let v = ours(host, repo, &public).unwrap();
        assert_eq!(
            v["signature"]["signers"][0]["format"], "simple-signing",
            "{v}"
        );
        let storage = if store == Store::Api {
            "referrers-api"
        } else {
            "referrers-tag"
        };
        assert_eq!(v["signature"]["signers"][0]["storage"], storage, "{v}");
    }
}

#[test]
fn push_writes_a_cosign_3_bundle_by_default_and_the_legacy_format_on_request() {
    let reg = Registry::start(false);
    let front = Front::start(&reg.host);
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(keys.path(), "signer");
    let filter = crate::push::filter_wasm();
    for (host, format, storage) in [
        (&reg.host, None, "referrers-tag"),
        (&front.host, None, "referrers-api"),
        (&reg.host, Some("simple-signing"), "signature-tag"),
    ] {
        let url = format!("oci://{host}/pushed/{}:1", storage);
        let mut push = fetcher();
        push.env("HOME", keys.path())
            .args(["push", filter.to_str().unwrap(), &url, "--sign-key"])
            .arg(&private);
        if let Some(f) = format {
            push.args(["--sign-format", f]);
        }
        let o = push.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        front.clear();
        let cache = tempfile::tempdir().unwrap();
        let o = pull(
            cache.path(),
            &[&url, "--verify-key", public.to_str().unwrap(), "--json"],
        );
        assert_eq!(o.status.code(), Some(0), "{url}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let signer = &v["signature"]["signers"][0];
        assert_eq!(signer["storage"], storage, "{v}");
        let expected = if format.is_some() {
            "simple-signing"
        } else {
            "dsse-bundle"
        };
        assert_eq!(signer["format"], expected, "{v}");
        if host == &front.host {
            // The image's manifest and blob, then the listing, the referrer and its bundle.
            let seen = front.requests("GET /v2/pushed/");
            let signature_reads = seen
                .iter()
                .filter(|l| l.contains("/referrers/") || l.contains("sha256-"))
                .count();
            assert_eq!(signature_reads, 1, "{seen:#?}");
            // Warm: the index remembers what verified the module with this key, and nothing
            // is asked of the registry.
            front.clear();
            let o = pull(
                cache.path(),
                &[&url, "--verify-key", public.to_str().unwrap(), "--json"],
            );
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let warm: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(warm["from_cache"], true);
            assert_eq!(warm["signature"], v["signature"]);
            assert_eq!(front.requests(""), Vec::<String>::new());
            // Another key is not answered from that memory: the registry says no.
            let (_, other) = key_pair(keys.path(), "other");
            let o = pull(
                cache.path(),
                &[&url, "--verify-key", other.to_str().unwrap()],
            );
            assert_eq!(o.status.code(), Some(1));
            assert!(stderr(&o).contains("signature wrong"), "{}", stderr(&o));
            assert!(!front.requests("GET /v2/pushed/").is_empty());
        }
    }
}

/// The index remembers which image verified, not which bytes: the same module in an unsigned
/// image is refused with the key even when the signed one is cached.
#[test]
fn a_remembered_signature_covers_its_image_not_the_same_bytes_elsewhere() {
    let reg = Registry::start(false);
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(keys.path(), "signer");
    let filter = crate::push::filter_wasm();
    let bytes = std::fs::read(&filter).unwrap();
    let anonymous = oci_client::secrets::RegistryAuth::Anonymous;
    reg.push_module("same/unsigned:1", &bytes, &anonymous);
    let (signed, unsigned) = (
        format!("oci://{}/same/signed:1", reg.host),
        format!("oci://{}/same/unsigned:1", reg.host),
    );
    let cache = tempfile::tempdir().unwrap();
    let o = pull(cache.path(), &[&unsigned]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = fetcher()
        .env("HOME", keys.path())
        .args(["push", filter.to_str().unwrap(), &signed, "--sign-key"])
        .arg(&private)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let key = public.to_str().unwrap();
    let o = pull(cache.path(), &[&signed, "--verify-key", key]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = pull(cache.path(), &[&unsigned, "--verify-key", key]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("signature missing"), "{}", stderr(&o));
}
