;; A ticking guest (ABI 0.2.1). Each proxy_on_tick logs
;;   "on_tick root=<root id> n=<ticks so far> now=<proxy_get_current_time_nanoseconds> mono=<WASI monotonic ns>"
;; so tests can count ticks per worker and see the virtual clock during each tick.
;; The plugin configuration picks when the timer is set and whether it stops:
;;   ""/anything else  proxy_on_configure sets a 1000 ms period
;;   "stop"            same, and the second tick sets the period to 0
;;   "request"         nothing at configure time; each request sets a 500 ms period from its
;;                     stream context (Envoy applies it to the stream's root context)
;;   "trap"            1000 ms, and proxy_on_tick traps (as a Rust guest does after a panic)
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $set_tick (param i32) (result i32)))
  (import "env" "proxy_get_current_time_nanoseconds" (func $now (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $cur (mut i32) (i32.const 0))
  ;; 0 = configure-time 1000 ms, 1 = stop after 2 ticks, 2 = set per request, 3 = trap in on_tick
  (global $mode (mut i32) (i32.const 0))
  (global $ticks (mut i64) (i64.const 0))
  (data (i32.const 16) "on_tick root=")
  (data (i32.const 32) " n=")
  (data (i32.const 40) " now=")
  (data (i32.const 48) " mono=")
  (data (i32.const 64) "request set a 500 ms tick period")
  ;; 128: out-params (ptr, size); 136: u64 clock results
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))

  ;; Message building at 1024: $put appends bytes, $num a decimal u64, $emit logs at info.
  (func $put (param $p i32) (param $n i32)
    (memory.copy (global.get $cur) (local.get $p) (local.get $n))
    (global.set $cur (i32.add (global.get $cur) (local.get $n))))
  (func $num (param $v i64)
    (local $t i32)
    (local.set $t (i32.const 1000))
    (loop $digits
      (local.set $t (i32.sub (local.get $t) (i32.const 1)))
      (i32.store8 (local.get $t)
        (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $v) (i64.const 10)))))
      (local.set $v (i64.div_u (local.get $v) (i64.const 10)))
      (br_if $digits (i64.ne (local.get $v) (i64.const 0))))
    (call $put (local.get $t) (i32.sub (i32.const 1000) (local.get $t))))
  (func $emit
    (drop (call $log (i32.const 2) (i32.const 1024) (i32.sub (global.get $cur) (i32.const 1024)))))

  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (local $p i32)
    (if (i32.ge_u (local.get $size) (i32.const 4))
      (then
        (if (i32.eqz (call $get_buffer (i32.const 7) (i32.const 0) (local.get $size) (i32.const 128) (i32.const 132)))
          (then
            (local.set $p (i32.load (i32.const 128)))
            ;; "stop" / "request"
            (if (i32.eq (i32.load (local.get $p)) (i32.const 0x706f7473))
              (then (global.set $mode (i32.const 1))))
            (if (i32.eq (i32.load (local.get $p)) (i32.const 0x75716572))
              (then (global.set $mode (i32.const 2))))
            (if (i32.eq (i32.load (local.get $p)) (i32.const 0x70617274))
              (then (global.set $mode (i32.const 3))))))))
    (if (i32.ne (global.get $mode) (i32.const 2))
      (then (drop (call $set_tick (i32.const 1000)))))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (if (i32.eq (global.get $mode) (i32.const 2))
      (then
        (drop (call $set_tick (i32.const 500)))
        (drop (call $log (i32.const 2) (i32.const 64) (i32.const 32)))))
    (i32.const 0))
  (func (export "proxy_on_tick") (param $root i32)
    (if (i32.eq (global.get $mode) (i32.const 3)) (then unreachable))
    (global.set $ticks (i64.add (global.get $ticks) (i64.const 1)))
    (global.set $cur (i32.const 1024))
    (call $put (i32.const 16) (i32.const 13))
    (call $num (i64.extend_i32_u (local.get $root)))
    (call $put (i32.const 32) (i32.const 3))
    (call $num (global.get $ticks))
    (call $put (i32.const 40) (i32.const 5))
    (drop (call $now (i32.const 136)))
    (call $num (i64.load (i32.const 136)))
    (call $put (i32.const 48) (i32.const 6))
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 136)))
    (call $num (i64.load (i32.const 136)))
    (call $emit)
    (if (i32.and (i32.eq (global.get $mode) (i32.const 1)) (i64.eq (global.get $ticks) (i64.const 2)))
      (then (drop (call $set_tick (i32.const 0))))))
)
