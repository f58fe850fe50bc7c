//! Code precompiled into the module itself, with Envoy's `vm_config.allow_precompiled` meaning.
//!
//! proxy-wasm's cpp-host looks, only when `allow_precompiled` is true, for a custom section
//! named for the plugin's runtime and the platform (`envoy.wasm.runtime.wasmtime`:
//! `precompiled_wasmtime_v<version>_<platform>`; V8: `precompiled_wee8_v<version>_<platform>`)
//! and loads that instead of compiling. If the section does not load (another wasmtime, other
//! settings) it compiles the bytecode, which stays in the module beside it. Other runtimes'
//! sections are ignored, so one module can carry code for several.
//!
//! The harness runs every plugin on wasmtime, so it honours the wasmtime section for plugins
//! whose runtime is wasmtime. For V8 plugins it compiles the bytecode: V8's code is not
//! wasmtime's, and the V8 section holds the same program, so the outcome is V8's; a wasmtime
//! section in a V8 plugin's module is ignored, as Envoy ignores it (tested against Envoy).
//!
//! Loading precompiled code runs machine code taken from the module as is: the operator who
//! sets `allow_precompiled` trusts the module (pin it by sha256). Unlike the harness's own
//! compiled-code cache ([`crate::engine::compiled_cache`]), nothing here checks where the bytes came from.

use std::borrow::Cow;

use wasmparser::{Parser, Payload};
use wasmtime::{Engine, Module};

/// The wasmtime release this harness embeds; part of the section name, as in cpp-host.
pub const WASMTIME_VERSION: &str = "48.0.8";

#[derive(Debug, thiserror::Error)]
pub enum PrecompiledError {
    /// cpp-host's words for a module whose sections cannot be walked.
    #[error("Failed to parse corrupted Wasm module: {0}")]
    Corrupt(String),
    #[error("cannot compile the module to embed its code: {0}")]
    Compile(String),
}

/// cpp-host's `PROXY_WASM_PLATFORM` for this machine; empty where it has none (then
/// precompiled code is never looked for).
pub fn platform() -> &'static str {
    match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => "linux_x86_64",
        ("linux", "aarch64") => "linux_aarch64",
        ("linux", "powerpc64") => "linux_ppc64le",
        ("linux", "s390x") => "linux_s390x",
        ("macos", "x86_64") => "macos_x86_64",
        ("macos", "aarch64") => "macos_arm64",
        ("windows", "x86_64") => "windows_x64",
        _ => "",
    }
}

/// The runtime name (`vm_config.runtime`) whose precompiled code this host can load.
pub const WASMTIME_RUNTIME: &str = "envoy.wasm.runtime.wasmtime";

/// The section a plugin's precompiled code is read from: only with `allow_precompiled`, a
/// wasmtime runtime, and a platform cpp-host has a name for.
pub fn section_for(runtime: &str, allow_precompiled: bool) -> Option<String> {
    if allow_precompiled && runtime == WASMTIME_RUNTIME {
        section_name()
    } else {
        None
    }
}

/// This host's section name (`precompiled_wasmtime_v<version>_<platform>`), or `None` on a
/// platform cpp-host has no name for.
pub fn section_name() -> Option<String> {
    let platform = platform();
    (!platform.is_empty()).then(|| format!("precompiled_wasmtime_v{WASMTIME_VERSION}_{platform}"))
}

/// The contents of the custom section `name`, if the module has one (the last wins, as the
/// sections are read in order and each overwrites the previous).
pub fn find_section<'a>(
    module: &'a [u8],
    name: &str,
) -> Result<Option<&'a [u8]>, PrecompiledError> {
    let mut found = None;
    for payload in Parser::new(0).parse_all(module) {
        if let Payload::CustomSection(c) =
            payload.map_err(|e| PrecompiledError::Corrupt(e.to_string()))?
        {
            if c.name() == name {
                found = Some(c.data());
            }
        }
    }
    Ok(found)
}

/// The module without any `precompiled_*` section: what cpp-host hands its runtime to compile.
pub fn strip(module: &[u8]) -> Result<Vec<u8>, PrecompiledError> {
    rewrite(module, None)
}

