;; Logs every request header the filter gets, in order, as "request header <name>: <value>"
;; (what the proxy-wasm SDK's `http_headers` example does), so a comparison with real Envoy
;; shows the values Envoy makes up (`x-request-id`). A request with an `x-hold` header is
;; then held: the callback logs "holding the stream" and answers StopIteration, and nothing
;; resumes it. A request with an `x-reply` header gets a local reply from the headers callback
;; (403 "denied"), before any body it carries was read. Each request logs the `request.protocol`
;; property ("request protocol: HTTP/1.1"). Each stream's end logs "stream on_log" and
;; "stream on_done", so a held stream's end (when the client gives up) is compared too.
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response" (func $reply (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 16384))
  (global $pos (mut i32) (i32.const 4096))
  (data (i32.const 256) "request header ")
  (data (i32.const 272) ": ")
  (data (i32.const 288) "x-hold")
  (data (i32.const 304) "holding the stream")
  (data (i32.const 336) "stream on_log")
  (data (i32.const 352) "stream on_done")
  (data (i32.const 384) "request\00protocol")
  (data (i32.const 400) "request protocol: ")
  (data (i32.const 432) "x-reply")
  (data (i32.const 448) "denied")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  ;; Appends `len` bytes at `src` to the message being built at 4096.
  (func $put (param $src i32) (param $len i32)
    (memory.copy (global.get $pos) (local.get $src) (local.get $len))
    (global.set $pos (i32.add (global.get $pos) (local.get $len))))
  (func $flush
    (drop (call $log (i32.const 2) (i32.const 4096) (i32.sub (global.get $pos) (i32.const 4096))))
    (global.set $pos (i32.const 4096)))
  ;; The serialized pairs: a count, then (name length, value length) per pair, then each
  ;; name and value followed by a NUL.
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $data i32) (local $n i32) (local $i i32) (local $sizes i32) (local $text i32)
    (local $klen i32) (local $vlen i32)
    (i32.store (i32.const 100) (i32.const 0))
    (i32.store (i32.const 104) (i32.const 0))
    (drop (call $pairs (i32.const 0) (i32.const 100) (i32.const 104)))
    (local.set $data (i32.load (i32.const 100)))
    (if (i32.ne (local.get $data) (i32.const 0))
      (then
        (local.set $n (i32.load (local.get $data)))
        (local.set $sizes (i32.add (local.get $data) (i32.const 4)))
        (local.set $text (i32.add (local.get $sizes) (i32.mul (local.get $n) (i32.const 8))))
        (block $done
          (loop $next
            (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
            (local.set $klen (i32.load (local.get $sizes)))
            (local.set $vlen (i32.load offset=4 (local.get $sizes)))
            (call $put (i32.const 256) (i32.const 15))
            (call $put (local.get $text) (local.get $klen))
            (call $put (i32.const 272) (i32.const 2))
            (call $put (i32.add (local.get $text) (i32.add (local.get $klen) (i32.const 1)))
              (local.get $vlen))
            (call $flush)
            (local.set $text (i32.add (local.get $text)
              (i32.add (i32.add (local.get $klen) (local.get $vlen)) (i32.const 2))))
            (local.set $sizes (i32.add (local.get $sizes) (i32.const 8)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $next)))))
    (if (i32.eqz (call $prop (i32.const 384) (i32.const 16) (i32.const 116) (i32.const 120)))
      (then
        (call $put (i32.const 400) (i32.const 18))
        (call $put (i32.load (i32.const 116)) (i32.load (i32.const 120)))
        (call $flush)))
    (if (i32.eqz (call $get (i32.const 0) (i32.const 432) (i32.const 7) (i32.const 108) (i32.const 112)))
      (then
        (drop (call $reply (i32.const 403) (i32.const 0) (i32.const 0) (i32.const 448) (i32.const 6)
          (i32.const 0) (i32.const 0) (i32.const -1)))
        (return (i32.const 1))))
    (if (i32.eqz (call $get (i32.const 0) (i32.const 288) (i32.const 6) (i32.const 108) (i32.const 112)))
      (then
        (call $put (i32.const 304) (i32.const 18))
        (call $flush)
        (return (i32.const 1))))
    (i32.const 0))
  (func (export "proxy_on_log") (param i32)
    (drop (call $log (i32.const 2) (i32.const 336) (i32.const 13))))
  (func (export "proxy_on_done") (param i32) (result i32)
    (drop (call $log (i32.const 2) (i32.const 352) (i32.const 14)))
    (i32.const 1))
)
