;; Shared data with compare-and-swap, driven by the request path, reporting what the host
;; answered in the request header `x-result` (so a differential run compares it):
;;   /init   set k="i" with cas 0 (unconditional)          -> x-result: init | failed
;;   /read   get k and keep its cas in this VM              -> x-result: read | missing
;;   /bump   get k and set k="b" with the fresh cas         -> x-result: bumped | failed
;;   /stale  set k="s" with the cas kept by the last /read  -> x-result: cas-mismatch | accepted
;; /read, /bump, /stale on different workers is a CAS race Envoy resolves with CasMismatch.
(module
  (import "env" "proxy_get_header_map_value" (func $hget (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $hadd (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data" (func $sget (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $sset (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (global $kept (mut i32) (i32.const 0))
  (data (i32.const 16) ":path")
  (data (i32.const 24) "k")
  (data (i32.const 32) "x-result")
  (data (i32.const 48) "/init")
  (data (i32.const 56) "/read")
  (data (i32.const 64) "/bump")
  (data (i32.const 72) "/stale")
  (data (i32.const 80) "i")
  (data (i32.const 81) "b")
  (data (i32.const 82) "s")
  (data (i32.const 96) "init")
  (data (i32.const 104) "failed")
  (data (i32.const 112) "read")
  (data (i32.const 120) "missing")
  (data (i32.const 128) "bumped")
  (data (i32.const 136) "cas-mismatch")
  (data (i32.const 152) "accepted")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func $result (param $ptr i32) (param $len i32)
    (drop (call $hadd (i32.const 0) (i32.const 32) (i32.const 8) (local.get $ptr) (local.get $len))))
  ;; Is the path (at ptr/len from the host) equal to the literal at $lit of $n bytes?
  (func $is (param $lit i32) (param $n i32) (result i32)
    (local $i i32)
    (if (i32.ne (i32.load (i32.const 204)) (local.get $n)) (then (return (i32.const 0))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.ne (i32.load8_u (i32.add (i32.load (i32.const 200)) (local.get $i)))
                    (i32.load8_u (i32.add (local.get $lit) (local.get $i))))
          (then (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $hget (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 200) (i32.const 204)))
    (if (call $is (i32.const 48) (i32.const 5))
      (then
        (if (i32.eqz (call $sset (i32.const 24) (i32.const 1) (i32.const 80) (i32.const 1) (i32.const 0)))
          (then (call $result (i32.const 96) (i32.const 4)))
          (else (call $result (i32.const 104) (i32.const 6))))))
    (if (call $is (i32.const 56) (i32.const 5))
      (then
        (if (i32.eqz (call $sget (i32.const 24) (i32.const 1) (i32.const 208) (i32.const 212) (i32.const 216)))
          (then
            (global.set $kept (i32.load (i32.const 216)))
            (call $result (i32.const 112) (i32.const 4)))
          (else (call $result (i32.const 120) (i32.const 7))))))
    (if (call $is (i32.const 64) (i32.const 5))
      (then
        (drop (call $sget (i32.const 24) (i32.const 1) (i32.const 208) (i32.const 212) (i32.const 216)))
        (if (i32.eqz (call $sset (i32.const 24) (i32.const 1) (i32.const 81) (i32.const 1) (i32.load (i32.const 216))))
          (then (call $result (i32.const 128) (i32.const 6)))
          (else (call $result (i32.const 104) (i32.const 6))))))
    (if (call $is (i32.const 72) (i32.const 6))
      (then
        (if (i32.eq (call $sset (i32.const 24) (i32.const 1) (i32.const 82) (i32.const 1) (global.get $kept)) (i32.const 8))
          (then (call $result (i32.const 136) (i32.const 12)))
          (else (call $result (i32.const 152) (i32.const 8))))))
    (i32.const 0))
)
