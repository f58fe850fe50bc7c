//! A TCP connection through a listener's `envoy.filters.network.wasm` filters and its
//! `tcp_proxy`, with Envoy's callbacks (`context.cc` `onNewConnection` / `onData` / `onWrite` /
//! `onEvent` / `onCloseTCP`):
//!
//! - on accept, each filter in order: `proxy_on_context_create(ctx, root)`, then
//!   `proxy_on_new_connection(ctx)`; then `tcp_proxy` picks its cluster (the filter state
//!   `envoy.tcp_proxy.cluster` when a filter set it, through `set_envoy_filter_state`, else
//!   its configured one) and connects. A filter that does not continue there leaves
//!   `tcp_proxy` unconnected, and reading stays disabled as `tcp_proxy` left it: no data
//!   reaches any filter, and the connection ends when the client closes (seen in Envoy 1.40);
//! - client bytes: `proxy_on_downstream_data(ctx, size, end)` filter by filter, buffer type 2.
//!   `Continue` passes the buffer on; any other result keeps it in that filter, and the next
//!   bytes are added to it (`size` is all of it) until it continues or
//!   `proxy_continue_stream(DOWNSTREAM)` releases it;
//! - upstream bytes: `proxy_on_upstream_data(ctx, size, end)`, last filter first, buffer type 3;
//!   with `end`, `proxy_on_upstream_connection_close(ctx, 0)` right after, as Envoy synthesizes
//!   it from the end of the stream;
//! - closing: the other side follows (a client that half-closes gets the upstream's close, and
//!   the reverse), then `proxy_on_downstream_connection_close(ctx, peer)` (1, local, when
//!   Envoy closes the socket after the upstream's close reached a client that closed first, or
//!   when a plugin or the failure policy closes it; 2, remote, when the client's close comes
//!   last) and `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`.
//!
//! `proxy_close_stream` closes the connection after the callback. A failed VM applies its
//! plugin's failure policy: fail-closed closes the connection, fail-open passes bytes through.

use super::threads::{PluginSlot, Threads};
use crate::engine::abi::BufferType;
use crate::engine::host;
use crate::engine::host::filter_state::TCP_PROXY_CLUSTER;
use crate::engine::vm::Vm;
use crate::envoy::bootstrap::{Cluster, FailurePolicy, WasmPlugin};
use crate::envoy::http::{TcpEvent, TcpOutcome};

/// Which way bytes flow.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Downstream,
    Upstream,
}

/// How a callback's result tells the connection to go on.
enum FlowAfter {
    Continue,
    Hold,
    Close(String),
}

/// One connection on worker `w` (holding every thread for the same reason as an HTTP stream:
/// what a callback posts may be for another one).
pub(super) struct TcpConnection<'a> {
    threads: &'a mut Threads,
    w: usize,
    plugins: &'a [WasmPlugin],
    /// Where a deny-all RBAC filter stands among the filters (see `TcpChain::deny_at`).
    deny_at: Option<usize>,
    slots: Vec<Option<PluginSlot>>,
    /// Per filter: (vm, context) once created.
    contexts: Vec<Option<(usize, u32)>>,
    /// Per direction, per filter: bytes the filter holds.
    held: [Vec<Vec<u8>>; 2],
    outcome: TcpOutcome,
    closed: bool,
    /// `tcp_proxy`'s configured cluster, and the bootstrap's clusters it may be steered to.
    cluster: String,
    clusters: &'a [Cluster],
    /// Whether `tcp_proxy` connected upstream (every filter continued on the new connection).
    connected: bool,
    /// Set when a filter did not continue on the new connection: the filters after it and
    /// `tcp_proxy` are never initialized.
    paused: bool,
}

