//! What `push` checks in a module before anything is sent: that it is a whole core Wasm
//! module (not text that starts like one, not a component, not cut short), and which
//! proxy-wasm ABI versions it exports (`--check-abi`).

use crate::digest::check_wasm_header;

/// The prefix of the export a proxy-wasm module announces its ABI with
/// (`proxy_abi_version_0_2_1`, ...).
pub const ABI_EXPORT_PREFIX: &str = "proxy_abi_version_";

/// The module's `proxy_abi_version_*` exports, or why it is not a module a proxy can load.
/// Only structure is read (sections and exports), never code: cheap even for a large module.
pub fn abi_versions(module: &[u8]) -> Result<Vec<String>, String> {
    check_wasm_header(module).map_err(|e| match e {
        crate::error::FetchError::NotWasm { reason } => reason,
        other => other.to_string(),
    })?;
    let mut versions = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        let payload = payload.map_err(|e| format!("malformed module: {e}"))?;
        if let wasmparser::Payload::ExportSection(exports) = payload {
            for export in exports {
                let export = export.map_err(|e| format!("malformed export section: {e}"))?;
                if export.name.starts_with(ABI_EXPORT_PREFIX) {
                    versions.push(export.name.to_string());
                }
            }
        }
    }
    Ok(versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module exporting one function under each of `names`.
    fn module_exporting(names: &[&str]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        // type section: one type, () -> ()
        m.extend_from_slice(&[1, 4, 1, 0x60, 0, 0]);
        // function section: one function of type 0
        m.extend_from_slice(&[3, 2, 1, 0]);
        let mut exports = vec![names.len() as u8];
        for n in names {
            exports.push(n.len() as u8);
            exports.extend_from_slice(n.as_bytes());
            exports.extend_from_slice(&[0, 0]);
        }
        m.push(7);
        m.push(exports.len() as u8);
        m.extend_from_slice(&exports);
        // code section: one empty body
        m.extend_from_slice(&[10, 4, 1, 2, 0, 0x0b]);
        m
    }

    #[test]
    fn finds_the_abi_exports() {
        let m = module_exporting(&["proxy_abi_version_0_2_1", "proxy_on_memory_allocate"]);
        assert_eq!(abi_versions(&m).unwrap(), vec!["proxy_abi_version_0_2_1"]);
        assert!(abi_versions(&module_exporting(&["main"]))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn refuses_what_is_not_a_whole_core_module() {
        let e = abi_versions(b"hello, world").unwrap_err();
        assert!(e.contains("does not start with \\0asm"), "{e}");
        let e = abi_versions(b"\0asm\x0d\0\x01\0").unwrap_err();
        assert!(e.contains("component"), "{e}");
        let m = module_exporting(&["proxy_abi_version_0_2_1"]);
        let e = abi_versions(&m[..m.len() - 3]).unwrap_err();
        assert!(e.starts_with("malformed"), "{e}");
    }
}
