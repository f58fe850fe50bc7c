//! ECDS files for real Envoy: each discovery file the bootstrap names is copied into Envoy's
//! private directory, and the copy is what Envoy reads and watches, so a step that swaps a
//! file ([`RealEnvoy::swap_ecds`]) never touches the scenario's own files. A swap is done as
//! `wasm-fetcher serve` does it (a new file renamed over the old one in the watched
//! directory); the step waits until Envoy's admin stats show the update applied or rejected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::admin_get;
use super::{io, EnvoyError, RealEnvoy};

/// How long Envoy may take to apply a swapped file (its file watch, then the update on
/// every thread).
pub const SWAP_DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// Points every `config_discovery` of the listeners' filters in `doc` (normalized) at a copy
/// of its file in `dir`, and any `watched_directory` at `dir`. Returns each filter's copy.
pub(super) fn private_copies(
    doc: &mut Value,
    dir: &Path,
) -> Result<HashMap<String, PathBuf>, EnvoyError> {
    let mut copies: HashMap<String, PathBuf> = HashMap::new();
    let mut by_source: HashMap<(String, String), PathBuf> = HashMap::new();
    let Some(listeners) = doc
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut)
    else {
        return Ok(copies);
    };
    let filters = listeners
        .iter_mut()
        .filter_map(|l| l.get_mut("filter_chains").and_then(Value::as_array_mut))
        .flatten()
        .filter_map(|c| c.get_mut("filters").and_then(Value::as_array_mut))
        .flatten();
    for filter in filters {
        redirect(filter, dir, &mut copies, &mut by_source)?;
        let http = filter
            .pointer_mut("/typed_config/http_filters")
            .and_then(Value::as_array_mut);
        for entry in http.into_iter().flatten() {
            redirect(entry, dir, &mut copies, &mut by_source)?;
        }
    }
    Ok(copies)
}

/// One filter entry: a `path_config_source` is pointed at a copy of its file in `dir`, recorded
/// under the filter's name in `copies`. Each filter name gets its own copy, even when two
/// names share a file: a swap replaces one filter's configuration in Envoy as in the harness.
/// Entries of one name share their copy (Envoy shares their subscription).
fn redirect(
    entry: &mut Value,
    dir: &Path,
    copies: &mut HashMap<String, PathBuf>,
    by_source: &mut HashMap<(String, String), PathBuf>,
) -> Result<(), EnvoyError> {
    let name = entry
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let Some(source) = entry.pointer_mut("/config_discovery/config_source/path_config_source")
    else {
        return Ok(());
    };
    let Some(original) = source.get("path").and_then(Value::as_str).map(String::from) else {
        return Ok(());
    };
    let key = (name.clone(), original);
    let copy = match by_source.get(&key) {
        Some(copy) => copy.clone(),
        None => {
            let original = &key.1;
            let base = Path::new(original)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let copy = dir.join(format!("{}-{base}", by_source.len()));
            std::fs::copy(original, &copy)
                .map_err(|e| io(&format!("cannot copy the ECDS file {original}"), e))?;
            by_source.insert(key, copy.clone());
            copy
        }
    };
    source["path"] = copy.display().to_string().into();
    if source.get("watched_directory").is_some() {
        source["watched_directory"] = serde_json::json!({"path": dir.display().to_string()});
    }
    copies.insert(name, copy);
    Ok(())
}

impl RealEnvoy {
    /// Replaces the discovery file of filter `filter` by `with`, as `wasm-fetcher serve` does,
    /// and waits until Envoy applied the update (or rejected it: an error).
    pub fn swap_ecds(&self, filter: &str, with: &Path) -> Result<(), EnvoyError> {
        let copy = self.ecds.get(filter).ok_or_else(|| {
            EnvoyError::Io(format!(
                "no filter named {filter:?} is configured by discovery (config_discovery)"
            ))
        })?;
        let text = crate::engine::input::read_text(with, crate::engine::input::MAX_CONFIG_BYTES)
            .map_err(|e| io(&format!("cannot read {}", with.display()), e))?;
        let before = self.ecds_updates(filter);
        let dir = copy.parent().unwrap_or(Path::new("."));
        let staged = dir.join(".swap.tmp");
        std::fs::write(&staged, text).map_err(|e| io("cannot write the new ECDS file", e))?;
        std::fs::rename(&staged, copy).map_err(|e| io("cannot rename the new ECDS file", e))?;
        let start = Instant::now();
        loop {
            let now = self.ecds_updates(filter);
            if now.rejected > before.rejected {
                return Err(EnvoyError::Io(format!(
                    "envoy rejected the new configuration of {filter:?} (update_rejected); its log ends with:\n{}",
                    self.log_tail()
                )));
            }
            if now.applied > before.applied {
                return Ok(());
            }
            if start.elapsed() > SWAP_DEADLINE {
                return Err(EnvoyError::Io(format!(
                    "envoy did not take the new ECDS file of {filter:?} within {}s",
                    SWAP_DEADLINE.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Envoy's count of updates of `filter`'s configuration applied and rejected so far
    /// (`extension_config_discovery.<kind>.<filter>.update_success` / `update_rejected`).
    fn ecds_updates(&self, filter: &str) -> Updates {
        let body = admin_get(&self.admin_path, "/stats?filter=extension_config_discovery")
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let count = |stat: &str| -> u64 {
            let suffix = format!(".{filter}.{stat}");
            text.lines()
                .filter_map(|l| l.split_once(": "))
                .filter(|(k, _)| {
                    k.starts_with("extension_config_discovery.") && k.ends_with(&suffix)
                })
                .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
                .sum()
        };
        Updates {
            applied: count("update_success"),
            rejected: count("update_rejected") + count("update_failure"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Updates {
    applied: u64,
    rejected: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_naming_one_file_get_a_copy_each() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared.yaml");
        std::fs::write(&shared, "name: x\n").unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let entry = |name: &str| {
            serde_json::json!({"name": name, "config_discovery": {"config_source":
                {"path_config_source": {"path": shared.display().to_string()}}}})
        };
        let mut doc = serde_json::json!({"static_resources": {"listeners": [{"filter_chains": [
            {"filters": [{"name": "hcm", "typed_config": {"http_filters": [entry("a"), entry("b")]}}]},
            {"filters": [{"name": "hcm", "typed_config": {"http_filters": [entry("a")]}}]}
        ]}]}});
        let copies = private_copies(&mut doc, &private).unwrap();
        assert_ne!(copies["a"], copies["b"]);
        let paths: Vec<&str> = ["0", "1"]
            .iter()
            .map(|chain| {
                doc.pointer(&format!(
                    "/static_resources/listeners/0/filter_chains/{chain}/filters/0/typed_config/http_filters/0/config_discovery/config_source/path_config_source/path"
                ))
                .and_then(Value::as_str)
                .unwrap()
            })
            .collect();
        // Envoy shares one subscription among entries of one name: so do their copies.
        assert_eq!(paths[0], paths[1]);
    }
}
