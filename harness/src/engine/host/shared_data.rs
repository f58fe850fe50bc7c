//! `proxy_get_shared_data` / `proxy_set_shared_data`: one store per vm_id shared by every VM
//! of the host, with cpp-host's CAS rules (one global counter from 1; a mismatch only when the
//! key exists and a non-zero cas differs; a missing key is written whatever the cas).

use std::collections::HashMap;

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::{held, hostcall, memory, HostState};
use crate::engine::abi::Status;

#[derive(Debug)]
pub struct SharedData {
    by_vm: HashMap<String, HashMap<String, (Vec<u8>, u32)>>,
    next_cas: u32,
}

impl Default for SharedData {
    fn default() -> Self {
        Self {
            by_vm: HashMap::new(),
            next_cas: 1,
        }
    }
}

impl SharedData {
    fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        cas
    }

    pub fn get(&self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        self.by_vm.get(vm_id)?.get(key).cloned()
    }

    /// Writes `value` under `key` (cpp-host's CAS rules); returns the bytes of the value it
    /// replaced, if any.
    pub fn set(
        &mut self,
        vm_id: &str,
        key: &str,
        value: Vec<u8>,
        cas: u32,
    ) -> Result<Option<usize>, Status> {
        let exists = self
            .by_vm
            .get(vm_id)
            .and_then(|m| m.get(key))
            .map(|(_, c)| *c);
        if let Some(current) = exists {
            if cas != 0 && cas != current {
                return Err(Status::CasMismatch);
            }
        }
        let cas = self.next_cas();
        let old = self
            .by_vm
            .entry(vm_id.to_string())
            .or_default()
            .insert(key.to_string(), (value, cas));
        Ok(old.map(|(v, _)| key.len() + v.len()))
    }

    /// Every key of a vm_id, for reports and expectations.
    pub fn snapshot(&self, vm_id: &str) -> Vec<(String, Vec<u8>, u32)> {
        let mut out: Vec<_> = self
            .by_vm
            .get(vm_id)
            .into_iter()
            .flatten()
            .map(|(k, (v, c))| (k.clone(), v.clone(), *c))
            .collect();
        out.sort();
        out
    }
}

pub fn vm_id(state: &HostState) -> String {
    state
        .plugin_of(state.context_id())
        .map(|p| p.vm_id.clone())
        .unwrap_or_else(|| state.vm_id.clone())
}

fn proxy_get_shared_data(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_size: i32,
    ret_ptr: i32,
    ret_size: i32,
    ret_cas: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let key = memory::read_string(&caller, key_ptr, key_size)?;
        let vm = vm_id(caller.data());
        let found = lock(&caller.data().shared.data).get(&vm, &key);
        let (value, cas) = found.ok_or(Status::NotFound)?;
        memory::copy_out(&mut caller, &value, ret_ptr, ret_size)?;
        memory::write_u32(&mut caller, ret_cas, cas)
    })
}

fn proxy_set_shared_data(
    caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_size: i32,
    value_ptr: i32,
    value_size: i32,
    cas: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let size = memory::check(&caller, key_ptr, key_size)?
            + memory::check(&caller, value_ptr, value_size)?
            + held::ENTRY_OVERHEAD;
        held::hold(caller.data(), size, "proxy_set_shared_data")?;
        let stored = (|| {
            let key = memory::read_string(&caller, key_ptr, key_size)?;
            let value = memory::read(&caller, value_ptr, value_size)?;
            let vm = vm_id(caller.data());
            let replaced = lock(&caller.data().shared.data).set(&vm, &key, value, cas as u32)?;
            Ok(replaced)
        })();
        // What is no longer held: the value replaced, or the new one if it was not stored.
        let freed = match &stored {
            Ok(replaced) => replaced.map_or(0, |r| r + held::ENTRY_OVERHEAD),
            Err(_) => size,
        };
        caller.data().shared.held.release(freed);
        stored.map(|_| ())
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_shared_data", proxy_get_shared_data)?;
    linker.func_wrap("env", "proxy_set_shared_data", proxy_set_shared_data)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_rules_match_cpp_host() {
        let mut d = SharedData::default();
        d.set("vm", "k", b"a".to_vec(), 42).unwrap(); // missing key: written whatever the cas
        let (_, c1) = d.get("vm", "k").unwrap();
        assert_eq!(c1, 1);
        assert_eq!(
            d.set("vm", "k", b"b".to_vec(), c1 + 7),
            Err(Status::CasMismatch)
        );
        d.set("vm", "k", b"b".to_vec(), c1).unwrap();
        assert_eq!(d.get("vm", "k").unwrap(), (b"b".to_vec(), 2));
        d.set("vm", "k", b"c".to_vec(), 0).unwrap(); // 0: unconditional
        assert_eq!(d.get("other", "k"), None); // namespaces are per vm_id
    }
}
