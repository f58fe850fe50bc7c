//! Rewrites Envoy configuration so its Wasm plugins load a local (cached) module: every
//! `vm_config.code` under a Wasm HTTP filter, Wasm network filter or Wasm service becomes
//! `{local: {filename: <absolute path>}}`. Given an Envoy dynamic module (an ELF shared
//! object) instead, every dynamic-module filter's `dynamic_module_config.module` does
//! (`super::dynamic_modules`). Everything else is left as it was.

use std::path::Path;

use serde_json::{json, Value};
use wasm_common::envoy_types::url;

use super::sites::wasm_anys;

#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error(
        "no Wasm plugin (vm_config.code under a {}, {} or {}) found",
        url::HTTP_WASM,
        url::NETWORK_WASM,
        url::WASM_SERVICE
    )]
    NothingToRewrite,
    #[error(
        "no dynamic-module filter ({} or {}) found for the dynamic module",
        url::HTTP_DYNAMIC_MODULE,
        url::NETWORK_DYNAMIC_MODULE
    )]
    NoDynamicModuleFilter,
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {reason}")]
    NotAModule {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("cannot make {path} absolute: {source}")]
    Path {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Points `doc` at `module`, by what it is: an Envoy dynamic module (named `*.so`, or an ELF
/// file) goes into every dynamic-module filter, anything else into every Wasm plugin. The
/// file need not exist here (the configuration may be for another machine); when it does, a
/// dynamic module is refused unless Envoy could load it (64-bit, `ET_DYN`, x86_64 or
/// aarch64). Returns how many were rewritten.
pub fn point_at(doc: &mut Value, module: &Path) -> Result<usize, RewriteError> {
    let mut head = Vec::with_capacity(crate::dynamic_module::elf::HEADER_LEN);
    // Opened without blocking and checked on the opened file: a FIFO, a device or a directory
    // is refused at once (a FIFO with no writer would never open). A module not there yet is
    // named as it is.
    let file = match wasm_common::regular_file::open(module) {
        Ok(file) => Some(file),
        Err(wasm_common::regular_file::ReadError::Missing) => None,
        Err(e) => {
            return Err(RewriteError::NotAModule {
                path: module.to_path_buf(),
                reason: e.to_string(),
            })
        }
    };
    let readable = file.is_some_and(|f| {
        let limit = crate::dynamic_module::elf::HEADER_LEN as u64;
        std::io::Read::read_to_end(&mut std::io::Read::take(f, limit), &mut head).is_ok()
    });
    let named_so = module.extension().is_some_and(|e| e == "so");
    if !named_so && !head.starts_with(b"\x7fELF") {
        return point_wasm_code_at(doc, module);
    }
    if readable {
        crate::dynamic_module::elf::platform(&head).map_err(|reason| RewriteError::NotAModule {
            path: module.to_path_buf(),
            reason: format!("not an Envoy dynamic module ({reason})"),
        })?;
    }
    let abs = std::path::absolute(module).map_err(|source| RewriteError::Path {
        path: module.to_path_buf(),
        source,
    })?;
    match super::dynamic_modules::point_at(doc, &abs).map_err(RewriteError::Invalid)? {
        0 => Err(RewriteError::NoDynamicModuleFilter),
        n => Ok(n),
    }
}

/// Points every Wasm plugin in `doc` at `module`; returns how many were rewritten.
pub fn point_wasm_code_at(doc: &mut Value, module: &Path) -> Result<usize, RewriteError> {
    let abs = std::path::absolute(module).map_err(|source| RewriteError::Path {
        path: module.to_path_buf(),
        source,
    })?;
    let code = json!({"local": {"filename": abs.display().to_string()}});
    // Where each Wasm message's `vm_config` is, found first: the walk borrows `doc`.
    let vm_configs: Vec<String> = wasm_anys(doc)
        .iter()
        .map(|w| {
            let message = if w.wrapped { "/value" } else { "" };
            format!("{}{message}/config/vm_config", w.pointer)
        })
        .collect();
    let mut n = 0;
    for pointer in vm_configs {
        if let Some(vm) = doc.pointer_mut(&pointer).and_then(Value::as_object_mut) {
            vm.insert("code".into(), code.clone());
            n += 1;
        }
    }
    if n == 0 {
        return Err(RewriteError::NothingToRewrite);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_every_wasm_plugin_and_nothing_else() {
        let yaml = r#"
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          http_filters:
          - typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: a
                vm_config:
                  runtime: envoy.wasm.runtime.v8
                  code: {remote: {http_uri: {uri: "https://example.invalid/a.wasm"}, sha256: abc}}
bootstrap_extensions:
- typed_config:
    "@type": type.googleapis.com/envoy.extensions.wasm.v3.WasmService
    singleton: true
    config:
      vm_config: {code: {local: {filename: old.wasm}}}
"#;
        let mut doc: Value = serde_norway::from_str(yaml).unwrap();
        let n = point_wasm_code_at(&mut doc, Path::new("/cache/x.wasm")).unwrap();
        assert_eq!(n, 2);
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(text.matches("/cache/x.wasm").count(), 2);
        assert!(!text.contains("example.invalid") && !text.contains("old.wasm"));
        assert!(text.contains("envoy.wasm.runtime.v8"));
    }

    #[test]
    fn sees_through_typed_structs_as_the_sdk_examples_write_filters() {
        let yaml = r#"
http_filters:
- typed_config:
    "@type": type.googleapis.com/udpa.type.v1.TypedStruct
    type_url: type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    value:
      config:
        vm_config: {runtime: envoy.wasm.runtime.v8, code: {local: {filename: a.wasm}}}
- typed_config:
    "@type": type.googleapis.com/xds.type.v3.TypedStruct
    type_url: type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
    value: {config: {vm_config: {code: {local: {filename: lua.wasm}}}}}
"#;
        let mut doc: Value = serde_norway::from_str(yaml).unwrap();
        assert_eq!(
            point_wasm_code_at(&mut doc, Path::new("/cache/x.wasm")).unwrap(),
            1
        );
        let filters = &doc["http_filters"];
        assert_eq!(
            filters[0]["typed_config"]["value"]["config"]["vm_config"]["code"]["local"]["filename"],
            "/cache/x.wasm"
        );
        assert_eq!(
            filters[1]["typed_config"]["value"]["config"]["vm_config"]["code"]["local"]["filename"],
            "lua.wasm"
        );
    }

    #[test]
    fn no_wasm_plugin_is_an_error() {
        let mut doc = json!({"static_resources": {}});
        assert!(matches!(
            point_wasm_code_at(&mut doc, Path::new("/x.wasm")),
            Err(RewriteError::NothingToRewrite)
        ));
    }

    #[test]
    fn a_shared_object_goes_to_the_dynamic_module_filters_only_if_envoy_can_load_it() {
        let dir = tempfile::tempdir().unwrap();
        let elf = |e_type: u16| {
            let mut h = b"\x7fELF\x02\x01\x01\0".to_vec();
            h.extend([0; 8]);
            h.extend(e_type.to_le_bytes());
            h.extend(62u16.to_le_bytes());
            h
        };
        let (so, exe) = (dir.path().join("libm.so"), dir.path().join("m"));
        std::fs::write(&so, elf(3)).unwrap();
        std::fs::write(&exe, elf(2)).unwrap();
        let wasm_only = json!({"typed_config": {"@type": url::HTTP_WASM,
                                                "config": {"vm_config": {}}}});
        let e = point_at(&mut wasm_only.clone(), &so).unwrap_err();
        assert!(matches!(e, RewriteError::NoDynamicModuleFilter), "{e}");
        let mut dm = json!({"@type": url::HTTP_DYNAMIC_MODULE, "filter_name": "f"});
        let e = point_at(&mut dm.clone(), &exe).unwrap_err().to_string();
        assert!(e.contains("not a shared object"), "{e}");
        assert_eq!(point_at(&mut dm, &so).unwrap(), 1);
        assert_eq!(
            dm["dynamic_module_config"]["module"]["local"]["filename"],
            so.display().to_string()
        );
    }
}
