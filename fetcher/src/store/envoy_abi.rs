//! The dynamic-module ABI of each Envoy version the fetcher can check a module against: the
//! version string Envoy compares with what `envoy_dynamic_module_on_program_init` returns,
//! and every `envoy_dynamic_module_callback_*` it exports. One data file per Envoy minor
//! version (`envoy_abi/<version>.txt`, from `nm -D` of that release's binary), checked against
//! the real binary by the fetcher's tests.
//!
//! A version without a table is refused rather than guessed: Envoy itself loads a module of
//! another ABI version with a warning, so only the table says what it will find.

use std::collections::BTreeSet;

/// `(Envoy minor version, its table)`, oldest first.
const TABLES: &[(&str, &str)] = &[("1.40", include_str!("envoy_abi/1.40.txt"))];

/// One Envoy version's dynamic-module ABI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyAbi {
    /// `MAJOR.MINOR`.
    pub envoy_version: String,
    /// What Envoy compares a module's reported version with (`v0.2.0` for 1.40).
    pub abi_version: String,
    /// Every callback Envoy exports to modules.
    pub callbacks: BTreeSet<String>,
}

impl EnvoyAbi {
    /// The ABI of Envoy `envoy_version` (`MAJOR.MINOR`), or why there is none.
    pub fn of(envoy_version: &str) -> Result<Self, String> {
        let (_, table) = TABLES
            .iter()
            .find(|(v, _)| *v == envoy_version)
            .ok_or_else(|| {
                format!(
                    "this wasm-fetcher has no dynamic-module ABI table for Envoy {} (it knows {}): \
                     a module cannot be checked against it",
                    crate::shown::shown(envoy_version),
                    known().join(", ")
                )
            })?;
        Ok(parse(envoy_version, table))
    }

    /// Whether Envoy exports `name` to modules.
    pub fn exports(&self, name: &str) -> bool {
        self.callbacks.contains(name)
    }
}

/// The Envoy minor versions with a table.
pub fn known() -> Vec<&'static str> {
    TABLES.iter().map(|(v, _)| *v).collect()
}

fn parse(envoy_version: &str, table: &str) -> EnvoyAbi {
    let mut abi = EnvoyAbi {
        envoy_version: envoy_version.to_string(),
        abi_version: String::new(),
        callbacks: BTreeSet::new(),
    };
    for line in table.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("abi_version ") {
            abi.abi_version = v.trim().to_string();
        } else if !line.is_empty() && !line.starts_with('#') {
            abi.callbacks.insert(line.to_string());
        }
    }
    abi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_names_its_abi_version_and_callbacks_only() {
        for v in known() {
            let abi = EnvoyAbi::of(v).unwrap();
            assert!(abi.abi_version.starts_with('v'), "{v}: {abi:?}");
            assert!(abi.callbacks.len() > 100, "{v}");
            assert!(abi
                .callbacks
                .iter()
                .all(|c| c.starts_with("envoy_dynamic_module_callback_")));
        }
        assert!(EnvoyAbi::of("1.40")
            .unwrap()
            .exports("envoy_dynamic_module_callback_http_get_header"));
        let e = EnvoyAbi::of("1.99\n").unwrap_err();
        assert!(
            e.contains("no dynamic-module ABI table for Envoy 1.99  (it knows 1.40)"),
            "{e}"
        );
    }
}
