//! Read-modify-write of one shared-data key, safe when several worker VMs do it at once:
//! each write carries the CAS token of the read it was computed from, and a `CasMismatch`
//! (another worker wrote in between) reads again and recomputes.
//!
//! The ABI has no create-if-absent: a write with token 0 is unconditional. So an absent key
//! is first created empty (every role reads empty as its zero state) and the update then
//! runs on that, with a real token.

use proxy_wasm::types::Status;

use super::host;
use crate::quote::Quoted;

/// Retries before giving up; only heavy contention on one key gets there.
pub const MAX_CAS_ATTEMPTS: u32 = 16;

/// Applies `f` to the key's current value (`None` or empty when there is none yet) and
/// stores what it returns; gives back `f`'s other result. The error is one line for the log.
pub fn update<T>(
    key: &str,
    mut f: impl FnMut(Option<&[u8]>) -> Result<(String, T), String>,
) -> Result<T, String> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = host::shared_data(key).map_err(|s| {
            format!(
                "reading shared data {} failed with host status {s:?}",
                Quoted(key)
            )
        })?;
        if value.is_none() {
            if let Err(status) = host::set_shared_data(key, b"", 0) {
                return Err(format!(
                    "creating shared data {} failed with host status {status:?}",
                    Quoted(key)
                ));
            }
            continue;
        }
        let (new, out) = f(value.as_deref())?;
        match host::set_shared_data(key, new.as_bytes(), cas) {
            Ok(()) => return Ok(out),
            Err(Status::CasMismatch) => continue,
            Err(status) => {
                return Err(format!(
                    "writing shared data {} failed with host status {status:?}",
                    Quoted(key)
                ))
            }
        }
    }
    Err(format!(
        "shared data {}: gave up after {MAX_CAS_ATTEMPTS} compare-and-swap attempts (other workers kept changing it)",
        Quoted(key)
    ))
}
