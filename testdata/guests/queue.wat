;; A shared-queue guest (ABI 0.2.1), for proxy_on_queue_ready delivery.
;; - proxy_on_configure sets a 1000 ms tick period.
;; - Each request registers the queue "pings" (from its stream context, so for its root context:
;;   the last registration wins) and enqueues "req".
;; - Each tick resolves "pings"; if it exists it enqueues "ping" and logs "tick enqueued ping",
;;   else logs "tick: no queue yet".
;; - proxy_on_queue_ready(root, queue) dequeues one item and logs
;;   "on_queue_ready root=<root> queue=<queue> got <item>".
;; With the plugin configuration "pingpong", proxy_on_queue_ready enqueues "pong" back to the
;; same queue every time: a notification storm that never settles.
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $set_tick (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_register_shared_queue" (func $register (param i32 i32 i32) (result i32)))
  (import "env" "proxy_resolve_shared_queue" (func $resolve (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_enqueue_shared_queue" (func $enqueue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_dequeue_shared_queue" (func $dequeue (param i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $cur (mut i32) (i32.const 0))
  (global $pingpong (mut i32) (i32.const 0))
  (data (i32.const 16) "pings")
  (data (i32.const 24) "req")
  (data (i32.const 28) "ping")
  (data (i32.const 32) "pong")
  (data (i32.const 40) "registered queue pings id=")
  (data (i32.const 80) "tick enqueued ping")
  (data (i32.const 100) "tick: no queue yet")
  (data (i32.const 120) "on_queue_ready root=")
  (data (i32.const 144) " queue=")
  (data (i32.const 152) " got ")
  (data (i32.const 160) "on_queue_ready: dequeue failed")
  ;; 200: queue id out-param; 208/212: dequeue out-params (ptr, size)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))

  (func $put (param $p i32) (param $n i32)
    (memory.copy (global.get $cur) (local.get $p) (local.get $n))
    (global.set $cur (i32.add (global.get $cur) (local.get $n))))
  (func $num (param $v i32)
    (local $t i32)
    (local.set $t (i32.const 1000))
    (loop $digits
      (local.set $t (i32.sub (local.get $t) (i32.const 1)))
      (i32.store8 (local.get $t) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $digits (i32.ne (local.get $v) (i32.const 0))))
    (call $put (local.get $t) (i32.sub (i32.const 1000) (local.get $t))))
  (func $emit
    (drop (call $log (i32.const 2) (i32.const 1024) (i32.sub (global.get $cur) (i32.const 1024)))))

  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (if (i32.ge_u (local.get $size) (i32.const 4))
      (then
        (if (i32.eqz (call $get_buffer (i32.const 7) (i32.const 0) (local.get $size) (i32.const 208) (i32.const 212)))
          (then
            ;; "ping" of "pingpong"
            (if (i32.eq (i32.load (i32.load (i32.const 208))) (i32.const 0x676e6970))
              (then (global.set $pingpong (i32.const 1))))))))
    (drop (call $set_tick (i32.const 1000)))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $register (i32.const 16) (i32.const 5) (i32.const 200)))
    (global.set $cur (i32.const 1024))
    (call $put (i32.const 40) (i32.const 26))
    (call $num (i32.load (i32.const 200)))
    (call $emit)
    (drop (call $enqueue (i32.load (i32.const 200)) (i32.const 24) (i32.const 3)))
    (i32.const 0))
  (func (export "proxy_on_tick") (param $root i32)
    (if (i32.eqz (call $resolve (i32.const 0) (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 200)))
      (then
        (drop (call $enqueue (i32.load (i32.const 200)) (i32.const 28) (i32.const 4)))
        (drop (call $log (i32.const 2) (i32.const 80) (i32.const 18))))
      (else
        (drop (call $log (i32.const 2) (i32.const 100) (i32.const 18))))))
  (func (export "proxy_on_queue_ready") (param $root i32) (param $queue i32)
    (if (call $dequeue (local.get $queue) (i32.const 208) (i32.const 212))
      (then
        (drop (call $log (i32.const 2) (i32.const 160) (i32.const 30)))
        (return)))
    (global.set $cur (i32.const 1024))
    (call $put (i32.const 120) (i32.const 20))
    (call $num (local.get $root))
    (call $put (i32.const 144) (i32.const 7))
    (call $num (local.get $queue))
    (call $put (i32.const 152) (i32.const 5))
    (call $put (i32.load (i32.const 208)) (i32.load (i32.const 212)))
    (call $emit)
    (if (global.get $pingpong)
      (then (drop (call $enqueue (local.get $queue) (i32.const 32) (i32.const 4))))))
)
