//! `stats-aggregator`: HTTP streams (`mode: record`) put one record each on the shared
//! queue; the singleton service (`mode: aggregate`) registers the queue, drains it whenever
//! it is told there is something, and on each tick logs a summary and posts it to the
//! collector. A post that fails, or is refused, puts its counts back for the next tick.
//!
//! Envoy's shared queue has no bound, so the records on it are counted in shared data
//! ([`crate::stats::backlog_key`]): a worker adds one before it enqueues (a compare-and-swap),
//! the service takes off what it dequeued. With the service slow or gone the count reaches
//! [`crate::stats::MAX_QUEUED`] and workers drop records, counting them in
//! `records_dropped_total`.
//!
//! Each tick the service also stores its summary in shared data
//! ([`crate::stats::summary_key`]), where every worker VM can read the aggregate.

use crate::quote::Quoted;
use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::types::{Action, MapType};

use super::metrics::{Counter, Metrics};
use super::{host, log, shared};
use crate::config::VmConfig;
use crate::stats::{
    admit, backlog_key, decode_count, summary_key, Admit, Aggregate, Record, StatsConfig,
};

/// Records taken per `on_queue_ready`, so one callback stays short; the rest wait for the
/// next notification or tick.
const MAX_DRAIN: usize = 10_000;

pub struct Recorder {
    vm_id: String,
    queue_name: String,
    backlog: String,
    queue: Cell<Option<u32>>,
    told_missing: Cell<bool>,
    told_full: Cell<bool>,
    queued: Counter,
    dropped: Counter,
}

impl Recorder {
    #[inline(never)]
    pub fn new(vm: &VmConfig) -> Self {
        let metrics = Metrics::new("stats-aggregator");
        Self {
            vm_id: host::property_text(&["plugin_vm_id"]).unwrap_or_default(),
            queue_name: vm.queue_name.clone(),
            backlog: backlog_key(&vm.shared_data_prefix, &vm.queue_name),
            queue: Cell::new(None),
            told_missing: Cell::new(false),
            told_full: Cell::new(false),
            queued: metrics.counter("records_queued_total"),
            dropped: metrics.counter("records_dropped_total"),
        }
    }

    fn drop_record(&self) {
        self.dropped.add(1);
    }

    /// Counts one more record on the queue; `false` (and the record is dropped) when the
    /// queue is full or the count cannot be kept.
    fn reserve(&self) -> bool {
        let admitted = shared::update(&self.backlog, |old| match admit(decode_count(old)?) {
            Admit::Queue(n) => Ok((n.to_string(), true)),
            Admit::Full => Err(format!(
                "the queue holds {} records (is the stats-aggregator service keeping up?)",
                crate::stats::MAX_QUEUED
            )),
        });
        match admitted {
            Ok(_) => {
                self.told_full.set(false);
                true
            }
            Err(e) => {
                if !self.told_full.replace(true) {
                    log!(
                        Warn,
                        "stats records for queue {} dropped, counted in records_dropped_total: {e}",
                        Quoted(&self.queue_name)
                    );
                }
                false
            }
        }
    }

    /// The queue, once the aggregator has registered it.
    fn queue(&self) -> Option<u32> {
        if let Some(q) = self.queue.get() {
            return Some(q);
        }
        match host::resolve_queue(&self.vm_id, &self.queue_name) {
            Ok(Some(q)) => {
                self.queue.set(Some(q));
                Some(q)
            }
            Ok(None) | Err(_) => {
                if !self.told_missing.replace(true) {
                    log!(
                        Warn,
                        "stats queue {} of vm {} is not registered (is the stats-aggregator service running?); records are dropped until it is",
                        Quoted(&self.queue_name),
                        Quoted(&self.vm_id)
                    );
                }
                None
            }
        }
    }

    fn send(&self, record: &Record) {
        let Some(q) = self.queue() else {
            self.drop_record();
            return;
        };
        if !self.reserve() {
            self.drop_record();
            return;
        }
        if let Err(status) = host::enqueue(q, record.encode().as_bytes()) {
            self.drop_record();
            // The reserved place is given back.
            let _ = take_off(&self.backlog, 1);
            // Resolved again on the next stream (the service may have been restarted).
            self.queue.set(None);
            log!(
                Debug,
                "enqueueing a stats record failed with host status {status:?}"
            );
            return;
        }
        self.queued.add(1);
    }
}

pub struct RecordFilter {
    recorder: Rc<Recorder>,
    /// When the request's headers came; `None` until they do. A stream that ends without
    /// them (a connection closed before any byte reached the role) was no request.
    start_ns: Option<u64>,
    path: String,
    status: Option<u16>,
}

impl RecordFilter {
    pub fn new(recorder: Rc<Recorder>) -> Self {
        Self {
            recorder,
            start_ns: None,
            path: String::new(),
            status: None,
        }
    }
}

/// The callbacks [`super::stream`]'s contexts route here, each compiled on its own (see
/// `plugin::PluginContext::configure`).
impl RecordFilter {
    #[inline(never)]
    pub fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        self.start_ns = Some(host::now_ns());
        self.path = host::header_text(MapType::HttpRequestHeaders, ":path").unwrap_or_default();
        Action::Continue
    }

    #[inline(never)]
    pub fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.status =
            host::header_text(MapType::HttpResponseHeaders, ":status").and_then(|s| s.parse().ok());
        Action::Continue
    }

    #[inline(never)]
    pub fn on_end(&mut self) {
        let Some(start_ns) = self.start_ns else {
            return;
        };
        let latency = host::now_ns().saturating_sub(start_ns);
        self.recorder
            .send(&Record::new(&self.path, self.status, latency));
    }
}

