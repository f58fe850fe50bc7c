;; Grows its memory to Envoy's cap (1 GiB = 16384 pages) and then one page more. The last grow
;; must fail (-1) without trapping; the request is marked `x-memory: capped` when it did and
;; the memory is exactly at the cap, `x-memory: uncapped` otherwise.
(module
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "x-memory")
  (data (i32.const 32) "capped")
  (data (i32.const 48) "uncapped")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (if (i32.and
          (i32.and
            (i32.ne (memory.grow (i32.sub (i32.const 16384) (memory.size))) (i32.const -1))
            (i32.eq (memory.grow (i32.const 1)) (i32.const -1)))
          (i32.eq (memory.size) (i32.const 16384)))
      (then (drop (call $add (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 32) (i32.const 6))))
      (else (drop (call $add (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 48) (i32.const 8)))))
    (i32.const 0))
)
