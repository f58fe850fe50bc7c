//! `proxy_call_foreign_function` and the functions Envoy registers for it (its `foreign.cc`).
//!
//! Emulated: `compress` / `uncompress` (zlib format; the compressed bytes may differ from
//! Envoy's zlib build, what decompresses from them does not), `clear_route_cache` (the
//! harness routes after the filters anyway) and `set_envoy_filter_state` (into the
//! connection's [`super::filter_state`], which `tcp_proxy` and the `filter_state` property
//! read). Envoy's others (`declare_property`, `sign`, `verify_signature`, `expr_create` /
//! `expr_evaluate` / `expr_delete`) need Envoy's protobufs, crypto or CEL: they answer
//! `NotFound`, as an unknown name does, and the log says the harness lacks them. Any other
//! name is `NotFound`, as in Envoy.

use std::io::{Read, Write};

use wasmtime::{Caller, Linker};

use super::filter_state::{FilterState, Refusal, MAX_FILTER_STATE_BYTES};
use super::{hostcall, logging, memory, HostError, HostState};
use crate::engine::abi::{LogLevel, Status};

/// Registered in Envoy, not emulated here.
const ENVOY_ONLY: &[&str] = &[
    "declare_property",
    "sign",
    "verify_signature",
    "expr_create",
    "expr_evaluate",
    "expr_delete",
];

/// Runs the named function: `Ok(Some(bytes))` is a result for the guest, `Ok(None)` none.
fn run(name: &str, args: &[u8]) -> Result<Option<Vec<u8>>, Status> {
    match name {
        "compress" => {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(args)
                .map_err(|_| Status::SerializationFailure)?;
            z.finish()
                .map(Some)
                .map_err(|_| Status::SerializationFailure)
        }
        "uncompress" => uncompress(args)
            .map(Some)
            .map_err(|_| Status::SerializationFailure),
        "clear_route_cache" => Ok(None),
        _ => Err(Status::NotFound),
    }
}

/// The most bytes `uncompress` inflates to: a few KiB of zlib can claim gigabytes, and the
/// result must fit the guest's memory besides.
pub const MAX_UNCOMPRESSED_BYTES: usize = 64 << 20;

/// Why `uncompress` gave no result.
#[derive(Debug, PartialEq, Eq)]
enum Inflate {
    Corrupt,
    TooLarge,
}

/// Inflates zlib `args`, stopping (without keeping more) once the output would pass
/// [`MAX_UNCOMPRESSED_BYTES`].
fn uncompress(args: &[u8]) -> Result<Vec<u8>, Inflate> {
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(args)
        .take(MAX_UNCOMPRESSED_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| Inflate::Corrupt)?;
    if out.len() > MAX_UNCOMPRESSED_BYTES {
        return Err(Inflate::TooLarge);
    }
    Ok(out)
}

/// cpp-host's `call_foreign_function`: the result goes to memory the guest allocates
/// (`ret_ptr` 0: the caller does not want it); `(address, size)` are written whenever their
/// pointers are non-zero, `(0, 0)` if the function produced nothing; then the status.
fn proxy_call_foreign_function(
    mut caller: Caller<'_, HostState>,
    name: i32,
    name_size: i32,
    args: i32,
    args_size: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| -> Result<(), HostError> {
        let name = memory::read_string(&caller, name, name_size)?;
        let args = memory::read(&caller, args, args_size)?;
        if ENVOY_ONLY.contains(&name.as_str()) {
            logging::record(
                caller.data(),
                LogLevel::Warn,
                format!("wasm-harness: foreign function {name:?} exists in Envoy but is not emulated by the harness; answered NotFound"),
            );
        }
        let outcome = match name.as_str() {
            "set_envoy_filter_state" => set_envoy_filter_state(caller.data(), &args).map(|()| None),
            "uncompress" => uncompress(&args).map(Some).map_err(|e| {
                if e == Inflate::TooLarge {
                    logging::record(
                        caller.data(),
                        LogLevel::Critical,
                        format!("foreign function uncompress: the data inflates past the harness's limit of {MAX_UNCOMPRESSED_BYTES} bytes: refused (SerializationFailure)"),
                    );
                }
                Status::SerializationFailure
            }),
            _ => run(&name, &args),
        };
        let result = match &outcome {
            Ok(Some(bytes)) => bytes.as_slice(),
            _ => &[],
        };
        let mut address = 0i32;
        if ret_ptr != 0 && outcome.as_ref().is_ok_and(Option::is_some) {
            address = memory::alloc_in_guest(&mut caller, result)?;
        }
        if ret_ptr != 0 {
            memory::write_u32(&mut caller, ret_ptr, address as u32)?;
        }
        if ret_size != 0 {
            memory::write_u32(&mut caller, ret_size, result.len() as u32)?;
        }
        outcome.map(|_| ()).map_err(Into::into)
    })
}

