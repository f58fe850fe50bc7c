;; Defines the counter `requests` on every VM and counts each request into it. In Envoy the
;; stat is proxy-wide: all workers count into one `wasmcustom.requests`.
(module
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "requests")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (i32.eqz (call $define (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 64))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $inc (i32.load (i32.const 64)) (i64.const 1)))
    (i32.const 0))
)
