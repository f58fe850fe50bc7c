;; Calls out with a large body on every tick: each root sets a 1 ms tick period, and each
;; proxy_on_tick calls cluster `slow` (GET /, authority slow) with a 4 MiB body. The harness
;; must not keep a copy of every such body for the rest of the run.
(module
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))
  (import "env" "proxy_http_call" (func $http_call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  ;; The body is the 4 MiB from 65536.
  (memory (export "memory") 66)
  (data (i32.const 16) "slow")
  ;; 3 pairs: :method GET, :path /, :authority slow.
  (data (i32.const 256) "\03\00\00\00\07\00\00\00\03\00\00\00\05\00\00\00\01\00\00\00\0a\00\00\00\04\00\00\00:method\00GET\00:path\00/\00:authority\00slow\00")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 4096))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $tick (i32.const 1)))
    (i32.const 1))
  (func (export "proxy_on_tick") (param i32)
    (drop (call $http_call (i32.const 16) (i32.const 4) (i32.const 256) (i32.const 64)
      (i32.const 65536) (i32.const 4194304) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 8))))
  (func (export "proxy_on_http_call_response") (param i32 i32 i32 i32 i32))
)
