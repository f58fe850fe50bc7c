;; Floods a shared queue with empty items: proxy_on_request_headers registers queue "flood" and
;; enqueues an empty value up to 2,000,000 times (no one dequeues). Once an enqueue fails it
;; logs "enqueue refused", then tries to register a second queue "flood2" and logs "register
;; refused" if that fails too; then it lets the request go on. Empty items still cost the host
;; memory, so the harness must refuse them at its budget.
(module
  (import "env" "proxy_register_shared_queue" (func $register (param i32 i32 i32) (result i32)))
  (import "env" "proxy_enqueue_shared_queue" (func $enqueue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; The token at 8, the queue names at 16, the messages at 64 and 96.
  (data (i32.const 16) "flood2")
  (data (i32.const 64) "enqueue refused")
  (data (i32.const 96) "register refused")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (drop (call $register (i32.const 16) (i32.const 5) (i32.const 8)))
    (block $done
      (loop $more
        (br_if $done (i32.ge_u (local.get $i) (i32.const 2000000)))
        (if (i32.ne (call $enqueue (i32.load (i32.const 8)) (i32.const 0) (i32.const 0))
                    (i32.const 0))
          (then
            (drop (call $log (i32.const 2) (i32.const 64) (i32.const 15)))
            (if (i32.ne (call $register (i32.const 16) (i32.const 6) (i32.const 8)) (i32.const 0))
              (then (drop (call $log (i32.const 2) (i32.const 96) (i32.const 16)))))
            (br $done)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $more)))
    (i32.const 0))
)
