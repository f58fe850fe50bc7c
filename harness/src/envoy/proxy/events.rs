//! What Envoy's worker dispatchers do between requests, on the harness's virtual clock: tick
//! timers firing `proxy_on_tick` on each worker's root contexts, and the queue notifications
//! posted by `proxy_enqueue_shared_queue` reaching `proxy_on_queue_ready` on the registrant.
//!
//! Nothing here runs inside a VM call: hostcalls only record (a timer's due time, a pending
//! notification) and the proxy delivers once the callback has returned, so no VM is ever
//! entered while it is executing.

use std::time::{Duration, Instant};
use wasm_common::sync::lock;

use super::callouts;
use super::threads::Threads;
use crate::engine::host::time::format_duration;

/// How many queue notifications one delivery round may make before the harness calls it a
/// storm (roots enqueueing to each other from `proxy_on_queue_ready` forever). Envoy would
/// keep its worker busy with them; the harness stops and reports it.
pub const MAX_QUEUE_DELIVERIES: usize = 10_000;

/// How many callouts one delivery round may answer before the harness calls it a storm
/// (completions that keep making new calls).
pub const MAX_CALL_DELIVERIES: usize = 10_000;

/// A problem while running posted work; the run goes on, and the caller reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error(
        "proxy_on_queue_ready never settled: {delivered} queue notifications were delivered one after another and each produced more (queues feeding each other forever?); the harness dropped the {dropped} still pending at virtual time {at}"
    )]
    QueueStorm {
        delivered: usize,
        dropped: usize,
        /// Virtual time since start, e.g. `3s`.
        at: String,
    },
    #[error(
        "callouts never settled: the harness answers at most {} calls in one round and answered {answered} ({}), then dropped the {dropped} still pending unanswered, at virtual time {at}",
        MAX_CALL_DELIVERIES,
        storm_cause(*.made_by_completions)
    )]
    CalloutStorm {
        answered: usize,
        dropped: usize,
        /// How many of the calls (answered or dropped) completion callbacks made; the rest
        /// were pending when the round began.
        made_by_completions: usize,
        at: String,
    },
    #[error(
        "callouts to loopback upstreams took longer than the harness's budget of {} for one round: {answered} calls were answered, {cut} of them 504 because no response came before the budget ran out (an upstream that never answers?), at virtual time {at}",
        format_duration(*.budget)
    )]
    CalloutBudget {
        answered: usize,
        cut: usize,
        budget: Duration,
        at: String,
    },
    #[error(
        "ticks never settled: advancing the clock by {advance} would fire more than {} proxy_on_tick calls (a tick period of a few milliseconds over a long advance?); the harness fired {fired} and stopped the clock at virtual time {at}",
        MAX_TICKS_PER_ADVANCE
    )]
    TickStorm {
        advance: String,
        fired: usize,
        at: String,
    },
}

fn storm_cause(made_by_completions: usize) -> String {
    if made_by_completions == 0 {
        "every one of them made at once, before any was answered".into()
    } else {
        format!("{made_by_completions} of the calls were made by completion callbacks, each completion making more")
    }
}

/// How many `proxy_on_tick` calls one [`Proxy::advance`] may make, all workers together,
/// before the harness calls it a storm and stops the clock there.
pub const MAX_TICKS_PER_ADVANCE: usize = 100_000;

/// Runs everything posted since the last callback returned: queue notifications and callout
/// completions, and whatever those post in turn, until nothing is left.
pub(super) fn deliver_all(threads: &mut Threads) {
    if !threads
        .shared
        .posted
        .swap(false, std::sync::atomic::Ordering::AcqRel)
    {
        return;
    }
    let shared = threads.shared.clone();
    let pending_at_start = lock(&shared.calls).len();
    let deadline = Instant::now() + threads.callouts.budget;
    let mut total = callouts::Delivered::default();
    let at = || format_duration(Duration::from_nanos(shared.monotonic_nanos()));
    loop {
        if let Err(e) = deliver_queue_ready(threads) {
            threads.errors.push(e);
        }
        let mut pending = lock(&shared.calls);
        if pending.is_empty() {
            break;
        }
        if total.answered == MAX_CALL_DELIVERIES {
            let dropped = pending.len();
            threads.errors.push(DeliveryError::CalloutStorm {
                answered: total.answered,
                dropped,
                made_by_completions: (total.answered + dropped).saturating_sub(pending_at_start),
                at: at(),
            });
            shared
                .held
                .release(pending.iter().map(|c| c.held).sum::<usize>());
            pending.clear();
            break;
        }
        drop(pending);
        let round =
            callouts::deliver_calls(threads, MAX_CALL_DELIVERIES - total.answered, deadline);
        total.answered += round.answered;
        total.cut += round.cut;
    }
    if total.cut > 0 {
        threads.errors.push(DeliveryError::CalloutBudget {
            answered: total.answered,
            cut: total.cut,
            budget: threads.callouts.budget,
            at: at(),
        });
    }
}

