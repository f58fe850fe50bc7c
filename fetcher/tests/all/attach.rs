//! Signatures attached to an image in a real `docker-registry` the way cosign stores them,
//! through the distribution API spoken here (not by the fetcher): a referrer manifest whose
//! `subject` is the image, listed by the referrers API (pushed through `referrers_front`) or
//! in the fallback tag's index `sha256-<hex>`; or a legacy manifest under `sha256-<hex>.sig`.

use serde_json::{json, Value};

use crate::support::sha256_hex;

pub(crate) const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const EMPTY: &str = "application/vnd.oci.empty.v1+json";
pub(crate) const LEGACY_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
pub(crate) const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// One HTTP/1.1 request on its own connection: (status, head, body).
pub(crate) fn http(
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).unwrap();
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, answer[split + 4..].to_vec())
}

/// A blob pushed through the distribution API (POST, then PUT with its digest).
pub(crate) fn put_blob(host: &str, repo: &str, bytes: &[u8]) -> String {
    let digest = format!("sha256:{}", sha256_hex(bytes));
    let (status, head, _) = http(
        host,
        "POST",
        &format!("/v2/{repo}/blobs/uploads/"),
        &[],
        b"",
    );
    assert_eq!(status, 202, "{head}");
    let location = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or_else(|| l.strip_prefix("location: "))
        })
        .unwrap()
        .trim()
        .to_string();
    let path = location
        .split_once("://")
        .map_or(location.clone(), |(_, rest)| {
            rest[rest.find('/').unwrap()..].to_string()
        });
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, head, _) = http(
        host,
        "PUT",
        &format!("{path}{sep}digest={digest}"),
        &[("Content-Type", "application/octet-stream")],
        bytes,
    );
    assert_eq!(status, 201, "{head}");
    digest
}

pub(crate) fn put_manifest(
    host: &str,
    repo: &str,
    reference: &str,
    media_type: &str,
    bytes: &[u8],
) {
    let (status, head, body) = http(
        host,
        "PUT",
        &format!("/v2/{repo}/manifests/{reference}"),
        &[("Content-Type", media_type)],
        bytes,
    );
    assert_eq!(status, 201, "{head} {}", String::from_utf8_lossy(&body));
}

pub(crate) fn get_manifest(host: &str, repo: &str, reference: &str) -> Vec<u8> {
    let (status, _, body) = http(
        host,
        "GET",
        &format!("/v2/{repo}/manifests/{reference}"),
        &[("Accept", &format!("{MANIFEST},{INDEX}"))],
        b"",
    );
    assert_eq!(status, 200);
    body
}

/// Where a signature is stored.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Store {
    /// A referrer listed by the referrers API (the front).
    Api,
    /// A referrer listed in the fallback tag's index, written here.
    Tag,
    /// The legacy manifest under `sha256-<hex>.sig` (no subject, no listing).
    SigTag,
}

impl Store {
    /// What `pull --json` calls this storage.
    pub(crate) fn storage(self) -> &'static str {
        match self {
            Store::Api => "referrers-api",
            Store::Tag => "referrers-tag",
            Store::SigTag => "signature-tag",
        }
    }
}

/// Attaches `blob` (a bundle, or a simple-signing payload with its annotations) to `subject`
/// as cosign does: its manifest, then the listing.
pub(crate) struct Attach<'a> {
    pub host: &'a str,
    pub repo: &'a str,
    pub subject: &'a str,
    /// The artifact type the referrer's own manifest says.
    pub manifest_type: &'a str,
    /// The artifact type the fallback index lists (a listing may lie).
    pub listed_type: &'a str,
    pub layer_type: &'a str,
    /// The layer's annotations (legacy signatures carry theirs there), or `Value::Null`.
    pub annotations: Value,
}

impl Attach<'_> {
    pub(crate) fn push(&self, store: Store, blob: &[u8]) {
        let subject_bytes = get_manifest(self.host, self.repo, self.subject);
        let blob_digest = put_blob(self.host, self.repo, blob);
        let config = put_blob(self.host, self.repo, b"{}");
        let mut layer =
            json!({"mediaType": self.layer_type, "digest": blob_digest, "size": blob.len()});
        if !self.annotations.is_null() {
            layer["annotations"] = self.annotations.clone();
        }
        let hex = self.subject.trim_start_matches("sha256:");
        if store == Store::SigTag {
            let manifest = serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"mediaType": IMAGE_CONFIG, "digest": config, "size": 2},
                "layers": [layer],
            }))
            .unwrap();
            put_manifest(
                self.host,
                self.repo,
                &format!("sha256-{hex}.sig"),
                MANIFEST,
                &manifest,
            );
            return;
        }
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "artifactType": self.manifest_type,
            "config": {"mediaType": EMPTY, "digest": config, "size": 2},
            "layers": [layer],
            "subject": {"mediaType": MANIFEST, "digest": self.subject, "size": subject_bytes.len()},
        }))
        .unwrap();
        let digest = format!("sha256:{}", sha256_hex(&manifest));
        put_manifest(self.host, self.repo, &digest, MANIFEST, &manifest);
        if store == Store::Tag {
            let index = serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": INDEX,
                "manifests": [{"mediaType": MANIFEST, "artifactType": self.listed_type, "digest": digest, "size": manifest.len()}],
            }))
            .unwrap();
            put_manifest(
                self.host,
                self.repo,
                &format!("sha256-{hex}"),
                INDEX,
                &index,
            );
        }
    }
}
