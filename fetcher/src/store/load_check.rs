//! Whether Envoy can load a `.so` as a dynamic module, decided from its bytes before anything
//! is cached or offered to Envoy. Envoy guards none of this itself: a file it cannot map whole
//! kills it (SIGBUS), and a module reporting another ABI version is loaded after a warning.
//!
//! The checks, in order: the ELF header names a shared object for a known platform
//! ([`super::shared_object::platform`]); every header, segment and section lies inside the file
//! (a truncated file is refused here); the module defines `envoy_dynamic_module_on_program_init`
//! among its dynamic symbols; every `envoy_dynamic_module_callback_*` it names, as an undefined
//! symbol the dynamic linker binds or as a NUL-terminated string it looks up with `dlsym`, is
//! one the target Envoy exports; and the ABI version it carries (the NUL-terminated
//! `vMAJOR.MINOR.PATCH` that `on_program_init` returns) is the one that Envoy speaks. Nothing
//! in the module is run: the version is the one its read-only data holds.

use std::collections::BTreeSet;

use object::read::elf::{ElfFile64, ProgramHeader, SectionHeader};
use object::{elf, Endianness, Object, ObjectSymbol};

use super::envoy_abi::EnvoyAbi;
use super::shared_object;

/// The symbol every dynamic module defines; Envoy calls it first.
pub const PROGRAM_INIT: &str = "envoy_dynamic_module_on_program_init";
/// The prefix of every function Envoy exports to modules.
pub const CALLBACK_PREFIX: &str = "envoy_dynamic_module_callback_";

/// A module that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loadable {
    /// `os/arch`, from the ELF header.
    pub platform: &'static str,
    /// The ABI version it reports, the target Envoy's.
    pub abi_version: String,
    /// How many distinct Envoy callbacks it names.
    pub callbacks: usize,
}

/// Why Envoy cannot load the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a complete ELF shared object with a module's entry point.
    Malformed(String),
    /// A module, but not for this Envoy's ABI.
    Abi(String),
}

/// Checks `bytes` against `abi`.
pub fn check(bytes: &[u8], abi: &EnvoyAbi) -> Result<Loadable, Refused> {
    let platform = shared_object::platform(bytes).map_err(Refused::Malformed)?;
    let file = ElfFile64::<Endianness>::parse(bytes).map_err(|e| {
        Refused::Malformed(format!(
            "not a complete ELF file ({e}): truncated or corrupt"
        ))
    })?;
    complete(&file, bytes.len() as u64).map_err(Refused::Malformed)?;
    let mut exported = false;
    let mut named = BTreeSet::new();
    for symbol in file.dynamic_symbols() {
        let Ok(name) = symbol.name() else { continue };
        if symbol.is_undefined() {
            if name.starts_with(CALLBACK_PREFIX) {
                // The rule the string scan keeps, so a crafted symbol table cannot grow the
                // set or a message without bound.
                if name.len() > MAX_NAME || !name.bytes().all(is_word) {
                    return Err(Refused::Malformed(format!(
                        "an imported symbol starting {CALLBACK_PREFIX} is over {MAX_NAME} bytes \
                         or not letters, digits and underscores: corrupt"
                    )));
                }
                named.insert(name.to_string());
                if named.len() > abi.callbacks.len() + MAX_UNKNOWN {
                    return Err(too_many(abi));
                }
            }
        } else if name == PROGRAM_INIT && symbol.kind() == object::SymbolKind::Text {
            exported = true;
        }
    }
    if !exported {
        return Err(Refused::Malformed(format!(
            "it does not export {PROGRAM_INIT}, the function Envoy calls first: build it with \
             an Envoy dynamic-module SDK as a cdylib"
        )));
    }
    named.extend(looked_up(bytes, abi.callbacks.len() + MAX_UNKNOWN + 1));
    if named.len() > abi.callbacks.len() + MAX_UNKNOWN {
        return Err(too_many(abi));
    }
    let missing: Vec<String> = named.iter().filter(|n| !abi.exports(n)).cloned().collect();
    if !missing.is_empty() {
        return Err(Refused::Abi(format!(
            "it calls {} that Envoy {} does not export: {}",
            if missing.len() == 1 {
                "a callback"
            } else {
                "callbacks"
            },
            abi.envoy_version,
            first_of(&missing)
        )));
    }
    let versions = abi_versions(bytes);
    if !versions.contains(&abi.abi_version) {
        let found = if versions.is_empty() {
            "no ABI version (no NUL-terminated vMAJOR.MINOR.PATCH string)".to_string()
        } else {
            format!("ABI {}", crate::shown::listed(versions))
        };
        return Err(Refused::Abi(format!(
            "it reports {found}, and Envoy {} speaks {} (it would load it anyway, with a \
             warning): build it against Envoy {}'s SDK",
            abi.envoy_version, abi.abi_version, abi.envoy_version
        )));
    }
    Ok(Loadable {
        platform,
        abi_version: abi.abi_version.clone(),
        callbacks: named.len(),
    })
}

/// A callback name is at most this long (Envoy's longest is under 100 bytes).
const MAX_NAME: usize = 200;

/// Callback names beyond the target Envoy's that a module may name before it is refused
/// without listing them: enough for any real module built for a newer Envoy.
const MAX_UNKNOWN: usize = 64;

fn too_many(abi: &EnvoyAbi) -> Refused {
    Refused::Abi(format!(
        "it names more than {} callbacks Envoy {} does not export: built for another Envoy, \
         or corrupt",
        MAX_UNKNOWN, abi.envoy_version
    ))
}

