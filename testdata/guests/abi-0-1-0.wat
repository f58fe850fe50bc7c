;; An ABI 0.1.0 guest: two-argument header callbacks, `proxy_get_configuration` (0.1.0 only),
;; and 0.1.0's answer for a missing header (Ok with an empty value, not NotFound). It adds
;; `x-abi: 0.1.0` when all three behave as Envoy's 0.1.0 host does.
(module
  (import "env" "proxy_get_configuration" (func $get_config (param i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_continue_request" (func $continue (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $configured (mut i32) (i32.const 0))
  (data (i32.const 16) "x-abi")
  (data (i32.const 32) "0.1.0")
  (data (i32.const 48) "x-missing")
  (data (i32.const 64) "v010")
  (func (export "proxy_abi_version_0_1_0"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  ;; The configuration must be "v010", read with the 0.1.0 call.
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (if (i32.ne (call $get_config (i32.const 100) (i32.const 104)) (i32.const 0))
      (then (return (i32.const 0))))
    (if (i32.ne (i32.load (i32.const 104)) (i32.const 4)) (then (return (i32.const 0))))
    (if (i32.ne (i32.load (i32.load (i32.const 100))) (i32.load (i32.const 64)))
      (then (return (i32.const 0))))
    (global.set $configured (i32.const 1))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32) (result i32)
    (if (i32.and
          (global.get $configured)
          (i32.and
            (i32.eqz (call $get (i32.const 0) (i32.const 48) (i32.const 9) (i32.const 108) (i32.const 112)))
            (i32.eqz (i32.load (i32.const 112)))))
      (then
        (drop (call $add (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 32) (i32.const 5)))))
    (i32.const 0))
)
