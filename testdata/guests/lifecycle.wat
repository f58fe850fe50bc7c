;; A guest that says when it starts (ABI 0.2.1): `proxy_on_vm_start` logs "on_vm_start n=<how
;; many root contexts this VM has started, this one included>" and `proxy_on_configure` logs
;; "on_configure <the plugin configuration>", both at info. Both run once per root context, so
;; counting them per thread shows how Envoy keys VMs and root contexts: "n=1" once per VM,
;; `on_configure` once per distinct plugin of that VM.
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $starts (mut i32) (i32.const 0))
  (data (i32.const 16) "on_vm_start n=")
  (data (i32.const 1024) "on_configure ")
  ;; 128: out-params (pointer, size) of proxy_get_buffer_bytes
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32)
    (global.set $starts (i32.add (global.get $starts) (i32.const 1)))
    ;; One digit: a VM of this test hosts fewer than ten plugins.
    (i32.store8 (i32.const 30) (i32.add (i32.const 48) (global.get $starts)))
    (drop (call $log (i32.const 2) (i32.const 16) (i32.const 15)))
    (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (local $n i32)
    ;; At most 64 bytes of the configuration follow the prefix at 1024.
    (if (i32.gt_u (local.get $size) (i32.const 0))
      (then
        (if (i32.eqz (call $get_buffer (i32.const 7) (i32.const 0) (local.get $size) (i32.const 128) (i32.const 132)))
          (then
            (local.set $n (i32.load (i32.const 132)))
            (if (i32.gt_u (local.get $n) (i32.const 64)) (then (local.set $n (i32.const 64))))
            (memory.copy (i32.const 1037) (i32.load (i32.const 128)) (local.get $n))))))
    (drop (call $log (i32.const 2) (i32.const 1024) (i32.add (i32.const 13) (local.get $n))))
    (i32.const 1))
)
