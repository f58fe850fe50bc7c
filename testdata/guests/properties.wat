;; Reads properties and copies what it finds into request headers, so a test (and a
;; differential run against real Envoy) can see what the host answered: node metadata and id
;; (current and legacy paths), a request header through the request.headers map, and whether
;; the connection is mTLS.
(module
  (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (data (i32.const 256) "xds\00node\00metadata\00team")      ;; 22 bytes
  (data (i32.const 288) "x-team")                            ;; 6
  (data (i32.const 304) "xds\00node\00id")                   ;; 11
  (data (i32.const 320) "x-node-id")                         ;; 9
  (data (i32.const 336) "node\00id")                         ;; 7
  (data (i32.const 352) "x-legacy-node-id")                  ;; 16
  (data (i32.const 384) "request\00headers\00x-multi")       ;; 23
  (data (i32.const 416) "x-multi-joined")                    ;; 14
  (data (i32.const 448) "connection\00mtls")                 ;; 15
  (data (i32.const 480) "x-mtls")                            ;; 6
  (data (i32.const 496) "false")                             ;; 5
  (data (i32.const 512) "true")                              ;; 4
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  ;; Copies property (key) into request header (name) when the host has it.
  (func $copy (param $key i32) (param $key_len i32) (param $name i32) (param $name_len i32)
    (if (i32.eqz (call $prop (local.get $key) (local.get $key_len) (i32.const 100) (i32.const 104)))
      (then (drop (call $add (i32.const 0) (local.get $name) (local.get $name_len)
                             (i32.load (i32.const 100)) (i32.load (i32.const 104)))))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (call $copy (i32.const 256) (i32.const 22) (i32.const 288) (i32.const 6))
    (call $copy (i32.const 304) (i32.const 11) (i32.const 320) (i32.const 9))
    (call $copy (i32.const 336) (i32.const 7) (i32.const 352) (i32.const 16))
    (call $copy (i32.const 384) (i32.const 23) (i32.const 416) (i32.const 14))
    (if (i32.eqz (call $prop (i32.const 448) (i32.const 15) (i32.const 100) (i32.const 104)))
      (then
        (if (i32.load8_u (i32.load (i32.const 100)))
          (then (drop (call $add (i32.const 0) (i32.const 480) (i32.const 6) (i32.const 512) (i32.const 4))))
          (else (drop (call $add (i32.const 0) (i32.const 480) (i32.const 6) (i32.const 496) (i32.const 5)))))))
    (i32.const 0))
)
