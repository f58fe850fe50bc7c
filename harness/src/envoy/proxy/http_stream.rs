//! One HTTP stream through a listener's filter chain, with Envoy's order of callbacks: the
//! request's headers, body and trailers through the filters first to last (decode), the
//! router (see [`super::router`]), then the response back from the last filter to the first
//! (encode). A filter that answers locally turns the stream around at its position; a stall
//! or a reset ends it without a response. Each callback's posted work (queue notifications,
//! callout completions) runs right after it, on whichever thread it is for.

use std::sync::Arc;

mod phases;

use super::router::{self, Framing, Outgoing, Routed};
use super::threads::{Dispatcher, Threads};
use crate::engine::host::{self, LocalReply};
use crate::engine::vm::Vm;
use crate::envoy::bootstrap::{Bootstrap, FailurePolicy, HttpConnectionManager, WasmPlugin};
use crate::envoy::http::{
    Exchange, HeaderMap, LocalReplySource, Message, Request, Response, SeenRequest, StreamEnd,
    UpstreamReply,
};

/// One HTTP stream on worker `w`. It holds every thread because what a callback enqueues is
/// delivered, once the callback returns, to whichever thread registered the queue.
pub(super) struct HttpStream<'a> {
    threads: &'a mut Threads,
    w: usize,
    bootstrap: &'a Bootstrap,
    /// The listener's index and its connection manager.
    listener_index: usize,
    hcm: &'a HttpConnectionManager,
    connection: host::Connection,
    /// Per Wasm filter: the stream context created for it, if the filter is active.
    contexts: Vec<Option<(usize, u32)>>,
    /// The request's headers while the contexts share them (see `share_request`).
    request: Option<Arc<HeaderMap>>,
    /// Envoy's `remoteDecodeComplete`: the codec has handed the filters the request's end of
    /// stream. A response that starts before it closes an HTTP/1.1 connection.
    request_complete: bool,
    /// A filter paused the request in its headers callback and what it posted (a callout's
    /// answer) resumed it: Envoy's codec read the rest of the request meanwhile.
    resumed_at_request_headers: bool,
    /// The request's `tick_wait`: how long ticks may run to resume a pause in its headers.
    tick_wait: Option<std::time::Duration>,
}

/// How a callback's result (after the failure policy) tells the chain to go on.
enum ChainAfter {
    Continue,
    /// The filter paused (headers: a stall unless resumed; body: keep buffering), and why
    /// that would stall the stream.
    Paused(String),
    Stop(StopReason),
}

/// Which way data flows through the filter chain.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Request,
    Response,
}

/// The part of a message a callback is about.
#[derive(Clone, Copy)]
enum Part {
    Headers,
    Body,
    Trailers,
}

impl Dir {
    /// The callback's name, for messages.
    fn phase(self, part: Part) -> &'static str {
        match (self, part) {
            (Dir::Request, Part::Headers) => "on_http_request_headers",
            (Dir::Request, Part::Body) => "on_http_request_body",
            (Dir::Request, Part::Trailers) => "on_http_request_trailers",
            (Dir::Response, Part::Headers) => "on_http_response_headers",
            (Dir::Response, Part::Body) => "on_http_response_body",
            (Dir::Response, Part::Trailers) => "on_http_response_trailers",
        }
    }
}

/// The filters a direction visits: the request goes first to last, the response from
/// filter `from` back to the first. Positions index this order; `at` says which filter.
#[derive(Clone, Copy)]
enum Order {
    Forward(usize),
    Backward(usize),
}

impl Order {
    fn len(self) -> usize {
        match self {
            Order::Forward(n) => n,
            Order::Backward(from) => from,
        }
    }

    fn at(self, pos: usize) -> usize {
        match self {
            Order::Forward(_) => pos,
            Order::Backward(from) => from - 1 - pos,
        }
    }
}

/// Where a direction of the stream stopped: at filter `.0`, for this reason.
type Stopped = (usize, StopReason);

enum StopReason {
    /// Answered locally: the response turns around at the filter that stopped.
    LocalReply(LocalReplySource, Box<LocalReply>),
    Halt(Halt),
}

/// How a stream ends without a response to the client.
enum Halt {
    /// Nothing resumed a pause, or the framing leaves the peer waiting: Envoy would hold the
    /// stream until a timeout.
    Stalled(String),
    /// A plugin closed the stream (`proxy_close_stream`): Envoy resets it, no response.
    Reset(String),
}