impl<'a> TcpConnection<'a> {
    /// A connection to `listener` on worker `w`, through `plugins` (the listener's network
    /// filters) to the `tcp_proxy` whose configured cluster is `cluster`, one of `clusters`
    /// unless the bootstrap names a missing one.
    pub(super) fn new(
        threads: &'a mut Threads,
        w: usize,
        listener: usize,
        (plugins, deny_at): (&'a [WasmPlugin], Option<usize>),
        cluster: String,
        clusters: &'a [Cluster],
    ) -> Self {
        let n = plugins.len();
        Self {
            slots: threads.workers[w].slots[listener].clone(),
            threads,
            w,
            plugins,
            deny_at,
            contexts: vec![None; n],
            held: [vec![Vec::new(); n], vec![Vec::new(); n]],
            outcome: TcpOutcome {
                worker: w,
                ..TcpOutcome::default()
            },
            closed: false,
            cluster,
            clusters,
            connected: false,
            paused: false,
        }
    }

    /// Accepts the connection, plays `events`, closes it as the client if they did not, and
    /// says what each side got.
    pub(super) fn run(mut self, connection: host::Connection, events: &[TcpEvent]) -> TcpOutcome {
        self.open(connection.clone());
        if !self.closed {
            self.connect_upstream(&connection);
        }
        for event in events {
            if self.closed {
                break;
            }
            if !self.connected {
                // Reading is disabled and there is no upstream: only the client's close is
                // seen, when it closes its socket.
                continue;
            }
            match event {
                TcpEvent::Downstream(data) => self.data(Way::Downstream, data.clone(), false),
                TcpEvent::Upstream(data) => self.data(Way::Upstream, data.clone(), false),
                TcpEvent::CloseDownstream => self.close_by(Way::Downstream),
                TcpEvent::CloseUpstream => self.close_by(Way::Upstream),
            }
        }
        if !self.closed && !self.connected {
            self.close_as(
                "client (tcp_proxy never connected: a plugin did not continue on the new connection)"
                    .into(),
                2,
            );
        }
        if !self.closed {
            self.close_by(Way::Downstream);
            self.outcome.closed_by = "still open (the harness closed it as the client)".into();
        }
        self.outcome
    }

    /// `tcp_proxy`'s `onNewConnection`, once every filter continued: the cluster from the
    /// filter state `envoy.tcp_proxy.cluster`, else the configured one; Envoy closes the
    /// connection when no such cluster exists.
    fn connect_upstream(&mut self, connection: &host::Connection) {
        if self.paused {
            return;
        }
        let steered = connection.with_filter_state(|fs| {
            fs.value(TCP_PROXY_CLUSTER)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        let cluster = steered.unwrap_or_else(|| self.cluster.clone());
        match self.clusters.iter().find(|c| c.name == cluster) {
            None => return self.close(format!("no cluster {cluster:?} (tcp_proxy)")),
            Some(c) => match c.endpoints.first() {
                None => {
                    return self.close(format!(
                        "cluster {cluster:?} has no endpoint: no healthy upstream (tcp_proxy)"
                    ))
                }
                // The first endpoint, as the harness's load balancing picks it.
                Some(endpoint) => {
                    let _ = connection.upstream.set(endpoint.clone());
                }
            },
        }
        self.outcome.cluster = cluster;
        self.connected = true;
    }

    fn vm(&mut self, v: usize) -> &mut Vm {
        &mut self.threads.workers[self.w].vms[v]
    }

    fn deliver_posted(&mut self) {
        self.threads.deliver_posted();
    }

    /// The failure policy for filter `i`, whose VM failed or never started.
    fn failed(&self, i: usize) -> FlowAfter {
        let plugin = &self.plugins[i];
        match plugin.failure_policy {
            FailurePolicy::FailOpen => FlowAfter::Continue,
            _ => FlowAfter::Close(format!(
                "failure policy: plugin {:?} failed, and its filter closes the connection (fail closed)",
                plugin.name
            )),
        }
    }

    fn open(&mut self, connection: host::Connection) {
        for i in 0..self.plugins.len() {
            let Some(slot) = self.slots[i] else {
                if let FlowAfter::Close(why) = self.failed(i) {
                    return self.close(why);
                }
                continue;
            };
            if self.vm(slot.vm).failed.is_some() {
                if let FlowAfter::Close(why) = self.failed(i) {
                    return self.close(why);
                }
                continue;
            }
            let (ctx, result) = self
                .vm(slot.vm)
                .create_tcp_context(slot.root, connection.clone());
            self.contexts[i] = Some((slot.vm, ctx));
            self.deliver_posted();
            if self.vm(slot.vm).failed.is_some() {
                if let FlowAfter::Close(why) = self.failed(i) {
                    return self.close(why);
                }
                continue;
            }
            if result.is_some_and(|r| r != 0) {
                self.paused = true;
                return;
            }
        }
    }

    /// Runs one data callback on filter `i` with `data` as its buffer; returns the step and
    /// the buffer as the filter left it.
    fn callback(&mut self, i: usize, way: Way, data: Vec<u8>, end: bool) -> (FlowAfter, Vec<u8>) {
        let Some((v, ctx)) = self.contexts[i] else {
            return (self.failed(i), data);
        };
        if self.vm(v).failed.is_some() {
            return (self.failed(i), data);
        }
        let size = data.len();
        if let Some(s) = self.vm(v).tcp_state(ctx) {
            match way {
                Way::Downstream => s.downstream_data = data,
                Way::Upstream => s.upstream_data = data,
            }
            s.in_data_callback = Some(match way {
                Way::Downstream => BufferType::DownstreamData,
                Way::Upstream => BufferType::UpstreamData,
            });
        }
        let result = match way {
            Way::Downstream => self.vm(v).on_downstream_data(ctx, size, end),
            Way::Upstream => {
                let r = self.vm(v).on_upstream_data(ctx, size, end);
                if end {
                    self.vm(v).on_upstream_connection_close(ctx, 0);
                }
                r
            }
        };
        self.deliver_posted();
        let name = self.plugins[i].name.clone();
        let failed = self.vm(v).failed.is_some();
        let Some(s) = self.vm(v).tcp_state(ctx) else {
            return (FlowAfter::Continue, Vec::new());
        };
        s.in_data_callback = None;
        let data = std::mem::take(match way {
            Way::Downstream => &mut s.downstream_data,
            Way::Upstream => &mut s.upstream_data,
        });
        if failed {
            return (self.failed(i), data);
        }
        if std::mem::take(&mut s.close) {
            return (
                FlowAfter::Close(format!(
                    "plugin {name:?} closed the connection (proxy_close_stream)"
                )),
                data,
            );
        }
        let resumed = std::mem::take(&mut s.continue_downstream);
        let step = match result {
            None | Some(0) => FlowAfter::Continue,
            Some(_) if resumed => FlowAfter::Continue,
            Some(_) => FlowAfter::Hold,
        };
        (step, data)
    }

    /// Bytes from one side through the filters (client bytes first to last, upstream bytes
    /// last to first) to the other side.
    fn data(&mut self, way: Way, mut data: Vec<u8>, end: bool) {
        let n = self.plugins.len();
        let order: Vec<usize> = match way {
            Way::Downstream => (0..n).collect(),
            Way::Upstream => (0..n).rev().collect(),
        };
        let side = way as usize;
        for i in order {
            // The RBAC filter reads only the client's bytes; the first that reach it close.
            if way == Way::Downstream && self.deny_at == Some(i) {
                return self.close(
                    "a deny-all RBAC filter closed the connection (rbac_deny_close)".into(),
                );
            }
            let mut buffer = std::mem::take(&mut self.held[side][i]);
            buffer.append(&mut data);
            let (step, out) = self.callback(i, way, buffer, end);
            match step {
                FlowAfter::Continue => data = out,
                FlowAfter::Hold => {
                    self.held[side][i] = out;
                    return;
                }
                FlowAfter::Close(why) => return self.close(why),
            }
        }
        if way == Way::Downstream && self.deny_at.is_some_and(|k| k >= n) {
            return self
                .close("a deny-all RBAC filter closed the connection (rbac_deny_close)".into());
        }
        match way {
            Way::Downstream => self.outcome.upstream_received.append(&mut data),
            Way::Upstream => self.outcome.downstream_received.append(&mut data),
        }
    }

    /// `way` ends its side; the other side closes in turn; then the connection is closed.
    fn close_by(&mut self, way: Way) {
        let other = match way {
            Way::Downstream => Way::Upstream,
            Way::Upstream => Way::Downstream,
        };
        self.data(way, Vec::new(), true);
        if !self.closed {
            self.data(other, Vec::new(), true);
        }
        if !self.closed {
            // Envoy closes the socket itself (local, 1) once the upstream's close reached a
            // client that closed first; when the client's close comes last it is remote (2).
            let (who, peer) = match way {
                Way::Downstream => ("client", 1),
                Way::Upstream => ("upstream", 2),
            };
            self.close_as(who.into(), peer);
        }
    }

    fn close(&mut self, why: String) {
        self.close_as(why, 1);
    }

    /// The downstream connection closes: `proxy_on_downstream_connection_close(ctx, peer)` on
    /// every filter, then each context ends.
    fn close_as(&mut self, why: String, peer: i32) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.outcome.closed_by = why;
        for (side, name) in [(0, "from the client"), (1, "from the upstream")] {
            for (i, held) in self.held[side].iter().enumerate() {
                if !held.is_empty() {
                    self.outcome.held.push(format!(
                        "plugin {:?} still held {} byte(s) {name}",
                        self.plugins[i].name,
                        held.len()
                    ));
                }
            }
        }
        for i in 0..self.contexts.len() {
            if let Some((v, ctx)) = self.contexts[i] {
                self.vm(v).on_downstream_connection_close(ctx, peer);
                self.deliver_posted();
            }
        }
        for c in std::mem::take(&mut self.contexts).into_iter().flatten() {
            self.vm(c.0).finish_tcp(c.1);
            self.deliver_posted();
        }
    }
}
