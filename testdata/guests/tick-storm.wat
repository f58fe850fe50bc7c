;; Ticks every millisecond (proxy_on_configure sets the period): advancing the clock by an
;; hour would make millions of proxy_on_tick calls; the harness must stop at its cap and say so.
(module
  (import "env" "proxy_set_tick_period_milliseconds" (func $set_tick (param i32) (result i32)))
  (memory (export "memory") 1)
  (global $ticks (mut i64) (i64.const 0))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $set_tick (i32.const 1)))
    (i32.const 1))
  (func (export "proxy_on_tick") (param i32)
    (global.set $ticks (i64.add (global.get $ticks) (i64.const 1))))
)
