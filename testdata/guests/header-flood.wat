;; Adds the header `x-flood` (1 KiB of value) to the request 100000 times (100 MiB), until an
;; add fails; then it logs "header refused" and lets the request go on. The harness must
;; refuse before the map passes its limit.
(module
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "x-flood")
  (data (i32.const 32) "header refused")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 8192))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (memory.fill (i32.const 1024) (i32.const 118) (i32.const 1024))
    (block $done
      (loop $more
        (br_if $done (i32.ge_u (local.get $i) (i32.const 100000)))
        (if (i32.ne (call $add (i32.const 0) (i32.const 16) (i32.const 7) (i32.const 1024) (i32.const 1024))
                    (i32.const 0))
          (then
            (drop (call $log (i32.const 2) (i32.const 32) (i32.const 14)))
            (br $done)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $more)))
    (i32.const 0))
)
