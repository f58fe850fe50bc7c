//! What makes a file an Envoy dynamic module, read by the cache and by the dynamic-module pull
//! alike: its name (`lib<name>.so`) and the ELF header checks that decide the platform:
//! a 64-bit little-endian shared object (`ET_DYN`, what `dlopen` loads) whose `e_machine` is
//! the platform's. Read from the header bytes alone (the first 20), so a refused body is never
//! parsed further.

/// The layer that is the shared object itself, uncompressed (`dlopen` takes the bytes as is).
pub const LAYER: &str = "application/vnd.wasm-fetcher.dynamic-module.layer.v1+elf";
/// The child manifest's config: `{"os", "architecture", "envoyVersions"}`.
pub const CONFIG: &str = "application/vnd.wasm-fetcher.dynamic-module.config.v1+json";
/// The Envoy minor versions a child loads on, comma-separated (`1.40,1.41`), on the index's
/// descriptor of each child and on the child manifest.
pub const ENVOY_VERSIONS: &str = "dev.wasm-fetcher.envoy.versions";
/// The file name Envoy looks for, on the layer.
pub const TITLE: &str = "org.opencontainers.image.title";

/// How many leading bytes [`platform`] reads.
pub const HEADER_LEN: usize = 20;

const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The OCI `os/arch` a shared object is built for, or why it is not a dynamic module.
pub fn platform(head: &[u8]) -> Result<&'static str, String> {
    let h = head
        .get(..HEADER_LEN)
        .ok_or_else(|| format!("{} bytes, shorter than an ELF header", head.len()))?;
    if h[..4] != *b"\x7fELF" {
        return Err("no ELF magic (\\x7fELF) at the start".into());
    }
    if h[4] != 2 || h[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let e_type = u16::from_le_bytes([h[16], h[17]]);
    if e_type != ET_DYN {
        return Err(format!(
            "ELF type {e_type}, not a shared object (ET_DYN, 3): build it as a cdylib"
        ));
    }
    match u16::from_le_bytes([h[18], h[19]]) {
        EM_X86_64 => Ok("linux/amd64"),
        EM_AARCH64 => Ok("linux/arm64"),
        m => Err(format!(
            "ELF machine {m}, neither x86_64 (62) nor aarch64 (183)"
        )),
    }
}

/// The Rust target that builds a `.so` for `platform` (glibc, as Envoy's releases are).
pub fn rust_target(platform: &str) -> Option<&'static str> {
    match platform {
        "linux/amd64" => Some("x86_64-unknown-linux-gnu"),
        "linux/arm64" => Some("aarch64-unknown-linux-gnu"),
        _ => None,
    }
}

/// This host's `os/arch`, the platform a pull picks by default.
pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
}

/// `name` of a `lib<name>.so` file name: what Envoy's `dynamic_module_config.name` says.
pub fn module_name(file_name: &str) -> Result<&str, String> {
    file_name
        .strip_prefix("lib")
        .and_then(|n| n.strip_suffix(".so"))
        .filter(|n| {
            !n.is_empty()
                && n.len() <= 100
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
        .ok_or_else(|| {
            format!(
                "{:?} is not named lib<name>.so (letters, digits, _ and -), the name Envoy searches for",
                file_name.chars().take(120).collect::<String>()
            )
        })
}

/// An Envoy minor version as the annotation lists it: `MAJOR.MINOR`, digits only.
pub fn parse_envoy_version(v: &str) -> Result<String, String> {
    let ok = v.split_once('.').is_some_and(|(major, minor)| {
        [major, minor]
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
    });
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{:?} is not an Envoy minor version such as 1.40",
            v.chars().take(40).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = b"\x7fELF".to_vec();
        h.extend([class, 1, 1, 0]);
        h.extend([0; 8]);
        h.extend(e_type.to_le_bytes());
        h.extend(machine.to_le_bytes());
        h
    }

    #[test]
    fn only_a_64_bit_shared_object_for_a_known_machine_is_a_dynamic_module() {
        assert_eq!(platform(&header(2, 3, 62)), Ok("linux/amd64"));
        assert_eq!(platform(&header(2, 3, 183)), Ok("linux/arm64"));
        for (bytes, words) in [
            (header(2, 2, 62), "not a shared object"),
            (header(1, 3, 62), "64-bit"),
            (header(2, 3, 40), "machine 40"),
            (b"\0asm\x01\0\0\0".to_vec(), "shorter"),
            (vec![0u8; 32], "no ELF magic"),
        ] {
            let e = platform(&bytes).unwrap_err();
            assert!(e.contains(words), "{e}");
        }
    }
}