/// Callback names (word characters only, at most 200 each) as one part of a message: the
/// first five whole, then how many more.
fn first_of(names: &[String]) -> String {
    let mut out = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        out.push_str(&format!(" and {} more", names.len() - 5));
    }
    out
}

/// Every segment and every section with bytes in the file ends inside it, and the module has
/// a dynamic segment (what `dlopen` reads its symbols from).
fn complete(file: &ElfFile64<Endianness>, len: u64) -> Result<(), String> {
    let endian = file.endian();
    let past = |what: String, offset: u64, size: u64| {
        let end = offset.checked_add(size);
        match end {
            Some(end) if end <= len => Ok(()),
            _ => Err(format!(
                "{what} ends at byte {}, past the end of the file ({len} bytes): the file is \
                 truncated or corrupt",
                end.map_or_else(|| "beyond 2^64".to_string(), |e| e.to_string())
            )),
        }
    };
    let mut dynamic = false;
    for (i, ph) in file.elf_program_headers().iter().enumerate() {
        let p_type = ph.p_type(endian);
        dynamic |= p_type == elf::PT_DYNAMIC;
        past(
            format!("segment {i} (type {p_type:#x})"),
            ph.p_offset(endian),
            ph.p_filesz(endian),
        )?;
        if p_type == elf::PT_LOAD && ph.p_filesz(endian) > ph.p_memsz(endian) {
            return Err(format!(
                "segment {i} holds more bytes in the file than in memory: corrupt"
            ));
        }
    }
    if !dynamic {
        return Err("it has no dynamic segment: not a shared object dlopen can load".into());
    }
    for (i, sh) in file.elf_section_table().iter().enumerate() {
        let t = sh.sh_type(endian);
        if t == elf::SHT_NOBITS || t == elf::SHT_NULL {
            continue;
        }
        past(
            format!("section {i}"),
            sh.sh_offset(endian),
            sh.sh_size(endian),
        )?;
    }
    Ok(())
}

/// Occurrences of `needle` in `hay`, by start offset.
fn positions<'a>(hay: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    hay.windows(needle.len())
        .enumerate()
        .filter(move |(_, w)| *w == needle)
        .map(|(i, _)| i)
}

/// The callbacks named by NUL-terminated strings (what a module that binds its callbacks
/// with `dlsym` when loaded carries instead of undefined symbols).
fn looked_up(bytes: &[u8], limit: usize) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for start in positions(bytes, CALLBACK_PREFIX.as_bytes()) {
        if start > 0 && is_word(bytes[start - 1]) {
            continue;
        }
        let rest = &bytes[start..];
        // Read no further than a name can be long, so a run of prefixes costs linear time.
        let Some(end) = rest.iter().take(MAX_NAME + 1).position(|b| !is_word(*b)) else {
            continue;
        };
        if rest.get(end) == Some(&0) && end > CALLBACK_PREFIX.len() {
            out.insert(String::from_utf8_lossy(&rest[..end]).into_owned());
            if out.len() >= limit {
                break;
            }
        }
    }
    out
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The NUL-terminated `vMAJOR.MINOR.PATCH` strings the module carries, each standing alone
/// (not the tail of a longer word).
fn abi_versions(bytes: &[u8]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'v') {
        if i > 0 && (is_word(bytes[i - 1]) || matches!(bytes[i - 1], b'.' | b'-')) {
            continue;
        }
        let rest = &bytes[i + 1..];
        let end = rest
            .iter()
            .take(32)
            .position(|b| !(b.is_ascii_digit() || *b == b'.'));
        let Some(end) = end else { continue };
        let body = &rest[..end];
        let parts: Vec<&[u8]> = body.split(|b| *b == b'.').collect();
        let ok =
            rest.get(end) == Some(&0) && parts.len() == 3 && parts.iter().all(|p| !p.is_empty());
        if ok && out.len() < 64 {
            out.insert(format!("v{}", String::from_utf8_lossy(body)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_names_and_versions_are_read_only_when_they_stand_alone() {
        let bytes = b"\0envoy_dynamic_module_callback_a\0xenvoy_dynamic_module_callback_b\0\
                      envoy_dynamic_module_callback_c and\0v0.2.0\0xv0.1.0\0v1.2\0v0.3.0";
        assert_eq!(
            looked_up(bytes, usize::MAX).into_iter().collect::<Vec<_>>(),
            ["envoy_dynamic_module_callback_a"]
        );
        assert_eq!(
            abi_versions(bytes).into_iter().collect::<Vec<_>>(),
            ["v0.2.0"]
        );
        // A name past 200 bytes is no name, and the scan reads no further than that.
        let mut run = CALLBACK_PREFIX.repeat(100_000).into_bytes();
        run.push(0);
        assert!(looked_up(&run, usize::MAX).is_empty());
        let many: Vec<u8> = (0..1000)
            .flat_map(|i| format!("{CALLBACK_PREFIX}n{i}\0").into_bytes())
            .collect();
        assert_eq!(looked_up(&many, 10).len(), 10);
    }

    #[test]
    fn a_file_that_is_not_an_elf_shared_object_is_malformed() {
        let abi = EnvoyAbi::of("1.40").unwrap();
        for bytes in [b"not elf at all, not even close".to_vec(), vec![0u8; 64]] {
            assert!(matches!(check(&bytes, &abi), Err(Refused::Malformed(_))));
        }
        // A header that passes the first checks, and nothing behind it.
        let mut h = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0".to_vec();
        h.extend(3u16.to_le_bytes());
        h.extend(62u16.to_le_bytes());
        h.extend([0; 44]);
        let Err(Refused::Malformed(e)) = check(&h, &abi) else {
            panic!("accepted")
        };
        assert!(
            e.contains("dynamic segment") || e.contains("complete"),
            "{e}"
        );
    }
}