/// What a stream records on its way besides how it ends.
#[derive(Default)]
struct Trace {
    upstream: Option<SeenRequest>,
    local_reply: Option<LocalReplySource>,
    notes: Vec<String>,
}

impl<'a> HttpStream<'a> {
    pub(super) fn new(
        threads: &'a mut Threads,
        w: usize,
        bootstrap: &'a Bootstrap,
        (listener_index, hcm): (usize, &'a HttpConnectionManager),
        connection: host::Connection,
    ) -> Self {
        Self {
            threads,
            w,
            bootstrap,
            listener_index,
            hcm,
            connection,
            contexts: Vec::new(),
            request: None,
            request_complete: false,
            resumed_at_request_headers: false,
            tick_wait: None,
        }
    }

    fn plugin(&self, i: usize) -> &'a WasmPlugin {
        &self.hcm.filters[i]
    }

    fn fail_stream(&self, i: usize) -> ChainAfter {
        let plugin = self.plugin(i);
        match plugin.failure_policy {
            FailurePolicy::FailOpen => ChainAfter::Continue,
            _ => ChainAfter::Stop(StopReason::LocalReply(
                LocalReplySource::FailurePolicy {
                    plugin: plugin.name.clone(),
                },
                Box::new(LocalReply {
                    status: 503,
                    details: "wasm_fail_stream".into(),
                    body: Vec::new(),
                    headers: Vec::new(),
                    grpc_status: Some(14),
                }),
            )),
        }
    }

    fn worker(&mut self) -> &mut Dispatcher {
        &mut self.threads.workers[self.w]
    }

    /// Creates the stream contexts lazily, as Envoy does at the first decode callback.
    /// Envoy creates a context in its filter's first decode callback, after the filters
    /// ahead of it set the request's dynamic metadata.
    fn setup(&mut self, metadata: &Arc<crate::envoy::http::DynamicMetadata>) {
        let listener = self.listener_index;
        let n = self.worker().slots[listener].len();
        self.contexts = vec![None; n];
        // Filters after a deny-all RBAC filter never see a request, so never make a context.
        for i in 0..self.hcm.deny_at.map_or(n, |k| k.min(n)) {
            if let Some(slot) = self.worker().slots[listener][i] {
                if self.worker().vms[slot.vm].failed.is_none() {
                    let conn = self.connection.clone();
                    let ctx = self.worker().vms[slot.vm].create_http_context(
                        slot.root,
                        conn,
                        metadata.clone(),
                    );
                    self.contexts[i] = Some((slot.vm, ctx));
                    self.threads.deliver_posted();
                }
            }
        }
    }

    /// Runs one callback on filter `i`, then what it posted (a callout's completion may
    /// resume the stream or answer it locally), and turns the outcome into a step, applying
    /// local replies, the failure policy and pauses as Envoy does.
    fn callback(
        &mut self,
        i: usize,
        phase: &str,
        call: &mut dyn FnMut(&mut Vm, u32) -> Option<i32>,
    ) -> ChainAfter {
        let Some((vm, ctx)) = self.contexts[i] else {
            return self.fail_stream(i);
        };
        let name = &self.plugin(i).name;
        if self.worker().vms[vm].failed.is_some() {
            return self.fail_stream(i);
        }
        let result = call(&mut self.worker().vms[vm], ctx);
        let answered = |vm: &mut Vm| {
            vm.failed.is_some() || vm.http_state(ctx).is_some_and(|s| s.local_reply.is_some())
        };
        let answered_in_callback = answered(&mut self.worker().vms[vm]);
        self.threads.deliver_posted();
        // An answer from what the callback posted (a callout's) comes on a later turn of
        // Envoy's event loop, once its codec has read the rest of the request.
        if !answered_in_callback && answered(&mut self.worker().vms[vm]) {
            self.request_complete = true;
        }
        if self.worker().vms[vm].failed.is_some() {
            return self.fail_stream(i);
        }
        // A stream's context lives until the stream ends; one gone here is a host bug, which
        // fails the stream rather than the process.
        let Some(s) = self.worker().vms[vm].http_state(ctx) else {
            return self.fail_stream(i);
        };
        if std::mem::take(&mut s.reset) {
            return ChainAfter::Stop(StopReason::Halt(Halt::Reset(format!(
                "plugin {name:?} closed the stream in {phase} (proxy_close_stream): Envoy resets it and the client gets no response"
            ))));
        }
        if let Some(reply) = s.local_reply.take() {
            s.stop_forced = false;
            return ChainAfter::Stop(StopReason::LocalReply(
                LocalReplySource::Plugin {
                    plugin: name.clone(),
                    details: reply.details.clone(),
                },
                Box::new(reply),
            ));
        }
        let mut resumed =
            std::mem::take(&mut s.continue_request) | std::mem::take(&mut s.continue_response);
        let paused = !matches!(result, None | Some(0) | Some(2));
        if paused && !resumed && phase == Dir::Request.phase(Part::Headers) {
            if let Some(limit) = self.tick_wait {
                resumed = self.resumed_by_ticks(vm, ctx, limit);
            }
        }
        if resumed
            && !matches!(result, None | Some(0) | Some(2))
            && phase == Dir::Request.phase(Part::Headers)
        {
            self.resumed_at_request_headers = true;
        }
        match result {
            // 0 Continue; 2 ContinueAndEndStream, which Envoy's converter treats as Continue.
            None | Some(0) | Some(2) => ChainAfter::Continue,
            Some(_) if resumed => ChainAfter::Continue,
            Some(code) => ChainAfter::Paused(format!(
                "plugin {name:?} paused the stream in {phase} (returned {code}) and nothing resumed it; Envoy would hold the request until a timeout"
            )),
        }
    }

