;; Makes as many HTTP callouts to cluster `slow` (GET /, authority slow, no timeout) in
;; proxy_on_request_headers as its plugin configuration has bytes, then lets the request go
;; on. Each completion logs "call answered".
(module
  (import "env" "proxy_http_call" (func $http_call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $calls (mut i32) (i32.const 0))
  (data (i32.const 16) "slow")
  (data (i32.const 32) "call answered")
  ;; The headers, serialized: 3 pairs, sizes, then the strings with their NULs.
  (data (i32.const 256) "\03\00\00\00\07\00\00\00\03\00\00\00\05\00\00\00\01\00\00\00\0a\00\00\00\04\00\00\00:method\00GET\00:path\00/\00:authority\00slow\00")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 4096))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (global.set $calls (local.get $size))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (block $done
      (loop $more
        (br_if $done (i32.ge_u (local.get $i) (global.get $calls)))
        (drop (call $http_call
          (i32.const 16) (i32.const 4)
          (i32.const 256) (i32.const 64)
          (i32.const 0) (i32.const 0)
          (i32.const 0) (i32.const 0)
          (i32.const 0)
          (i32.const 8)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $more)))
    (i32.const 0))
  (func (export "proxy_on_http_call_response") (param i32 i32 i32 i32 i32)
    (drop (call $log (i32.const 2) (i32.const 32) (i32.const 13))))
)
