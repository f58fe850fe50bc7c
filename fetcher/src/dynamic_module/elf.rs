//! The ELF header checks that decide whether a file is an Envoy dynamic module for a platform:
//! a 64-bit little-endian shared object (`ET_DYN`, what `dlopen` loads) whose `e_machine` is
//! the platform's. Read from the header bytes alone (the first 20), so a refused body is never
//! parsed further.

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

/// This host's `os/arch`, the platform a pull picks by default.
pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
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
