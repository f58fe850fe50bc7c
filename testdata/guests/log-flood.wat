;; Floods the log: proxy_on_request_headers logs its 1 MiB of text 100 times (100 MiB in all),
;; then writes it to stdout through 4096 iovecs that all point at that same MiB (4 GiB in one
;; fd_write). The harness must keep its log within its cap, say what it dropped, and never
;; gather more than a bounded number of bytes for one hostcall.
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  ;; 64 KiB of scratch, the MiB of text at 65536, the iovec table at 1114112 (32 KiB).
  (memory (export "memory") 18)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (memory.fill (i32.const 65536) (i32.const 97) (i32.const 1048576))
    (loop $logs
      (drop (call $log (i32.const 2) (i32.const 65536) (i32.const 1048576)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $logs (i32.lt_u (local.get $i) (i32.const 100))))
    (local.set $i (i32.const 0))
    (loop $iovs
      (i32.store (i32.add (i32.const 1114112) (i32.mul (local.get $i) (i32.const 8)))
        (i32.const 65536))
      (i32.store (i32.add (i32.const 1114116) (i32.mul (local.get $i) (i32.const 8)))
        (i32.const 1048576))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $iovs (i32.lt_u (local.get $i) (i32.const 4096))))
    (drop (call $write (i32.const 1) (i32.const 1114112) (i32.const 4096) (i32.const 0)))
    (i32.const 0))
)
