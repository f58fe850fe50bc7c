;; A command module whose _start never returns: the harness must interrupt it and say that it
;; was _start, and which deadline it ran past.
(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
  (func (export "_start")
    (loop $forever (br $forever)))
)
