//! `- swap_ecds: {filter: NAME, with: FILE}`: the step replaces the discovery (ECDS) file of
//! filter NAME by FILE (a discovery response, as `wasm-fetcher render` / `serve` write it;
//! relative to the scenario file), as `serve` replaces it: a new file renamed over the old one
//! in the directory Envoy watches. Streams after the step get the new configuration. The
//! harness reads FILE in place of the file the bootstrap names; with `--envoy`, Envoy runs on
//! a private copy of each discovery file, which the step replaces, and the step ends once
//! Envoy's admin stats show the update applied or rejected. `expect` checks the lines written
//! meanwhile (the new plugin's start on the canary, the main thread and each worker).
//! ```yaml
//! - name: the plugin's second configuration
//!   swap_ecds: {filter: extensions.istio.io/wasmplugin/istio-system.wasm-filter-header-ops, with: ecds-swap/header-ops-staging.yaml}
//!   expect: {log_counts: [{contains: configured role, worker: 0, count: 1}]}
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::expect::LogExpect;
use crate::envoy::bootstrap::{Bootstrap, EcdsFiles};
use crate::envoy::proxy::Proxy;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapStep {
    #[serde(default)]
    pub name: Option<String>,
    pub swap_ecds: SwapSpec,
    #[serde(default)]
    pub expect: LogExpect,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapSpec {
    /// The filter's name in the bootstrap, which is the name of its ECDS resource.
    pub filter: String,
    /// The new discovery file; relative to the scenario file as written, resolved on load.
    pub with: PathBuf,
}

impl SwapStep {
    pub fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("swap the ECDS file of {}", self.swap_ecds.filter))
    }

    /// Makes `with` relative to the directory of the scenario file.
    pub(super) fn resolve(&mut self, scenario_dir: &Path) {
        self.swap_ecds.with = scenario_dir.join(&self.swap_ecds.with);
    }
}

/// The discovery files a harness run has swapped so far, over those its bootstrap names.
#[derive(Debug, Default)]
pub struct Swaps {
    files: EcdsFiles,
}

impl Swaps {
    /// Reads the bootstrap at `bootstrap` again with `step`'s file (and the earlier swaps')
    /// and applies what changed to `proxy`: the names of the filters that changed.
    pub fn apply(
        &mut self,
        proxy: &mut Proxy,
        bootstrap: &Path,
        step: &SwapStep,
    ) -> Result<Vec<String>, String> {
        let spec = &step.swap_ecds;
        let mut files = self.files.clone();
        files.insert(spec.filter.clone(), spec.with.clone());
        let updated = Bootstrap::load_swapped(bootstrap, &files).map_err(|e| e.to_string())?;
        let changed = proxy.swap_ecds(updated).map_err(|e| e.to_string())?;
        self.files = files;
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Scenario, Step};

    #[test]
    fn a_swap_step_names_its_file_relative_to_the_scenario() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.yaml");
        std::fs::write(
            &path,
            "bootstrap: b.yaml\nrequests:\n  - {swap_ecds: {filter: f, with: next/f.yaml}}\n  - {name: named, swap_ecds: {filter: g, with: /abs/g.yaml}, expect: {logs: [x]}}\n",
        )
        .unwrap();
        let s = Scenario::load(&path).unwrap();
        let [Step::Swap(first), Step::Swap(second)] = &s.requests[..] else {
            panic!("expected two swaps: {:?}", s.requests);
        };
        assert_eq!(first.swap_ecds.with, dir.path().join("next/f.yaml"));
        assert_eq!(first.name(), "swap the ECDS file of f");
        assert_eq!(second.swap_ecds.with, std::path::Path::new("/abs/g.yaml"));
        assert_eq!(second.name(), "named");
        std::fs::write(
            &path,
            "bootstrap: b.yaml\nrequests:\n  - {swap_ecds: {filter: f, file: f.yaml}}\n",
        )
        .unwrap();
        let e = Scenario::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("swap_ecds step") && e.contains("unknown field `file`"),
            "{e}"
        );
    }
}