/// Compiles `module` with `engine` and returns it with the machine code in this host's
/// section (replacing any `precompiled_*` section it had), like cpp-host's `serialize`.
pub fn embed(engine: &Engine, module: &[u8]) -> Result<Vec<u8>, PrecompiledError> {
    let name = section_name().ok_or_else(|| {
        PrecompiledError::Compile(format!(
            "Envoy has no precompiled-section name for {} {}",
            std::env::consts::OS,
            std::env::consts::ARCH
        ))
    })?;
    let stripped = strip(module)?;
    let code = Module::new(engine, &stripped)
        .and_then(|m| m.serialize())
        .map_err(|e| PrecompiledError::Compile(format!("{e:#}")))?;
    with_section(&stripped, &name, &code)
}

/// `module` without its `precompiled_*` sections, plus the custom section `name` holding
/// `contents` (cpp-host's `writeModuleWithCustomSection`).
pub fn with_section(
    module: &[u8],
    name: &str,
    contents: &[u8],
) -> Result<Vec<u8>, PrecompiledError> {
    rewrite(module, Some((name, contents)))
}

fn corrupt(e: wasmparser::BinaryReaderError) -> PrecompiledError {
    PrecompiledError::Corrupt(format!("{} at offset {:#x}", e.message(), e.offset()))
}

fn check_header(module: &[u8]) -> Result<(), PrecompiledError> {
    if module.starts_with(b"\0asm") {
        Ok(())
    } else {
        Err(PrecompiledError::Corrupt(
            "not a Wasm module (no \\0asm header)".into(),
        ))
    }
}

fn rewrite(module: &[u8], append: Option<(&str, &[u8])>) -> Result<Vec<u8>, PrecompiledError> {
    check_header(module)?;
    let mut out = wasm_encoder::Module::new();
    for payload in Parser::new(0).parse_all(module) {
        let payload = payload.map_err(corrupt)?;
        if let Payload::Version { encoding, .. } = &payload {
            if *encoding != wasmparser::Encoding::Module {
                return Err(PrecompiledError::Corrupt(
                    "a component, not a core module".into(),
                ));
            }
        }
        if let Payload::CustomSection(c) = &payload {
            if c.name().starts_with("precompiled_") {
                continue;
            }
        }
        if let Some((id, range)) = payload.as_section() {
            out.section(&wasm_encoder::RawSection {
                id,
                data: &module[range],
            });
        }
    }
    if let Some((name, data)) = append {
        out.section(&wasm_encoder::CustomSection {
            name: Cow::Borrowed(name),
            data: Cow::Borrowed(data),
        });
    }
    Ok(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module() -> Vec<u8> {
        wat::parse_str(
            r#"(module (func (export "f") (result i32) i32.const 7) (@custom "keep" "me"))"#,
        )
        .unwrap()
    }

    #[test]
    fn the_section_name_is_cpp_hosts() {
        if let Some(name) = section_name() {
            assert!(name.starts_with("precompiled_wasmtime_v48."), "{name}");
        }
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock")).unwrap();
        assert!(
            lock.contains(&format!(
                "name = \"wasmtime\"\nversion = \"{WASMTIME_VERSION}\""
            )),
            "WASMTIME_VERSION is not the wasmtime in Cargo.lock"
        );
    }

    #[test]
    fn embed_then_find_gives_code_that_loads_and_strip_removes_it() {
        let Some(name) = section_name() else { return };
        let engine = Engine::default();
        let plain = module();
        let with = embed(&engine, &plain).unwrap();
        let code = find_section(&with, &name)
            .unwrap()
            .expect("section embedded");
        // SAFETY: the bytes were produced by `serialize` on this engine just above.
        let m = unsafe { Module::deserialize(&engine, code) }.unwrap();
        assert!(m.get_export("f").is_some());
        assert_eq!(find_section(&with, "keep").unwrap(), Some(&b"me"[..]));
        // Embedding twice replaces, never stacks.
        let again = embed(&engine, &with).unwrap();
        assert_eq!(again.len(), with.len());
        let stripped = strip(&with).unwrap();
        assert_eq!(stripped, plain);
        assert_eq!(find_section(&stripped, &name).unwrap(), None);
    }

    #[test]
    fn a_damaged_module_is_named_corrupt() {
        let mut bad = module();
        bad.truncate(bad.len() - 3);
        let e = find_section(&bad, "x").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Failed to parse corrupted Wasm module"),
            "{e}"
        );
        assert!(strip(b"not wasm").is_err());
    }
}