/// Delivers every pending queue notification, oldest first, including those the deliveries
/// themselves cause, up to [`MAX_QUEUE_DELIVERIES`]. A notification whose receiver is gone
/// (the canary VM, a failed VM, a root that no longer exists) is dropped, as in Envoy.
/// Returns how many were delivered.
pub(super) fn deliver_queue_ready(threads: &mut Threads) -> Result<usize, DeliveryError> {
    let shared = threads.shared.clone();
    let mut delivered = 0;
    loop {
        // The lock is released before calling the guest, which may enqueue or dequeue.
        let next = lock(&shared.queues).ready.pop_front();
        let Some(n) = next else {
            return Ok(delivered);
        };
        if delivered == MAX_QUEUE_DELIVERIES {
            let mut queues = lock(&shared.queues);
            let dropped = queues.ready.len() + 1;
            queues.ready.clear();
            return Err(DeliveryError::QueueStorm {
                delivered,
                dropped,
                at: format_duration(Duration::from_nanos(shared.monotonic_nanos())),
            });
        }
        // No worker: the main thread (its plugin instances and Wasm services; the canary's
        // VMs are gone).
        let vm = threads.dispatcher(n.receiver.worker).and_then(|w| {
            w.vms
                .iter_mut()
                .find(|vm| vm.state().instance == n.receiver.instance)
        });
        if let Some(vm) = vm {
            vm.on_queue_ready(n.receiver.root, n.token);
            delivered += 1;
        }
    }
}

/// Advances the virtual clock by `by`. Every root context whose tick period is set, on the
/// workers and the main thread, gets `proxy_on_tick` once per period boundary crossed, in time
/// order (at equal times: the main thread first, then worker 0, then VM and root context
/// order), with the clock reading the tick's time during the call; what each tick enqueues is
/// delivered right after it. Returns the number of `proxy_on_tick` calls. At most
/// [`MAX_TICKS_PER_ADVANCE`] fire: then the clock stops at the next tick's time and a
/// [`DeliveryError::TickStorm`] says so. Delivery problems are kept in `threads.errors`.
pub(super) fn advance(threads: &mut Threads, by: Duration) -> usize {
    advance_until(threads, by, &mut |_| false)
}

/// [`advance`], stopping right after the tick (and what it posted) that makes `done` true:
/// the clock then reads that tick's time.
pub(super) fn advance_until(
    threads: &mut Threads,
    by: Duration,
    done: &mut dyn FnMut(&mut Threads) -> bool,
) -> usize {
    let start = threads.shared.monotonic_nanos();
    let target = start.saturating_add(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
    let mut ticks = 0;
    while let Some((due, w, v, root)) = next_tick(threads, target) {
        if ticks == MAX_TICKS_PER_ADVANCE {
            threads.errors.push(DeliveryError::TickStorm {
                advance: format_duration(by),
                fired: ticks,
                at: format_duration(Duration::from_nanos(due)),
            });
            set_clock(threads, due);
            return ticks;
        }
        set_clock(threads, due);
        let vm = match w {
            Some(w) => &mut threads.workers[w].vms[v],
            None => &mut threads.main.vms[v],
        };
        let has_on_tick = vm.has_on_tick();
        if has_on_tick {
            vm.on_tick(root);
            ticks += 1;
        }
        if let Some(t) = vm.state_mut().timers.get_mut(&root) {
            t.rearm_after_tick(due, has_on_tick);
        }
        threads.deliver_posted();
        if done(threads) {
            return ticks;
        }
    }
    set_clock(threads, target);
    ticks
}

fn set_clock(threads: &Threads, nanos: u64) {
    lock(&threads.shared.clock).set_monotonic_nanos(nanos);
}

/// Whether any live VM has a timer armed (in real Envoy it fires in real time, during any
/// step).
pub(super) fn any_armed(threads: &Threads) -> bool {
    threads.all().any(|(_, dispatcher)| {
        dispatcher.vms.iter().any(|vm| {
            vm.failed.is_none() && vm.state().timers.values().any(|t| t.due_nanos.is_some())
        })
    })
}

/// The earliest timer due by `target`: (due, worker, vm, root), worker `None` being the main
/// thread (its plugin instances and Wasm services), first at equal times. Failed VMs never
/// tick.
fn next_tick(threads: &Threads, target: u64) -> Option<(u64, Option<usize>, usize, u32)> {
    let mut best: Option<(u64, Option<usize>, usize, u32)> = None;
    for (w, dispatcher) in threads.all() {
        for (v, vm) in dispatcher.vms.iter().enumerate() {
            if vm.failed.is_some() {
                continue;
            }
            for (&root, timer) in &vm.state().timers {
                if let Some(due) = timer.due_nanos.filter(|&d| d <= target) {
                    let candidate = (due, w, v, root);
                    if best.is_none_or(|b| candidate < b) {
                        best = Some(candidate);
                    }
                }
            }
        }
    }
    best
}
