//! The record of every callout answered, for reports and expectations, within one byte budget
//! for the run: a guest that calls out with a large body on every tick must not grow the
//! harness's memory without end. A record that does not fit is not built (its request is not
//! copied) and is counted instead, so a report can say how many are missing.

use std::ops::Deref;

use crate::engine::host::callouts::{CallRequest, PendingCall};
use crate::envoy::http::CallRecord;

/// The most bytes of call records (request headers, bodies, answers) a run keeps.
pub const MAX_CALL_RECORD_BYTES: usize = 64 << 20;

/// What one record costs beyond its bytes (its strings and vectors, the slot it takes).
const RECORD_OVERHEAD: usize = 256;

/// Call records, oldest first; reads as a slice of [`CallRecord`].
#[derive(Debug, Default)]
pub struct CallRecords {
    kept: Vec<CallRecord>,
    bytes: usize,
    dropped: usize,
}

impl CallRecords {
    /// Keeps the record `make` builds for `call` (answered with a text of `answer_len` bytes) if
    /// its cost fits the budget, else counts it.
    pub(super) fn push(
        &mut self,
        call: &PendingCall,
        answer_len: usize,
        make: impl FnOnce() -> CallRecord,
    ) {
        let cost = cost(&call.request)
            .saturating_add(answer_len)
            .saturating_add(RECORD_OVERHEAD);
        match self.bytes.checked_add(cost) {
            Some(total) if total <= MAX_CALL_RECORD_BYTES => {
                self.bytes = total;
                self.kept.push(make());
            }
            _ => self.dropped += 1,
        }
    }

    /// How many calls were answered but not recorded (the budget was spent).
    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

impl Deref for CallRecords {
    type Target = [CallRecord];

    fn deref(&self) -> &[CallRecord] {
        &self.kept
    }
}

/// The bytes of a request a record copies.
fn cost(request: &CallRequest) -> usize {
    let map = |m: &crate::engine::host::HeaderMap| {
        m.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    };
    match request {
        CallRequest::Http { headers, body, .. } => map(headers) + body.len(),
        CallRequest::Grpc {
            service,
            method,
            metadata,
            message,
            ..
        } => service.len() + method.len() + map(metadata) + message.len(),
    }
}
