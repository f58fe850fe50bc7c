;; Hands the host pointers outside its memory: a key, a return pointer, a log message. Each
;; must come back as InvalidMemoryAccess (6), never crash the host; the guest then marks the
;; request `x-bad-pointers: rejected` (or `accepted` if any call did something else).
(module
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 16) "x-bad-pointers")
  (data (i32.const 32) "rejected")
  (data (i32.const 48) "accepted")
  (data (i32.const 64) ":path")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $ok i32)
    (local.set $ok (i32.const 1))
    ;; key beyond the end of memory
    (if (i32.ne (call $get (i32.const 0) (i32.const 0xfffffff0) (i32.const 16) (i32.const 100) (i32.const 104)) (i32.const 6))
      (then (local.set $ok (i32.const 0))))
    ;; valid key, return pointers beyond the end of memory
    (if (i32.ne (call $get (i32.const 0) (i32.const 64) (i32.const 5) (i32.const 0xfffffff0) (i32.const 0xfffffff8)) (i32.const 6))
      (then (local.set $ok (i32.const 0))))
    ;; a log message that runs off the end of memory
    (if (i32.ne (call $log (i32.const 2) (i32.const 65000) (i32.const 100000)) (i32.const 6))
      (then (local.set $ok (i32.const 0))))
    (if (local.get $ok)
      (then (drop (call $add (i32.const 0) (i32.const 16) (i32.const 14) (i32.const 32) (i32.const 8))))
      (else (drop (call $add (i32.const 0) (i32.const 16) (i32.const 14) (i32.const 48) (i32.const 8)))))
    (i32.const 0))
)
