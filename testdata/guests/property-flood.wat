;; Hoards stream properties: proxy_on_request_headers sets 1 MiB under a new path, 1024 times
;; (1 GiB), until a set fails; then it logs "props refused" and lets the request go on.
;; The harness must refuse before the stream holds more than its limit.
(module
  (import "env" "proxy_set_property" (func $set (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  ;; The key (2 bytes) at 16, the message at 32, the MiB value at 65536.
  (memory (export "memory") 17)
  (data (i32.const 32) "props refused")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (block $done
      (loop $more
        (br_if $done (i32.ge_u (local.get $i) (i32.const 1024)))
        ;; The key: two letters, from the low and high five bits of $i.
        (i32.store8 (i32.const 16) (i32.add (i32.const 65) (i32.and (local.get $i) (i32.const 31))))
        (i32.store8 (i32.const 17) (i32.add (i32.const 65) (i32.shr_u (local.get $i) (i32.const 5))))
        (if (i32.ne (call $set (i32.const 16) (i32.const 2) (i32.const 65536) (i32.const 1048576))
                    (i32.const 0))
          (then
            (drop (call $log (i32.const 2) (i32.const 32) (i32.const 13)))
            (br $done)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $more)))
    (i32.const 0))
)
