;; An HTTP or network (TCP) filter that reads the properties its plugin configuration lists,
;; one path a line with "/" between the parts (e.g. "xds/route_metadata/filter_metadata/demo/tier"),
;; when the request headers arrive or the connection opens, and logs what the host answered:
;;   "PATH status=S hex=HEX" (the value's bytes in hex, at most 1024 of them; "-" for none).
;; It shows what a host answers for metadata, route and cluster properties without the guest
;; having to know their encodings.
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (global $heap (mut i32) (i32.const 65536))
  (global $cur (mut i32) (i32.const 0))
  (global $cfg_len (mut i32) (i32.const 0))
  (data (i32.const 16) " status=")
  (data (i32.const 32) " hex=")
  (data (i32.const 48) "0123456789abcdef")
  ;; 1000/1004: a buffer or property (ptr, size); 2048: the log line; 8192: the path being
  ;; read; 16384: the plugin configuration.
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func $put (param $p i32) (param $n i32)
    (memory.copy (global.get $cur) (local.get $p) (local.get $n))
    (global.set $cur (i32.add (global.get $cur) (local.get $n))))
  (func $byte (param $b i32)
    (i32.store8 (global.get $cur) (local.get $b))
    (global.set $cur (i32.add (global.get $cur) (i32.const 1))))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (global.set $cfg_len (i32.const 0))
    (if (i32.gt_u (local.get $size) (i32.const 4096)) (then (return (i32.const 0))))
    (if (local.get $size)
      (then
        (if (i32.eqz (call $get (i32.const 7) (i32.const 0) (local.get $size) (i32.const 1000) (i32.const 1004)))
          (then
            (global.set $cfg_len (i32.load (i32.const 1004)))
            (memory.copy (i32.const 16384) (i32.load (i32.const 1000)) (global.get $cfg_len))))))
    (i32.const 1))
  ;; Reads the property whose "/"-separated path is the $n bytes at $p, and logs it.
  (func $probe (param $p i32) (param $n i32)
    (local $i i32) (local $b i32) (local $st i32) (local $v i32) (local $vn i32)
    (loop $copy
      (if (i32.lt_u (local.get $i) (local.get $n))
        (then
          (local.set $b (i32.load8_u (i32.add (local.get $p) (local.get $i))))
          (if (i32.eq (local.get $b) (i32.const 47)) (then (local.set $b (i32.const 0))))
          (i32.store8 (i32.add (i32.const 8192) (local.get $i)) (local.get $b))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $copy))))
    (i32.store (i32.const 1000) (i32.const 0))
    (i32.store (i32.const 1004) (i32.const 0))
    (local.set $st (call $prop (i32.const 8192) (local.get $n) (i32.const 1000) (i32.const 1004)))
    (global.set $cur (i32.const 2048))
    (call $put (local.get $p) (local.get $n))
    (call $put (i32.const 16) (i32.const 8))
    (call $byte (i32.add (i32.const 48) (local.get $st)))
    (call $put (i32.const 32) (i32.const 5))
    (local.set $v (i32.load (i32.const 1000)))
    (local.set $vn (i32.load (i32.const 1004)))
    (if (i32.gt_u (local.get $vn) (i32.const 1024)) (then (local.set $vn (i32.const 1024))))
    (if (i32.or (local.get $st) (i32.eqz (local.get $vn)))
      (then (call $byte (i32.const 45)))
      (else
        (local.set $i (i32.const 0))
        (loop $hex
          (local.set $b (i32.load8_u (i32.add (local.get $v) (local.get $i))))
          (call $byte (i32.load8_u (i32.add (i32.const 48) (i32.shr_u (local.get $b) (i32.const 4)))))
          (call $byte (i32.load8_u (i32.add (i32.const 48) (i32.and (local.get $b) (i32.const 15)))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $hex (i32.lt_u (local.get $i) (local.get $vn))))))
    (drop (call $log (i32.const 2) (i32.const 2048) (i32.sub (global.get $cur) (i32.const 2048)))))
  (func (export "proxy_on_request_headers") (param $ctx i32) (param $n i32) (param $eos i32) (result i32)
    (call $probe_all)
    (i32.const 0))
  (func (export "proxy_on_new_connection") (param $ctx i32) (result i32)
    (call $probe_all)
    (i32.const 0))
  ;; Probes every path of the plugin configuration.
  (func $probe_all
    (local $p i32) (local $end i32) (local $q i32)
    (global.set $heap (i32.const 65536))
    (local.set $p (i32.const 16384))
    (local.set $end (i32.add (i32.const 16384) (global.get $cfg_len)))
    (loop $lines
      (if (i32.lt_u (local.get $p) (local.get $end))
        (then
          (local.set $q (local.get $p))
          (block $eol
            (loop $scan
              (br_if $eol (i32.ge_u (local.get $q) (local.get $end)))
              (br_if $eol (i32.eq (i32.load8_u (local.get $q)) (i32.const 10)))
              (local.set $q (i32.add (local.get $q) (i32.const 1)))
              (br $scan)))
          (if (i32.gt_u (local.get $q) (local.get $p))
            (then (call $probe (local.get $p) (i32.sub (local.get $q) (local.get $p)))))
          (local.set $p (i32.add (local.get $q) (i32.const 1)))
          (br $lines)))))
)
