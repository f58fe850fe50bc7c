;; `noop.wat` plus the header role's hostcalls and nothing else: in proxy_on_request_headers
;; the bench's three request edits and one counter increment, in proxy_on_response_headers the
;; response edit. Beside `noop.wat` and the module in `make bench`, it tells what the
;; hostcalls cost and what the Rust SDK and the module's own code add.
(module
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $incr (param i32 i64) (result i32)))
  (import "env" "proxy_remove_header_map_value" (func $remove (param i32 i32 i32) (result i32)))
  (import "env" "proxy_replace_header_map_value" (func $replace (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  ;; 0: the counter's id. 64..: the strings (offset, length).
  (data (i32.const 64) "x-internal-secret")  ;; 64, 17
  (data (i32.const 96) "x-env")              ;; 96, 5
  (data (i32.const 112) "bench")             ;; 112, 5
  (data (i32.const 128) "x-added-by")        ;; 128, 10
  (data (i32.const 144) "wasm-filter")       ;; 144, 11
  (data (i32.const 160) "x-served-by")       ;; 160, 11
  (data (i32.const 192) "wasm_filter.bench.edited_total") ;; 192, 30
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $define (i32.const 0) (i32.const 192) (i32.const 30) (i32.const 0)))
    (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $remove (i32.const 0) (i32.const 64) (i32.const 17)))
    (drop (call $replace (i32.const 0) (i32.const 96) (i32.const 5) (i32.const 112) (i32.const 5)))
    (drop (call $add (i32.const 0) (i32.const 128) (i32.const 10) (i32.const 144) (i32.const 11)))
    (drop (call $incr (i32.load (i32.const 0)) (i64.const 1)))
    (i32.const 0))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add (i32.const 2) (i32.const 160) (i32.const 11) (i32.const 144) (i32.const 11)))
    (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_delete") (param i32))
)
