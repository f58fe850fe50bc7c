//! Envoy's dynamic-module filters in configuration, pointed at a cached `lib<name>.so`. Envoy
//! 1.40's `DynamicModuleConfig` names the module by `name` (`lib<name>.so`, searched for in
//! `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`) or by `module`, an `AsyncDataSource` (a local file,
//! or an HTTP URL with a sha256) that wins over `name` when both are set. Pointing a filter at
//! a file sets `module` to `{local: {filename}}`: one configuration then names one file,
//! whatever the environment of the Envoy that loads it. `name` is left as it was.

use std::path::Path;

use serde_json::{json, Value};
use wasm_common::envoy_types::{self, name};

use super::sites::join;

/// One dynamic-module filter configuration found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicModuleAny {
    /// Where it is, as a field path (`static_resources.listeners[0]…typed_config`).
    pub at: String,
    /// The same place as a JSON pointer.
    pub pointer: String,
}

/// Every HTTP or network dynamic-module filter in `doc` (an `Any` typed as one), in document
/// order.
pub fn dynamic_module_anys(doc: &Value) -> Vec<DynamicModuleAny> {
    let mut found = Vec::new();
    walk(doc, "", "", &mut found);
    found
}

fn walk(v: &Value, at: &str, pointer: &str, found: &mut Vec<DynamicModuleAny>) {
    match v {
        Value::Object(map) => {
            let type_name = map
                .get("@type")
                .and_then(Value::as_str)
                .map(envoy_types::name_of);
            if matches!(
                type_name,
                Some(name::HTTP_DYNAMIC_MODULE | name::NETWORK_DYNAMIC_MODULE)
            ) {
                found.push(DynamicModuleAny {
                    at: at.to_string(),
                    pointer: pointer.to_string(),
                });
                return;
            }
            for (key, child) in map {
                let ptr = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
                walk(child, &join(at, key), &ptr, found);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                walk(
                    child,
                    &format!("{at}[{i}]"),
                    &format!("{pointer}/{i}"),
                    found,
                );
            }
        }
        _ => {}
    }
}

/// Points every dynamic-module filter in `doc` at `file` (absolute); returns how many. A
/// filter whose `dynamic_module_config` is not an object is refused by its field path.
pub fn point_at(doc: &mut Value, file: &Path) -> Result<usize, String> {
    let module = json!({"local": {"filename": file.display().to_string()}});
    let found = dynamic_module_anys(doc);
    for any in &found {
        let Some(filter) = doc.pointer_mut(&any.pointer).and_then(Value::as_object_mut) else {
            continue;
        };
        // Envoy reads proto JSON's spelling too.
        let key = if filter.contains_key("dynamicModuleConfig") {
            "dynamicModuleConfig"
        } else {
            "dynamic_module_config"
        };
        let config = filter.entry(key).or_insert_with(|| json!({}));
        let config = config.as_object_mut().ok_or_else(|| {
            format!(
                "{}: must be an object (Envoy's DynamicModuleConfig)",
                join(&any.at, key)
            )
        })?;
        config.insert("module".into(), module.clone());
    }
    Ok(found.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dynamic_module_filter_gets_the_local_file_and_keeps_its_name() {
        let mut doc = json!({"listeners": [{"filters": [
            {"typed_config": {"@type": envoy_types::url::NETWORK_DYNAMIC_MODULE,
                              "dynamic_module_config": {"name": "m"}, "filter_name": "f"}},
            {"typed_config": {"@type": envoy_types::url::HCM, "http_filters": [
                {"typed_config": {"@type": envoy_types::url::HTTP_DYNAMIC_MODULE,
                                  "dynamicModuleConfig": {"module": {"remote": {}}}}},
                {"typed_config": {"@type": envoy_types::url::HTTP_WASM, "config": {}}},
            ]}},
        ]}]});
        assert_eq!(point_at(&mut doc, Path::new("/c/libm.so")).unwrap(), 2);
        let local = json!({"local": {"filename": "/c/libm.so"}});
        let filters = &doc["listeners"][0]["filters"];
        assert_eq!(
            filters[0]["typed_config"]["dynamic_module_config"],
            json!({"name": "m", "module": local})
        );
        let http = &filters[1]["typed_config"]["http_filters"];
        assert_eq!(
            http[0]["typed_config"]["dynamicModuleConfig"]["module"],
            local
        );
        assert_eq!(
            http[1]["typed_config"]["config"],
            json!({}),
            "Wasm left alone"
        );

        let mut bad = json!({"@type": envoy_types::url::HTTP_DYNAMIC_MODULE,
                             "dynamic_module_config": "m"});
        let e = point_at(&mut bad, Path::new("/c/libm.so")).unwrap_err();
        assert_eq!(
            e,
            "dynamic_module_config: must be an object (Envoy's DynamicModuleConfig)"
        );
    }
}