/// Takes `n` records off the backlog count.
fn take_off(backlog: &str, n: u64) -> Result<(), String> {
    shared::update(backlog, |old| {
        Ok((decode_count(old)?.saturating_sub(n).to_string(), ()))
    })
}

pub struct Service {
    config: StatsConfig,
    queue: u32,
    backlog: String,
    summary: String,
    received: Counter,
    posted: Counter,
    post_failures: Counter,
    counts: Aggregate,
    /// The summary being posted: its call's token and counts.
    posting: Option<(u32, Aggregate)>,
}

impl Service {
    #[inline(never)]
    pub fn new(config: StatsConfig, vm: &VmConfig) -> Result<Self, String> {
        let queue = host::register_queue(&vm.queue_name).map_err(|s| {
            format!(
                "registering the stats queue {} failed with host status {s:?}",
                Quoted(&vm.queue_name)
            )
        })?;
        if let Err(status) = host::set_tick_period_ms(config.tick_ms()) {
            return Err(format!(
                "setting the tick period failed with host status {status:?}"
            ));
        }
        log!(
            Info,
            "stats-aggregator: registered queue {}",
            Quoted(&vm.queue_name)
        );
        let metrics = Metrics::new("stats-aggregator");
        Ok(Self {
            config,
            queue,
            backlog: backlog_key(&vm.shared_data_prefix, &vm.queue_name),
            summary: summary_key(&vm.shared_data_prefix, &vm.queue_name),
            received: metrics.counter("records_received_total"),
            posted: metrics.counter("summaries_posted_total"),
            post_failures: metrics.counter("post_failures_total"),
            counts: Aggregate::default(),
            posting: None,
        })
    }

    pub fn drain(&mut self, queue: u32) {
        if queue != self.queue {
            return;
        }
        let (mut bad, mut taken) = (0, 0u64);
        for _ in 0..MAX_DRAIN {
            match host::dequeue(queue) {
                Ok(Some(bytes)) => {
                    taken += 1;
                    match Record::decode(&bytes) {
                        Ok(r) => self.counts.add(&r),
                        Err(_) => bad += 1,
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    log!(Warn, "dequeueing stats failed with host status {status:?}");
                    break;
                }
            }
        }
        if bad > 0 {
            log!(Warn, "stats-aggregator: {bad} unreadable records skipped");
        }
        self.received.add(taken);
        if taken > 0 {
            if let Err(e) = take_off(&self.backlog, taken) {
                log!(
                    Warn,
                    "stats-aggregator: the queue's record count is off: {e}"
                );
            }
        }
    }

    pub fn on_tick(&mut self) {
        self.drain(self.queue);
        let summary = self.counts.summary();
        log!(Info, "stats summary: {summary}");
        // One writer (the singleton): an unconditional write, never a race.
        if let Err(status) = host::set_shared_data(&self.summary, summary.as_bytes(), 0) {
            log!(
                Warn,
                "stats-aggregator: storing the summary failed with host status {status:?}"
            );
        }
        let Some(collector) = &self.config.collector else {
            self.counts = Aggregate::default();
            return;
        };
        if self.posting.is_some() {
            log!(
                Warn,
                "stats-aggregator: the previous post has no answer yet; its counts wait for it"
            );
            return;
        }
        if self.counts.is_empty() {
            return;
        }
        let body = self.counts.summary();
        let headers = [
            (":method", "POST"),
            (":path", collector.path.as_str()),
            (":authority", collector.authority.as_str()),
            ("content-type", "application/json"),
        ];
        match host::http_call(
            &collector.cluster,
            &headers,
            body.as_bytes(),
            collector.timeout_ms,
        ) {
            Ok(token) => {
                self.posting = Some((token, std::mem::take(&mut self.counts)));
            }
            Err(status) => {
                self.post_failures.add(1);
                log!(
                    Warn,
                    "stats-aggregator: posting to cluster {} failed with host status {status:?}; the counts carry over to the next tick",
                    Quoted(&collector.cluster)
                );
            }
        }
    }

    pub fn on_post_answer(&mut self, token: u32, num_headers: usize, _body: usize) {
        let Some((pending, _)) = &self.posting else {
            return;
        };
        if *pending != token {
            return;
        }
        let Some((_, counts)) = self.posting.take() else {
            return;
        };
        let cluster = self
            .config
            .collector
            .as_ref()
            .map(|c| c.cluster.as_str())
            .unwrap_or_default();
        let status = if num_headers == 0 {
            None
        } else {
            host::header_text(MapType::HttpCallResponseHeaders, ":status")
        };
        match status.as_deref() {
            Some(s) if s.starts_with('2') => {
                self.posted.add(1);
                log!(
                    Info,
                    "stats-aggregator: summary of {} requests posted to {} ({s})",
                    counts.requests,
                    Quoted(cluster)
                );
            }
            other => {
                self.post_failures.add(1);
                log!(
                    Warn,
                    "stats-aggregator: collector {} answered {}; the {} requests carry over to the next tick",
                    Quoted(cluster),
                    other.unwrap_or("nothing (the call failed)"),
                    counts.requests
                );
                self.counts.merge(counts);
            }
        }
    }
}
