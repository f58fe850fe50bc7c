//! Shared queues, keyed by (vm_id, name) across all VMs. Each enqueue notifies the root
//! context that registered the queue last: the notification is recorded here, and the proxy
//! delivers it (`proxy_on_queue_ready`) once the callback that enqueued has returned, as Envoy
//! posts it to the registrant's thread.

use std::collections::{HashMap, VecDeque};

use wasm_common::sync::lock;
use wasmtime::{Caller, Linker};

use super::{held, hostcall, memory, shared_data::vm_id, HostState};
use crate::engine::abi::Status;

/// Who gets a queue's notifications: a root context in one VM instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receiver {
    /// The VM instance ([`HostState::instance`]).
    pub instance: u64,
    /// `None`: the canary VM, gone once the configuration is accepted.
    pub worker: Option<usize>,
    pub root: u32,
}

/// A `proxy_on_queue_ready(root, token)` still to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    pub receiver: Receiver,
    pub token: u32,
}

#[derive(Debug)]
pub struct Queue {
    pub vm_id: String,
    pub name: String,
    pub items: VecDeque<Vec<u8>>,
    /// The last registrant.
    pub receiver: Receiver,
}

#[derive(Debug)]
pub struct Queues {
    pub by_token: HashMap<u32, Queue>,
    next_token: u32,
    /// Notifications to deliver, oldest first.
    pub ready: VecDeque<Notification>,
}

impl Default for Queues {
    fn default() -> Self {
        Self {
            by_token: HashMap::new(),
            next_token: 1,
            ready: VecDeque::new(),
        }
    }
}

impl Queues {
    pub fn find(&self, vm_id: &str, name: &str) -> Option<u32> {
        self.by_token
            .iter()
            .find(|(_, q)| q.vm_id == vm_id && q.name == name)
            .map(|(t, _)| *t)
    }

    /// Creates the queue or re-opens it keeping its items; either way the caller becomes the
    /// receiver of its notifications.
    pub fn register(&mut self, vm_id: &str, name: &str, receiver: Receiver) -> u32 {
        if let Some(t) = self.find(vm_id, name) {
            if let Some(q) = self.by_token.get_mut(&t) {
                q.receiver = receiver;
            }
            return t;
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        self.by_token.insert(
            token,
            Queue {
                vm_id: vm_id.to_string(),
                name: name.to_string(),
                items: VecDeque::new(),
                receiver,
            },
        );
        token
    }
}

fn proxy_register_shared_queue(
    mut caller: Caller<'_, HostState>,
    name_ptr: i32,
    name_size: i32,
    ret_token: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let name = memory::read_string(&caller, name_ptr, name_size)?;
        let state = caller.data();
        let receiver = Receiver {
            instance: state.instance,
            worker: state.worker,
            root: state.root_of(state.context_id()).unwrap_or(0),
        };
        let vm = vm_id(state);
        let mut queues = lock(&state.shared.queues);
        if queues.find(&vm, &name).is_none() {
            // A new queue lives as long as the proxy: its names are held like its items.
            let size = vm.len() + name.len() + held::ENTRY_OVERHEAD;
            held::hold(state, size, "proxy_register_shared_queue")?;
        }
        let token = queues.register(&vm, &name, receiver);
        drop(queues);
        memory::write_u32(&mut caller, ret_token, token)
    })
}

fn proxy_resolve_shared_queue(
    mut caller: Caller<'_, HostState>,
    vm_ptr: i32,
    vm_size: i32,
    name_ptr: i32,
    name_size: i32,
    ret_token: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let mut vm = memory::read_string(&caller, vm_ptr, vm_size)?;
        let name = memory::read_string(&caller, name_ptr, name_size)?;
        if vm.is_empty() {
            vm = vm_id(caller.data());
        }
        let token = lock(&caller.data().shared.queues)
            .find(&vm, &name)
            .ok_or(Status::NotFound)?;
        memory::write_u32(&mut caller, ret_token, token)
    })
}

fn proxy_enqueue_shared_queue(
    caller: Caller<'_, HostState>,
    token: i32,
    value_ptr: i32,
    value_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let size = memory::check(&caller, value_ptr, value_size)? + held::ENTRY_OVERHEAD;
        let token = token as u32;
        let known = lock(&caller.data().shared.queues)
            .by_token
            .contains_key(&token);
        if !known {
            return Err(Status::NotFound.into());
        }
        held::hold(caller.data(), size, "proxy_enqueue_shared_queue")?;
        let value = memory::read(&caller, value_ptr, value_size)?;
        let mut queues = lock(&caller.data().shared.queues);
        let Some(q) = queues.by_token.get_mut(&token) else {
            caller.data().shared.held.release(size);
            return Err(Status::NotFound.into());
        };
        q.items.push_back(value);
        let receiver = q.receiver;
        queues.ready.push_back(Notification { receiver, token });
        caller
            .data()
            .shared
            .posted
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    })
}

fn proxy_dequeue_shared_queue(
    mut caller: Caller<'_, HostState>,
    token: i32,
    ret_ptr: i32,
    ret_size: i32,
) -> wasmtime::Result<i32> {
    hostcall(|| {
        let item = {
            let mut queues = lock(&caller.data().shared.queues);
            let q = queues
                .by_token
                .get_mut(&(token as u32))
                .ok_or(Status::NotFound)?;
            q.items.pop_front().ok_or(Status::Empty)?
        };
        caller
            .data()
            .shared
            .held
            .release(item.len() + held::ENTRY_OVERHEAD);
        memory::copy_out(&mut caller, &item, ret_ptr, ret_size)
    })
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        proxy_register_shared_queue,
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        proxy_resolve_shared_queue,
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        proxy_enqueue_shared_queue,
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        proxy_dequeue_shared_queue,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver(instance: u64, root: u32) -> Receiver {
        Receiver {
            instance,
            worker: Some(0),
            root,
        }
    }

    #[test]
    fn registering_again_keeps_the_token_and_items_and_moves_the_receiver() {
        let mut q = Queues::default();
        let t = q.register("vm", "jobs", receiver(1, 1));
        assert_eq!(t, 1);
        q.by_token
            .get_mut(&t)
            .unwrap()
            .items
            .push_back(b"x".to_vec());
        assert_eq!(q.register("vm", "jobs", receiver(2, 3)), t);
        let queue = &q.by_token[&t];
        assert_eq!(queue.items.len(), 1);
        assert_eq!(queue.receiver, receiver(2, 3));
        // Same name under another vm_id is another queue.
        assert_eq!(q.register("other", "jobs", receiver(1, 1)), 2);
        assert_eq!(q.find("vm", "jobs"), Some(1));
        assert_eq!(q.find("vm", "nope"), None);
    }
}