    /// Runs the ticks due within `limit` until one resumes the request held by context `ctx`
    /// of VM `vm` (a Go filter's pattern: pause, and let the plugin's timer continue it).
    fn resumed_by_ticks(&mut self, vm: usize, ctx: u32, limit: std::time::Duration) -> bool {
        let w = self.w;
        let mut resumed = |threads: &mut Threads| {
            threads.workers[w].vms[vm]
                .http_state(ctx)
                .is_some_and(|s| s.continue_request)
        };
        super::events::advance_until(self.threads, limit, &mut resumed);
        self.worker().vms[vm]
            .http_state(ctx)
            .is_some_and(|s| std::mem::take(&mut s.continue_request))
    }

    /// The whole stream: the exchange, then the contexts' end. What went upstream gets its
    /// headers back from the contexts, which read them until their end.
    pub(super) fn run(
        &mut self,
        request: &Request,
        number: usize,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
    ) -> Exchange {
        let mut trace = Trace::default();
        let mut end = match self.exchange(request, number, upstream, &mut trace) {
            Ok(response) => StreamEnd::Answered(response),
            Err(Halt::Stalled(why)) => StreamEnd::Stalled(why),
            Err(Halt::Reset(why)) => StreamEnd::Reset(why),
        };
        self.finish(match &mut end {
            StreamEnd::Answered(response) => Some(response),
            _ => None,
        });
        if let (Some(seen), Some(shared)) = (trace.upstream.as_mut(), self.request.take()) {
            seen.headers = Arc::unwrap_or_clone(shared);
        }
        Exchange {
            worker: self.w,
            upstream: trace.upstream,
            end,
            local_reply: trace.local_reply,
            notes: trace.notes,
        }
    }

    /// Lends the request's headers to every context of the stream: Envoy's filters all read
    /// the one map for `request.*` properties, after their own headers callback too.
    fn share_request(&mut self, headers: HeaderMap) {
        let shared = Arc::new(headers);
        self.lend_request(Some(&shared));
        self.request = Some(shared);
    }

    /// Takes the request's headers back from the contexts, for the router to change.
    fn unshare_request(&mut self) -> HeaderMap {
        self.lend_request(None);
        self.request
            .take()
            .map(Arc::unwrap_or_clone)
            .unwrap_or_default()
    }

    fn lend_request(&mut self, shared: Option<&Arc<HeaderMap>>) {
        let worker = &mut self.threads.workers[self.w];
        for &(vm, ctx) in self.contexts.iter().flatten() {
            if let Some(s) = worker.vms[vm].http_state(ctx) {
                s.request_snapshot = shared.cloned();
            }
        }
    }

