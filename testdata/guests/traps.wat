;; Traps in proxy_on_request_headers in the way the request path names (its second byte):
;; /unreachable, /memory (out of bounds), /divide (by zero), /overflow (i32.div_s of
;; INT_MIN by -1), /stack (endless recursion), /null (call_indirect of an empty table
;; slot), /table (call_indirect past the table), /wrong-type (call_indirect of the wrong
;; type); any other path passes. Shows the words Envoy uses for each failure.
(module
  (import "env" "proxy_get_header_map_value" (func $header (param i32 i32 i32 i32 i32) (result i32)))
  (type $void (func))
  (type $unary (func (param i32) (result i32)))
  (memory (export "memory") 1)
  (table 2 funcref)
  (elem (i32.const 0) $nothing)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 16) ":path")
  (func $nothing)
  (func $recurse (param $n i32) (result i32)
    (i32.add (call $recurse (i32.add (local.get $n) (i32.const 1))) (i32.const 1)))
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
    (local $c i32)
    (drop (call $header (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 32) (i32.const 36)))
    (if (i32.lt_u (i32.load (i32.const 36)) (i32.const 2)) (then (return (i32.const 0))))
    (local.set $c (i32.load8_u (i32.add (i32.load (i32.const 32)) (i32.const 1))))
    (if (i32.eq (local.get $c) (i32.const 117)) (then unreachable)) ;; u
    (if (i32.eq (local.get $c) (i32.const 109)) ;; m
      (then (drop (i32.load (i32.const 0x7ffffff0)))))
    (if (i32.eq (local.get $c) (i32.const 100)) ;; d
      (then (drop (i32.div_u (i32.const 1) (i32.load (i32.const 0))))))
    (if (i32.eq (local.get $c) (i32.const 111)) ;; o
      (then (drop (i32.div_s (i32.const 0x80000000) (i32.const -1)))))
    (if (i32.eq (local.get $c) (i32.const 115)) ;; s
      (then (drop (call $recurse (i32.const 0)))))
    (if (i32.eq (local.get $c) (i32.const 110)) ;; n
      (then (call_indirect (type $void) (i32.const 1))))
    (if (i32.eq (local.get $c) (i32.const 116)) ;; t
      (then (call_indirect (type $void) (i32.const 7))))
    (if (i32.eq (local.get $c) (i32.const 119)) ;; w
      (then (drop (call_indirect (type $unary) (i32.const 5) (i32.const 0)))))
    (i32.const 0))
)
