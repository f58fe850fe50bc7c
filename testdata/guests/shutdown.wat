;; Root context shutdown (ABI 0.2.1). Logs "root on_done <root>" and "root on_delete <root>"
;; for its root context, "stream on_done" for streams, and what proxy_done returns:
;;   proxy_on_configure calls proxy_done (a root that is not shutting down: NotFound = 1) and
;;   logs "proxy_done while running -> <status>".
;; The plugin configuration picks what proxy_on_done answers for the root:
;;   ""/anything else  true: Envoy deletes the root at once
;;   "wait"            false, and sets a 1000 ms tick; the next proxy_on_tick logs
;;                     "flushing", calls proxy_done and logs "proxy_done -> <status>"
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_done" (func $done (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $set_tick (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $cur (mut i32) (i32.const 0))
  (global $root (mut i32) (i32.const 0))
  (global $wait (mut i32) (i32.const 0))
  (data (i32.const 16) "root on_done ")
  (data (i32.const 32) "root on_delete ")
  (data (i32.const 48) "stream on_done")
  (data (i32.const 64) "proxy_done while running -> ")
  (data (i32.const 96) "flushing")
  (data (i32.const 112) "proxy_done -> ")
  ;; 128: out-params (ptr, size)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))

  ;; Message building at 1024: $put appends bytes, $num a decimal number, $emit logs at info.
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
  (func $say (param $p i32) (param $n i32) (param $v i32)
    (global.set $cur (i32.const 1024))
    (call $put (local.get $p) (local.get $n))
    (call $num (local.get $v))
    (drop (call $log (i32.const 2) (i32.const 1024) (i32.sub (global.get $cur) (i32.const 1024)))))

  (func (export "proxy_on_context_create") (param $id i32) (param $parent i32)
    (if (i32.eqz (local.get $parent)) (then (global.set $root (local.get $id)))))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (if (i32.eq (local.get $size) (i32.const 4))
      (then
        (if (i32.eqz (call $get_buffer (i32.const 7) (i32.const 0) (local.get $size) (i32.const 128) (i32.const 132)))
          (then
            ;; "wait"
            (if (i32.eq (i32.load (i32.load (i32.const 128))) (i32.const 0x74696177))
              (then (global.set $wait (i32.const 1))))))))
    (call $say (i32.const 64) (i32.const 28) (call $done))
    (i32.const 1))
  (func (export "proxy_on_done") (param $id i32) (result i32)
    (if (i32.ne (local.get $id) (global.get $root))
      (then
        (drop (call $log (i32.const 2) (i32.const 48) (i32.const 14)))
        (return (i32.const 1))))
    (call $say (i32.const 16) (i32.const 13) (local.get $id))
    (if (global.get $wait)
      (then
        (drop (call $set_tick (i32.const 1000)))
        (return (i32.const 0))))
    (i32.const 1))
  (func (export "proxy_on_tick") (param $root i32)
    (drop (call $log (i32.const 2) (i32.const 96) (i32.const 8)))
    (call $say (i32.const 112) (i32.const 14) (call $done)))
  (func (export "proxy_on_delete") (param $id i32)
    (if (i32.eq (local.get $id) (global.get $root))
      (then (call $say (i32.const 32) (i32.const 15) (local.get $id)))))
)
