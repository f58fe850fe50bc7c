//! The VM's contexts by id: its roots (one per plugin sharing the VM, a handful) and its live
//! streams ([`ContextTable`]).
//!
//! Each callback borrows the table for its duration. The host never calls into the VM while
//! a callback runs (a local reply, a callout's answer or a queue's notification comes after
//! the callback returns), so a borrow that fails would be a host bug: it is logged and the
//! callback answered as a pass-through would be, rather than trapping the VM.

use std::cell::RefCell;

use super::log;
use super::root::Root;
use super::stream::Stream;
use crate::context_table::ContextTable;

struct Contexts {
    roots: Vec<(u32, Root)>,
    streams: ContextTable<Stream>,
}

impl Contexts {
    fn root(&mut self, id: u32) -> Option<&mut Root> {
        self.roots
            .iter_mut()
            .find(|(held, _)| *held == id)
            .map(|(_, r)| r)
    }
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts {
        roots: Vec::new(),
        streams: ContextTable::new(),
    });
}

/// Runs `f` on the table; `None` if it is already borrowed (see the module's doc). Each
/// caller's `f` is a few lines routing to a role's callback, which is a function of its own
/// (`#[inline(never)]` there): one callback per compiled function keeps V8's optimizing
/// compiler, which compiles every function of the module, from working on one large body.
fn with<R>(what: &str, id: u32, f: impl FnOnce(&mut Contexts) -> Option<R>) -> Option<R> {
    let result = CONTEXTS.with(|c| c.try_borrow_mut().map(|mut c| f(&mut c)));
    match result {
        Ok(Some(found)) => Some(found),
        Ok(None) => {
            unknown(what, id);
            None
        }
        Err(_) => {
            busy(what, id);
            None
        }
    }
}

#[cold]
#[inline(never)]
fn unknown(what: &str, id: u32) {
    log!(Warn, "{what} for unknown context {id}: ignored");
}

#[cold]
#[inline(never)]
fn busy(what: &str, id: u32) {
    log!(
        Error,
        "{what} for context {id} while another callback runs: ignored"
    );
}

/// A new root (`root_id` 0) or a new stream of the root `root_id`.
pub fn create(id: u32, root_id: u32) {
    with("context creation", id, |c| {
        if root_id == 0 {
            c.roots.retain(|(held, _)| *held != id);
            c.roots.push((id, Root::new()));
            return Some(());
        }
        let stream = c.root(root_id).map(|r| r.new_stream());
        if stream.is_none() {
            log!(
                Warn,
                "stream {id} of unknown root {root_id}: passed through"
            );
        }
        c.streams.insert(id, stream.unwrap_or(Stream::PassThrough));
        Some(())
    });
}

/// Ends a stream (its role's last word, see [`Stream::end`]) or a root, and drops its state.
pub fn delete(id: u32) {
    with("context deletion", id, |c| {
        if let Some(mut stream) = c.streams.remove(id) {
            stream.end();
            return Some(());
        }
        let before = c.roots.len();
        c.roots.retain(|(held, _)| *held != id);
        (c.roots.len() < before).then_some(())
    });
}

pub fn with_root<R>(what: &str, id: u32, f: impl FnOnce(&mut Root) -> R) -> Option<R> {
    with(what, id, |c| c.root(id).map(f))
}

pub fn with_stream<R>(what: &str, id: u32, f: impl FnOnce(&mut Stream) -> R) -> Option<R> {
    with(what, id, |c| c.streams.get_mut(id).map(f))
}
