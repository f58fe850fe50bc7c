//! Registry credentials from a Docker config JSON: the decoded `.dockerconfigjson` of a
//! Kubernetes `imagePullSecret` (`--pull-secret`), else `$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json`. Entries are matched by registry `host[:port]`, in Docker's order:
//! a `credHelpers` entry for the host, else the `credsStore`, else `auths`; a helper is run
//! by `super::cred_helper` for that one host.

use std::path::{Path, PathBuf};

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use crate::error::FetchError;

fn bad(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> FetchError {
    FetchError::Setting {
        name: what,
        value: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The default Docker config, if there is one.
pub fn default_docker_config() -> Option<PathBuf> {
    let p = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker/config.json"),
    };
    p.is_file().then_some(p)
}

/// Credentials for `registry`: from `pull_secret` when given, else from the default Docker
/// config when there is one, else none. Errors name the file as the user knows it.
pub async fn credentials(
    pull_secret: Option<&Path>,
    registry: &str,
) -> Result<RegistryAuth, FetchError> {
    let found = match (pull_secret, default_docker_config()) {
        (Some(p), _) => from_docker_config(p, "--pull-secret", registry)?,
        (None, Some(p)) => from_docker_config(&p, "Docker config", registry)?,
        (None, None) => return Ok(RegistryAuth::Anonymous),
    };
    match found {
        Found::Credentials(auth) => Ok(auth),
        Found::Helper(helper) => super::cred_helper::get(&helper, registry).await,
    }
}

/// What a Docker config says about one registry.
#[derive(Debug)]
pub enum Found {
    Credentials(RegistryAuth),
    /// Ask the credential helper of this name.
    Helper(String),
}

/// What the config at `path`, input `what`, says for `registry` (anonymous when it has no
/// entry). The file must be a regular file of at most 1 MiB (a Kubernetes Secret's limit).
pub fn from_docker_config(
    path: &Path,
    what: &'static str,
    registry: &str,
) -> Result<Found, FetchError> {
    use crate::regular_file::{read_input, PULL_SECRET_LIMIT};
    let bytes = read_input(path, what, PULL_SECRET_LIMIT)?;
    match parse_docker_config(&bytes, registry) {
        Ok(auth) => Ok(Found::Credentials(auth)),
        Err(ConfigError::CredentialHelper(helper)) => Ok(Found::Helper(helper)),
        Err(ConfigError::Invalid(reason)) => Err(bad(what, path, reason)),
    }
}

/// Why a Docker config gives no credentials.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Not a Docker config, or an entry that is not what Docker writes; says what is wrong
    /// without repeating secret material.
    Invalid(String),
    /// The credentials for the registry are behind the credential helper of this name.
    CredentialHelper(String),
}

/// Credentials for `registry` from the bytes of a Docker config JSON. Allocates in proportion
/// to its input (which the caller bounds), and never fails by panicking.
pub fn parse_docker_config(bytes: &[u8], registry: &str) -> Result<RegistryAuth, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid(reason);
    let doc: Value = serde_json::from_slice(bytes)
        .map_err(|e| invalid(format!("not a Docker config JSON: {e}")))?;
    let key_matches = |k: &str| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        k.split('/').next() == Some(registry)
    };
    // Docker's order: the host's own helper, then the store every host uses, then `auths`.
    let helper = doc
        .get("credHelpers")
        .and_then(|h| h.get(registry))
        .or_else(|| doc.get("credsStore"));
    if let Some(helper) = helper {
        return match helper.as_str() {
            Some(name) if !name.is_empty() => Err(ConfigError::CredentialHelper(name.to_string())),
            _ => Err(invalid(format!(
                "the credential helper for {registry} is not a helper name (credHelpers or credsStore)"
            ))),
        };
    }
    let entry = doc
        .get("auths")
        .and_then(Value::as_object)
        .and_then(|auths| auths.iter().find(|(k, _)| key_matches(k)).map(|(_, v)| v));
    let Some(entry) = entry else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(u), Some(p)) = (
        entry.get("username").and_then(Value::as_str),
        entry.get("password").and_then(Value::as_str),
    ) {
        return Ok(RegistryAuth::Basic(u.to_string(), p.to_string()));
    }
    if let Some(auth) = entry.get("auth").and_then(Value::as_str) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| invalid(format!("auths.{registry}.auth is not base64: {e}")))?;
        let text = String::from_utf8_lossy(&decoded);
        let (u, p) = text.split_once(':').ok_or_else(|| {
            invalid(format!(
                "auths.{registry}.auth is not base64(user:password)"
            ))
        })?;
        return Ok(RegistryAuth::Basic(u.to_string(), p.to_string()));
    }
    if let Some(t) = entry.get("registrytoken").and_then(Value::as_str) {
        return Ok(RegistryAuth::Bearer(t.to_string()));
    }
    Ok(RegistryAuth::Anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_auth_and_username_password_entries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"auths":{"127.0.0.1:5000":{"auth":"Zm9vOmJhcg=="},"https://other.io/v1/":{"username":"u","password":"p"}}}"#,
        )
        .unwrap();
        assert!(
            matches!(from_docker_config(&p, "--pull-secret", "127.0.0.1:5000").unwrap(), Found::Credentials(RegistryAuth::Basic(u, pw)) if u == "foo" && pw == "bar")
        );
        assert!(
            matches!(from_docker_config(&p, "--pull-secret", "other.io").unwrap(), Found::Credentials(RegistryAuth::Basic(u, _)) if u == "u")
        );
        assert!(matches!(
            from_docker_config(&p, "--pull-secret", "third.io").unwrap(),
            Found::Credentials(RegistryAuth::Anonymous)
        ));
        // Docker's order: the host's helper, then the store, then auths.
        std::fs::write(
            &p,
            r#"{"auths":{"a.io":{"auth":"Zm9vOmJhcg=="}},"credsStore":"desktop","credHelpers":{"b.io":"ecr-login"}}"#,
        )
        .unwrap();
        for (host, helper) in [
            ("a.io", "desktop"),
            ("b.io", "ecr-login"),
            ("c.io", "desktop"),
        ] {
            assert!(
                matches!(from_docker_config(&p, "--pull-secret", host).unwrap(), Found::Helper(h) if h == helper),
                "{host}"
            );
        }
        std::fs::write(&p, r#"{"credHelpers":{"x.io":7}}"#).unwrap();
        assert!(from_docker_config(&p, "--pull-secret", "x.io")
            .unwrap_err()
            .to_string()
            .contains("not a helper name"));
    }

    mod properties {
        use super::super::*;
        use crate::alloc_meter::allocated_by;
        use proptest::prelude::*;

        /// A JSON string literal holding `s`.
        fn quoted(s: &str) -> String {
            serde_json::to_string(s).unwrap()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any bytes: an answer, never a panic, and allocation in proportion to the input
            /// (which `from_docker_config` caps at 1 MiB before reading).
            #[test]
            fn any_bytes_get_an_answer(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let (_, allocated) = allocated_by(|| parse_docker_config(&bytes, "r.io"));
                prop_assert!(allocated <= 64 * bytes.len() + 4096, "{allocated} bytes for {} of input", bytes.len());
            }

            /// Configs shaped like Docker's with arbitrary strings in every slot.
            #[test]
            fn docker_shaped_configs_get_an_answer(
                key in "(https?://)?[a-z0-9.:/]{0,24}",
                auth in "\\PC{0,64}",
                user in "\\PC{0,16}",
                registry in "[a-z0-9.:]{1,16}",
                nesting in 0usize..300,
            ) {
                let deep = format!("{}{}", "[".repeat(nesting), "]".repeat(nesting));
                let text = format!(
                    r#"{{"auths":{{{}:{{"auth":{},"username":{},"x":{deep}}}}},"credHelpers":{{{}:"h"}}}}"#,
                    quoted(&key), quoted(&auth), quoted(&user), quoted(&registry)
                );
                let (_, allocated) = allocated_by(|| parse_docker_config(text.as_bytes(), &registry));
                prop_assert!(allocated <= 64 * text.len() + 4096);
            }

            /// `auth` holding base64(user:password) yields exactly that user and password.
            #[test]
            fn auth_entries_decode_exactly(user in "[^:]{0,32}", password in "\\PC{0,32}") {
                use base64::Engine;
                let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                let text = format!(r#"{{"auths":{{"r.io":{{"auth":"{auth}"}}}}}}"#);
                let parsed = parse_docker_config(text.as_bytes(), "r.io");
                prop_assert!(
                    matches!(&parsed, Ok(RegistryAuth::Basic(u, p)) if *u == user && *p == password),
                    "{parsed:?}"
                );
            }
        }
    }
}