    /// Decode, route and forward, encode: the response the client gets, or why it gets none.
    /// Who answered and the framing notes go into `trace` on the way.
    fn exchange(
        &mut self,
        request: &Request,
        number: usize,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
        trace: &mut Trace,
    ) -> Result<Response, Halt> {
        self.tick_wait = request.tick_wait;
        let (response, encoders, grpc) = self.decode(request, number, upstream, trace)?;
        let mut response = self.encode(response, encoders, grpc, trace)?;
        // Towards an HTTP/2 client Envoy's HTTP/2 codec frames the body: no HTTP/1 framing.
        if request.protocol.speaks_http1() {
            let message = &mut response.message;
            frame(
                &mut message.headers,
                &mut message.body,
                "client",
                &mut trace.notes,
            )?;
        }
        // Envoy's connection manager also closes an HTTP/1.1 connection after a local reply of
        // 400 (`ActiveStream::onLocalReply`): the rest of the request may not parse.
        let bad_request = trace.local_reply.is_some() && response.status == 400;
        if !self.request_complete || bad_request {
            router::close_after(&mut response, request.protocol);
        }
        router::finalize_downstream(&mut response, request.protocol, self.hcm.http1_trailers);
        Ok(response)
    }

    /// Decode, then route and forward: the response the filters encode (the upstream's or a
    /// local reply), how many filters it runs back through, and whether the request is gRPC.
    fn decode(
        &mut self,
        request: &Request,
        number: usize,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
        trace: &mut Trace,
    ) -> Result<(Outgoing, usize, bool), Halt> {
        self.setup(&Arc::new(request.dynamic_metadata.clone()));
        let n = self.contexts.len();
        let router::Incoming {
            headers,
            chunks,
            trailers,
            grpc,
        } = router::incoming(request, number, self.hcm.http1_trailers);
        let end_at_headers = chunks.is_empty() && trailers.is_none();
        // A deny-all RBAC filter stops the request before the filters after it.
        let reach = self.hcm.deny_at.map_or(n, |k| k.min(n));
        let decode_order = Order::Forward(reach);
        let (headers, decoded) =
            self.headers_phase(Dir::Request, decode_order, headers, end_at_headers, 0);
        self.share_request(headers);
        let chunks = if self.resumed_at_request_headers {
            router::buffered_while_paused(request, chunks, trailers.is_some())
        } else {
            chunks
        };
        // Envoy's RBAC filter answers in its headers callback: no filter decodes the body.
        let denied = self.hcm.deny_at.is_some() && decoded.is_ok();
        let decoded = match decoded {
            Ok(()) if denied => Ok((Vec::new(), None)),
            _ => {
                decoded.and_then(|()| self.data_phase(Dir::Request, decode_order, chunks, trailers))
            }
        };
        // How many filters the response runs back through.
        let (response, encoders) = match decoded {
            Err((_, StopReason::Halt(halt))) => return Err(halt),
            Err((i, StopReason::LocalReply(source, reply))) => {
                trace.local_reply = Some(source);
                (router::local_reply_response(&reply, grpc), i + 1)
            }
            Ok(_) if denied => {
                trace.local_reply = Some(LocalReplySource::Rbac);
                let response = router::local_reply_response(&router::rbac_denied(), grpc);
                (response, reach)
            }
            Ok((body, trailers)) => {
                let response = self.route_and_forward(body, trailers, grpc, upstream, trace)?;
                (response, n)
            }
        };
        Ok((response, encoders, grpc))
    }

    /// Encode: the response through `encoders` filters, last to first; a local reply made on
    /// the way replaces it.
    fn encode(
        &mut self,
        response: Outgoing,
        encoders: usize,
        grpc: bool,
        trace: &mut Trace,
    ) -> Result<Response, Halt> {
        // Encode: the response runs back through the filters, last to first, starting at the
        // one that produced a local reply.
        let encode_order = Order::Backward(encoders);
        let Outgoing {
            status,
            headers,
            chunks,
            trailers,
        } = response;
        let end_at_headers = chunks.is_empty() && trailers.is_none();
        let (headers, encoded) =
            self.headers_phase(Dir::Response, encode_order, headers, end_at_headers, status);
        let encoded = encoded.and_then(|()| {
            let (body, trailers) =
                self.data_phase(Dir::Response, encode_order, chunks, trailers)?;
            Ok(Response {
                status,
                message: Message {
                    headers,
                    body,
                    trailers: trailers.unwrap_or_default(),
                    ..Message::default()
                },
            })
        });
        match encoded {
            Ok(r) => Ok(r),
            Err((_, StopReason::Halt(halt))) => Err(halt),
            // Envoy can still replace the response before its headers went out.
            Err((_, StopReason::LocalReply(source, reply))) => {
                trace.local_reply = Some(source);
                let r = router::local_reply_response(&reply, grpc);
                // It does not pass through the filters again.
                Ok(Response {
                    status: r.status,
                    message: Message {
                        headers: r.headers,
                        body: r.chunks.concat(),
                        ..Message::default()
                    },
                })
            }
        }
    }

