;; Copies the connection's addresses into request headers: source.address -> x-source,
;; destination.address -> x-destination; and whether source.port / connection.id answer Ok
;; (8-byte integers) -> x-ints: ok.
(module
  (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 8192))
  (data (i32.const 256) "source\00address")          ;; 14
  (data (i32.const 272) "x-source")                  ;; 8
  (data (i32.const 288) "destination\00address")     ;; 19
  (data (i32.const 320) "x-destination")             ;; 13
  (data (i32.const 336) "source\00port")             ;; 11
  (data (i32.const 352) "connection\00id")           ;; 13
  (data (i32.const 368) "x-ints")                    ;; 6
  (data (i32.const 376) "ok")                        ;; 2
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  ;; Adds header $h ($hl bytes) with property $p ($pl bytes) if it is there.
  (func $copy (param $p i32) (param $pl i32) (param $h i32) (param $hl i32)
    (if (i32.eqz (call $prop (local.get $p) (local.get $pl) (i32.const 100) (i32.const 104)))
      (then (drop (call $add (i32.const 0) (local.get $h) (local.get $hl)
        (i32.load (i32.const 100)) (i32.load (i32.const 104)))))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (call $copy (i32.const 256) (i32.const 14) (i32.const 272) (i32.const 8))
    (call $copy (i32.const 288) (i32.const 19) (i32.const 320) (i32.const 13))
    (if (i32.and
          (i32.and
            (i32.eqz (call $prop (i32.const 336) (i32.const 11) (i32.const 100) (i32.const 104)))
            (i32.eq (i32.load (i32.const 104)) (i32.const 8)))
          (i32.and
            (i32.eqz (call $prop (i32.const 352) (i32.const 13) (i32.const 100) (i32.const 104)))
            (i32.eq (i32.load (i32.const 104)) (i32.const 8))))
      (then (drop (call $add (i32.const 0) (i32.const 368) (i32.const 6) (i32.const 376) (i32.const 2)))))
    (i32.const 0))
)
