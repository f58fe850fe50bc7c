//! Credentials re-checked at a cache hit, as KEP-2535 makes the kubelet do for a node's
//! images: on a node-wide cache (`serve` as a DaemonSet, plugins of many namespaces), a module
//! one namespace pulled with its credentials is handed to another plugin only once the
//! registry has accepted that plugin's own credentials (or none) for the same image. The check
//! is a manifest GET at the registry itself (never a mirror: mirrors get no credentials, so a
//! mirror's yes proves nothing), remembered per (credentials, image) for [`REMEMBERED`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use oci_client::secrets::RegistryAuth;
use sha2::{Digest as _, Sha256};

use crate::digest::Digest;
use crate::error::FetchError;
use crate::oci::registry::Registry;
use crate::reference::oci::OciRef;
use crate::settings::Settings;

/// How long a registry's yes stands for the same credentials and image: a revoked credential
/// keeps the module it was confirmed for at most this long, as a running pod keeps its image.
pub const REMEMBERED: Duration = Duration::from_secs(300);

/// (credentials' fingerprint, image) -> when the registry last accepted them.
fn confirmed() -> &'static Mutex<HashMap<(String, String), Instant>> {
    static CONFIRMED: OnceLock<Mutex<HashMap<(String, String), Instant>>> = OnceLock::new();
    CONFIRMED.get_or_init(Mutex::default)
}

/// A digest of the credentials, so none is kept in memory longer than the pull that read it.
fn fingerprint(auth: &RegistryAuth) -> String {
    let mut h = Sha256::new();
    match auth {
        RegistryAuth::Anonymous => h.update(b"anonymous"),
        RegistryAuth::Basic(user, pass) => {
            h.update(b"basic\0");
            h.update(user.as_bytes());
            h.update(b"\0");
            h.update(pass.as_bytes());
        }
        RegistryAuth::Bearer(token) => {
            h.update(b"bearer\0");
            h.update(token.as_bytes());
        }
    }
    hex::encode(h.finalize())
}

/// Whether the registry lets `pull_secret`'s credentials for `r`'s registry (the Docker
/// config when none) pull the image whose manifest is `manifest` (`r`'s tag when unknown).
/// An error is the pull's error: `unauthorized`, `not found`, or the network's.
pub async fn check(
    r: &OciRef,
    manifest: Option<Digest>,
    pull_secret: Option<&std::path::Path>,
    settings: &Settings,
) -> Result<(), FetchError> {
    let creds = crate::oci::auth::credentials(pull_secret, &r.registry).await?;
    let reference = match (manifest, r.digest) {
        (Some(d), _) => d.to_string(),
        (None, Some(d)) => Digest(d).to_string(),
        (None, None) => r.tag.clone().unwrap_or_else(|| "latest".into()),
    };
    let key = (
        fingerprint(&creds),
        format!("{}/{}@{reference}", r.registry, r.repository),
    );
    let fresh = wasm_common::sync::lock(confirmed())
        .get(&key)
        .is_some_and(|at| at.elapsed() < REMEMBERED);
    if fresh {
        return Ok(());
    }
    Registry::new(r, creds, settings)
        .may_pull(&reference)
        .await?;
    let mut map = wasm_common::sync::lock(confirmed());
    map.retain(|_, at| at.elapsed() < REMEMBERED);
    map.insert(key, Instant::now());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_credentials_apart_and_hold_none() {
        let a = fingerprint(&RegistryAuth::Basic("user".into(), "pass".into()));
        let b = fingerprint(&RegistryAuth::Basic("user".into(), "other".into()));
        let c = fingerprint(&RegistryAuth::Basic("userp".into(), "ass".into()));
        let none = fingerprint(&RegistryAuth::Anonymous);
        assert!(a != b && a != c && a != none);
        assert!(!a.contains("pass") && !a.contains("user"));
    }
}
