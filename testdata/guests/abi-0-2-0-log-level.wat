;; An ABI 0.2.0 guest importing `proxy_get_log_level`, which only 0.2.1 has: Envoy refuses to
;; link it, so it never starts.
(module
  (import "env" "proxy_get_log_level" (func $level (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_0"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
)
