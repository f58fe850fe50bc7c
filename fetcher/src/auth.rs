//! Registry credentials from a Docker config JSON: the decoded `.dockerconfigjson` of a
//! Kubernetes `imagePullSecret` (`--pull-secret`), else `$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json`. Entries are matched by registry `host[:port]`.

use std::path::{Path, PathBuf};

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use crate::error::FetchError;

fn bad(path: &Path, reason: impl std::fmt::Display) -> FetchError {
    FetchError::Setting {
        name: "--pull-secret",
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

/// Credentials for `registry` from the config at `path` (anonymous when it has no entry).
pub fn from_docker_config(path: &Path, registry: &str) -> Result<RegistryAuth, FetchError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| bad(path, format!("not a Docker config JSON: {e}")))?;
    let key_matches = |k: &str| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        k.split('/').next() == Some(registry)
    };
    let entry = doc
        .get("auths")
        .and_then(Value::as_object)
        .and_then(|auths| auths.iter().find(|(k, _)| key_matches(k)).map(|(_, v)| v));
    let Some(entry) = entry else {
        let helper = doc
            .get("credHelpers")
            .and_then(|h| h.get(registry))
            .is_some()
            || doc.get("credsStore").is_some();
        if helper {
            return Err(FetchError::Unsupported(format!(
                "{}: credential helpers are not supported; put the credentials for {registry} under \"auths\"",
                path.display()
            )));
        }
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
            .map_err(|e| bad(path, format!("auths.{registry}.auth is not base64: {e}")))?;
        let text = String::from_utf8_lossy(&decoded);
        let (u, p) = text.split_once(':').ok_or_else(|| {
            bad(
                path,
                format!("auths.{registry}.auth is not base64(user:password)"),
            )
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
            matches!(from_docker_config(&p, "127.0.0.1:5000").unwrap(), RegistryAuth::Basic(u, pw) if u == "foo" && pw == "bar")
        );
        assert!(
            matches!(from_docker_config(&p, "other.io").unwrap(), RegistryAuth::Basic(u, _) if u == "u")
        );
        assert!(matches!(
            from_docker_config(&p, "third.io").unwrap(),
            RegistryAuth::Anonymous
        ));
        std::fs::write(&p, r#"{"credsStore":"desktop"}"#).unwrap();
        assert!(from_docker_config(&p, "x.io")
            .unwrap_err()
            .to_string()
            .starts_with("unsupported"));
    }
}
