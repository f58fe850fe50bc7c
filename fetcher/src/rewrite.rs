//! Rewrites Envoy configuration so its Wasm plugins load a local (cached) module: every
//! `vm_config.code` under a Wasm HTTP filter, Wasm network filter or Wasm service becomes
//! `{local: {filename: <absolute path>}}`. Everything else is left as it was.

use std::path::Path;

use serde_json::{json, Value};

/// Type names whose `config.vm_config.code` names the module.
const WASM_TYPES: &[&str] = &[
    "envoy.extensions.filters.http.wasm.v3.Wasm",
    "envoy.extensions.filters.network.wasm.v3.Wasm",
    "envoy.extensions.wasm.v3.WasmService",
];

#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("no Wasm plugin (vm_config.code under a {}) found", WASM_TYPES.join(", "))]
    NothingToRewrite,
    #[error("cannot make {path} absolute: {source}")]
    Path {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Points every Wasm plugin in `doc` at `module`; returns how many were rewritten.
pub fn point_wasm_code_at(doc: &mut Value, module: &Path) -> Result<usize, RewriteError> {
    let abs = std::path::absolute(module).map_err(|source| RewriteError::Path {
        path: module.to_path_buf(),
        source,
    })?;
    let code = json!({"local": {"filename": abs.display().to_string()}});
    let n = walk(doc, &code);
    if n == 0 {
        return Err(RewriteError::NothingToRewrite);
    }
    Ok(n)
}

fn walk(v: &mut Value, code: &Value) -> usize {
    match v {
        Value::Object(map) => {
            let mut n = 0;
            let is_wasm = map
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| WASM_TYPES.iter().any(|w| t.ends_with(w)));
            if is_wasm {
                if let Some(vm) = map
                    .get_mut("config")
                    .and_then(|c| c.get_mut("vm_config"))
                    .and_then(Value::as_object_mut)
                {
                    vm.insert("code".into(), code.clone());
                    n += 1;
                }
            }
            n + map.values_mut().map(|c| walk(c, code)).sum::<usize>()
        }
        Value::Array(a) => a.iter_mut().map(|c| walk(c, code)).sum(),
        _ => 0,
    }
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
    fn no_wasm_plugin_is_an_error() {
        let mut doc = json!({"static_resources": {}});
        assert!(matches!(
            point_wasm_code_at(&mut doc, Path::new("/x.wasm")),
            Err(RewriteError::NothingToRewrite)
        ));
    }
}