/// `SetEnvoyFilterStateArguments` (`path` = 1, `value` = 2, `span` = 3) from protobuf wire
/// bytes; `None` where Envoy's `ParseFromString` fails. Unknown fields are skipped, as
/// protobuf does; the life span does not change what the harness stores.
fn filter_state_arguments(mut bytes: &[u8]) -> Option<(String, Vec<u8>)> {
    fn varint(bytes: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (b, rest) = bytes.split_first()?;
            *bytes = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let (mut path, mut value) = (String::new(), Vec::new());
    while !bytes.is_empty() {
        let tag = varint(&mut bytes)?;
        match tag & 7 {
            0 => {
                varint(&mut bytes)?;
            }
            1 | 5 => {
                let n = if tag & 7 == 1 { 8 } else { 4 };
                bytes = bytes.get(n..)?;
            }
            2 => {
                let n = usize::try_from(varint(&mut bytes)?).ok()?;
                let field = bytes.get(..n)?;
                bytes = &bytes[n..];
                // proto3 strings must be UTF-8 for the parse to succeed.
                match tag >> 3 {
                    1 => path = String::from_utf8(field.to_vec()).ok()?,
                    2 => value = String::from_utf8(field.to_vec()).ok()?.into_bytes(),
                    _ => {}
                }
            }
            _ => return None,
        }
        if tag >> 3 == 0 {
            return None;
        }
    }
    Some((path, value))
}

/// Envoy's `setEnvoyFilterState`: the key's factory (`NotFound` without one), its parse of
/// the value (`BadArgument`), then the stream (`NotFound` for a root context), then the object
/// stored in the connection's filter state.
fn set_envoy_filter_state(state: &HostState, args: &[u8]) -> Result<(), Status> {
    let (key, value) = filter_state_arguments(args).ok_or(Status::BadArgument)?;
    let outcome = match state.connection() {
        Some(c) => c.with_filter_state(|fs| fs.set(&key, &value)),
        None => FilterState::default()
            .set(&key, &value)
            .and(Err(Refusal::UnknownKey)),
    };
    outcome.map_err(|refusal| {
        match &refusal {
            Refusal::NotEmulated => logging::record(
                state,
                LogLevel::Warn,
                format!("wasm-harness: set_envoy_filter_state: the values Envoy's factory for {key:?} accepts are not emulated by the harness; answered BadArgument"),
            ),
            Refusal::TooLarge => logging::record(
                state,
                LogLevel::Critical,
                format!("set_envoy_filter_state: the filter state would pass the harness's limit of {MAX_FILTER_STATE_BYTES} bytes: refused (BadArgument)"),
            ),
            Refusal::UnknownKey | Refusal::BadValue => {}
        }
        refusal.status()
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        proxy_call_foreign_function,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_and_uncompress_round_trip_and_garbage_is_a_serialization_failure() {
        let data = b"hello hello hello hello hello".to_vec();
        let z = run("compress", &data).unwrap().unwrap();
        assert_eq!(z[0], 0x78, "zlib header");
        assert_eq!(run("uncompress", &z).unwrap().unwrap(), data);
        assert_eq!(
            run("uncompress", b"not zlib"),
            Err(Status::SerializationFailure)
        );
        assert_eq!(run("clear_route_cache", b""), Ok(None));
        assert_eq!(run("no_such_function", b""), Err(Status::NotFound));
        assert_eq!(run("declare_property", b""), Err(Status::NotFound));
    }

    #[test]
    fn filter_state_arguments_are_read_from_protobuf_wire_bytes() {
        // path "a.b", value "v", span 2, and an unknown fixed32 field 9.
        let bytes = [
            0x0a, 3, b'a', b'.', b'b', 0x12, 1, b'v', 0x18, 2, 0x4d, 1, 2, 3, 4,
        ];
        assert_eq!(
            filter_state_arguments(&bytes),
            Some(("a.b".to_string(), b"v".to_vec()))
        );
        assert_eq!(filter_state_arguments(&[0xff, 0xff, 0xff]), None);
        assert_eq!(filter_state_arguments(&[0x0a, 5, b'a']), None, "truncated");
        assert_eq!(filter_state_arguments(&[0x0a, 1, 0xff]), None, "not UTF-8");
        assert_eq!(
            filter_state_arguments(&[]),
            Some((String::new(), Vec::new()))
        );
    }

    #[test]
    fn a_zlib_bomb_is_refused_at_the_limit_not_inflated_whole() {
        // 64 KiB of zlib that inflates to 64 MiB and 1 byte more.
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(MAX_UNCOMPRESSED_BYTES >> 20) {
            z.write_all(&zeros).unwrap();
        }
        z.write_all(&[0]).unwrap();
        let bomb = z.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        assert_eq!(uncompress(&bomb), Err(Inflate::TooLarge));
        assert_eq!(run("uncompress", &bomb), Err(Status::SerializationFailure));
    }
}
