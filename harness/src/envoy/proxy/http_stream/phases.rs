//! A stream's messages through the filters: headers, then body chunks with Envoy's buffering,
//! then trailers, in one direction's order. Each filter's stream state holds the part while
//! its callback runs, so the guest's hostcalls read and edit it there.

use super::{ChainAfter, Dir, Halt, HttpStream, Order, Part, StopReason, Stopped};
use crate::engine::abi::{BufferType, MapType};
use crate::engine::host;
use crate::envoy::http::HeaderMap;

impl HttpStream<'_> {
    /// Request or response headers through the filters in `order`; the map each filter
    /// leaves goes to the next. The map is returned however the phase ended: a stopped
    /// request's headers still answer `request.*` properties.
    pub(super) fn headers_phase(
        &mut self,
        dir: Dir,
        order: Order,
        mut headers: HeaderMap,
        end_of_stream: bool,
        status: u16,
    ) -> (HeaderMap, Result<(), Stopped>) {
        let phase = dir.phase(Part::Headers);
        if dir == Dir::Request {
            self.request_complete = end_of_stream;
        }
        for pos in 0..order.len() {
            let i = order.at(pos);
            let count = headers.len();
            let unplaced = self.give_to_filter(i, std::mem::take(&mut headers), |s, h| match dir {
                Dir::Request => s.request_headers = Some(h),
                Dir::Response => {
                    s.response_headers = Some(h);
                    s.response_code = Some(status);
                }
            });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_headers(ctx, count, end_of_stream),
                Dir::Response => vm.on_response_headers(ctx, count, end_of_stream),
            });
            // A filter that let its headers go no longer sees them (Envoy's availability).
            headers = unplaced
                .or_else(|| {
                    self.take_from_filter(i, |s| match dir {
                        Dir::Request => s.request_headers.take(),
                        Dir::Response => s.response_headers.take(),
                    })
                })
                .unwrap_or_default();
            match step {
                ChainAfter::Continue => {}
                ChainAfter::Paused(why) => {
                    return (headers, Err((i, StopReason::Halt(Halt::Stalled(why)))))
                }
                ChainAfter::Stop(r) => return (headers, Err((i, r))),
            }
        }
        (headers, Ok(()))
    }

    /// Body chunks, then trailers, through the filters in `order`, with Envoy's buffering: a
    /// filter that pauses on a chunk keeps it, sees the growing buffer with each later chunk
    /// (`body_size` = all of it), and releases it when it continues; a pause on the last
    /// chunk waits for a resume. With trailers, no chunk ends the stream, and a filter's
    /// `Continue` on its trailers releases what it buffered. Returns the body and trailers
    /// that came out of the last filter.
    pub(super) fn data_phase(
        &mut self,
        dir: Dir,
        order: Order,
        chunks: Vec<Vec<u8>>,
        mut trailers: Option<HeaderMap>,
    ) -> Result<(Vec<u8>, Option<HeaderMap>), Stopped> {
        if chunks.is_empty() && trailers.is_none() {
            return Ok((Vec::new(), None));
        }
        let mut held: Vec<Option<Vec<u8>>> = vec![None; order.len()];
        let mut out = Vec::new();
        let last = chunks.len();
        // Trailers start at the first filter, or after the one that added them.
        let mut first = 0;
        for (k, chunk) in chunks.into_iter().enumerate() {
            let end_of_stream = k + 1 == last && trailers.is_none();
            if dir == Dir::Request {
                self.request_complete = end_of_stream;
            }
            if let Some((pos, added)) =
                self.pass_chunk(dir, order, 0, chunk, end_of_stream, &mut held, &mut out)?
            {
                trailers = Some(added);
                first = pos + 1;
            }
        }
        let Some(t) = trailers.as_mut() else {
            return Ok((out, None));
        };
        let phase = dir.phase(Part::Trailers);
        if dir == Dir::Request {
            self.request_complete = true;
        }
        for pos in first..order.len() {
            let i = order.at(pos);
            let count = t.len();
            let buffered = held[pos].take().unwrap_or_default();
            let unplaced =
                self.give_to_filter(i, (std::mem::take(t), buffered), |s, (t, b)| match dir {
                    Dir::Request => {
                        s.request_trailers = Some(t);
                        s.request_body = b;
                    }
                    Dir::Response => {
                        s.response_trailers = Some(t);
                        s.response_body = b;
                    }
                });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_trailers(ctx, count),
                Dir::Response => vm.on_response_trailers(ctx, count),
            });
            let (back, buffered) = unplaced
                .or_else(|| {
                    self.take_from_filter(i, |s| {
                        Some(match dir {
                            Dir::Request => (
                                s.request_trailers.take().unwrap_or_default(),
                                std::mem::take(&mut s.request_body),
                            ),
                            Dir::Response => (
                                s.response_trailers.take().unwrap_or_default(),
                                std::mem::take(&mut s.response_body),
                            ),
                        })
                    })
                })
                .unwrap_or_default();
            *t = back;
            match step {
                ChainAfter::Continue => {}
                ChainAfter::Paused(why) => return Err((i, StopReason::Halt(Halt::Stalled(why)))),
                ChainAfter::Stop(r) => return Err((i, r)),
            }
            if !buffered.is_empty() {
                self.pass_chunk(dir, order, pos + 1, buffered, false, &mut held, &mut out)?;
            }
        }
        Ok((out, trailers))
    }

    /// One chunk through the filters from position `from` of `order`, added to what each
    /// filter holds; lands in `out` if every filter continues. A filter that adds trailers
    /// on the last chunk (Envoy's `addDecodedTrailers` / `addEncodedTrailers`) ends the
    /// stream with them instead: the filters after it see the chunk without the end of
    /// stream, and the trailers, with its position, are returned.
    #[allow(clippy::too_many_arguments)]
    fn pass_chunk(
        &mut self,
        dir: Dir,
        order: Order,
        from: usize,
        mut data: Vec<u8>,
        mut end_of_stream: bool,
        held: &mut [Option<Vec<u8>>],
        out: &mut Vec<u8>,
    ) -> Result<Option<(usize, HeaderMap)>, Stopped> {
        let phase = dir.phase(Part::Body);
        let mut added = None;
        let trailers = match dir {
            Dir::Request => MapType::RequestTrailers,
            Dir::Response => MapType::ResponseTrailers,
        };
        for (pos, slot) in held.iter_mut().enumerate().skip(from) {
            let i = order.at(pos);
            let mut buffer = slot.take().unwrap_or_default();
            buffer.append(&mut data);
            let size = buffer.len();
            let unplaced = self.give_to_filter(i, buffer, |s, b| {
                s.addable_trailers = end_of_stream.then_some(trailers);
                s.body_callback = Some(match dir {
                    Dir::Request => BufferType::HttpRequestBody,
                    Dir::Response => BufferType::HttpResponseBody,
                });
                match dir {
                    Dir::Request => s.request_body = b,
                    Dir::Response => s.response_body = b,
                }
            });
            let step = self.callback(i, phase, &mut |vm, ctx| match dir {
                Dir::Request => vm.on_request_body(ctx, size, end_of_stream),
                Dir::Response => vm.on_response_body(ctx, size, end_of_stream),
            });
            let (body, new_trailers) = unplaced
                .map(|b| (b, None))
                .or_else(|| {
                    self.take_from_filter(i, |s| {
                        s.addable_trailers = None;
                        s.body_callback = None;
                        Some(match dir {
                            Dir::Request => (
                                std::mem::take(&mut s.request_body),
                                s.request_trailers.take(),
                            ),
                            Dir::Response => (
                                std::mem::take(&mut s.response_body),
                                s.response_trailers.take(),
                            ),
                        })
                    })
                })
                .unwrap_or_default();
            if let Some(t) = new_trailers.filter(|_| end_of_stream) {
                added = Some((pos, t));
                end_of_stream = false;
            }
            match step {
                ChainAfter::Continue => data = body,
                ChainAfter::Paused(why) if end_of_stream => {
                    return Err((i, StopReason::Halt(Halt::Stalled(why))));
                }
                ChainAfter::Paused(_) => {
                    *slot = Some(body);
                    return Ok(added);
                }
                ChainAfter::Stop(r) => return Err((i, r)),
            }
        }
        out.append(&mut data);
        Ok(added)
    }

    /// Hands `value` to filter `i`'s stream state; gives it back when the filter has no
    /// context (a plugin that failed to start, under fail-open).
    fn give_to_filter<T>(
        &mut self,
        i: usize,
        value: T,
        f: impl FnOnce(&mut host::HttpStreamState, T),
    ) -> Option<T> {
        let worker = &mut self.threads.workers[self.w];
        match self.contexts[i].and_then(|(vm, ctx)| worker.vms[vm].http_state(ctx)) {
            Some(s) => {
                f(s, value);
                None
            }
            None => Some(value),
        }
    }

    /// Takes back what filter `i`'s stream state holds (`None`: the filter has no context).
    fn take_from_filter<T>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut host::HttpStreamState) -> Option<T>,
    ) -> Option<T> {
        let (vm, ctx) = self.contexts[i]?;
        self.worker().vms[vm].http_state(ctx).and_then(f)
    }
}