    /// The router's part: the decoded request goes to its route's upstream (whose response
    /// comes back), or the router answers itself. The contexts get the request's headers
    /// back, as the router left them, for the rest of the stream.
    fn route_and_forward(
        &mut self,
        body: Vec<u8>,
        trailers: Option<HeaderMap>,
        grpc: bool,
        upstream: &mut dyn FnMut(&SeenRequest) -> UpstreamReply,
        trace: &mut Trace,
    ) -> Result<Outgoing, Halt> {
        let mut headers = self.unshare_request();
        let routes = &self.hcm.routes;
        let response = match router::route(self.bootstrap, routes, &mut headers, grpc) {
            Routed::Reply(source, reply) => {
                trace.local_reply = Some(source);
                reply
            }
            Routed::Upstream(cluster)
                if router::upstream_protocol(self.bootstrap, &cluster)
                    == crate::envoy::bootstrap::UpstreamProtocol::Http2
                    && router::http2_length_mismatch(&headers, &body).is_some() =>
            {
                trace
                    .notes
                    .extend(router::http2_length_mismatch(&headers, &body));
                trace.local_reply = Some(LocalReplySource::UpstreamReset);
                router::local_reply_response(&router::protocol_error(), grpc)
            }
            Routed::Upstream(cluster) => {
                let mut body = body;
                frame(&mut headers, &mut body, "upstream", &mut trace.notes)?;
                let protocol = router::upstream_protocol(self.bootstrap, &cluster);
                // The host the router picks: the cluster's first endpoint (`upstream.address`).
                if let Some(endpoint) = self
                    .bootstrap
                    .cluster(&cluster)
                    .and_then(|c| c.endpoints.first())
                {
                    let _ = self.connection.upstream.set(endpoint.clone());
                }
                let mut seen = SeenRequest {
                    cluster,
                    message: Message {
                        headers,
                        body,
                        trailers: router::forwarded_trailers(trailers, protocol),
                        ..Message::default()
                    },
                };
                let reply = upstream(&seen);
                // The contexts read the headers until their end; `run` returns them.
                headers = std::mem::take(&mut seen.headers);
                trace.upstream = Some(seen);
                router::upstream_response(reply, protocol)
            }
        };
        self.share_request(headers);
        Ok(response)
    }

    /// Stream end: `on_log` (reading the request headers and the response the client got),
    /// `on_done`, `on_delete` on every filter's context.
    /// The response's maps are lent to the contexts as the request's are (shared, not copied:
    /// every request pays for this phase), and are the client's again once the phase is over.
    fn finish(&mut self, response: Option<&mut Response>) {
        let lent = response.map(|r| {
            let headers = Arc::new(std::mem::take(&mut r.message.headers));
            let trailers =
                (!r.trailers.is_empty()).then(|| Arc::new(std::mem::take(&mut r.message.trailers)));
            (r, headers, trailers)
        });
        let log = host::AccessLogMaps {
            request_headers: self.request.clone(),
            response_headers: lent.as_ref().map(|(_, h, _)| Arc::clone(h)),
            response_trailers: lent.as_ref().and_then(|(_, _, t)| t.clone()),
        };
        for c in std::mem::take(&mut self.contexts).into_iter().flatten() {
            self.worker().vms[c.0].finish_stream(c.1, log.clone());
            self.threads.deliver_posted();
        }
        drop(log);
        if let Some((r, headers, trailers)) = lent {
            r.message.headers = Arc::unwrap_or_clone(headers);
            r.message.trailers = trailers.map(Arc::unwrap_or_clone).unwrap_or_default();
        }
    }
}

/// Frames a message for HTTP/1 as Envoy's codec does; a body shorter than its declared length
/// leaves the peer waiting, which stalls the stream.
fn frame(
    headers: &mut HeaderMap,
    body: &mut Vec<u8>,
    peer: &str,
    notes: &mut Vec<String>,
) -> Result<(), Halt> {
    match router::http1_framing(headers, body, peer) {
        Framing::Fine => Ok(()),
        Framing::Truncated(note) => {
            notes.push(note);
            Ok(())
        }
        Framing::Short(why) => Err(Halt::Stalled(why)),
    }
}
