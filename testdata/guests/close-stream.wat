;; Closes the stream (proxy_close_stream HTTP_REQUEST) when the request path is /close; other
;; requests go on untouched.
(module
  (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_close_stream" (func $close (param i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (data (i32.const 16) ":path")
  (data (i32.const 32) "/close")
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
    (drop (call $get (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 100) (i32.const 104)))
    (if (i32.and
          (i32.eq (i32.load (i32.const 104)) (i32.const 6))
          (i32.and
            (i32.eq (i32.load (i32.load (i32.const 100))) (i32.load (i32.const 32)))
            (i32.eq (i32.load16_u offset=4 (i32.load (i32.const 100))) (i32.load16_u (i32.const 36)))))
      (then (drop (call $close (i32.const 0)))))
    (i32.const 0))
)
