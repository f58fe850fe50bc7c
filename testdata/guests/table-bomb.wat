;; Declares a table of 100,000,000 funcrefs (800 MB of host memory) and nothing else the
;; harness needs beyond the ABI: the harness must refuse it at instantiation however it
;; allocates instances, as the pooling allocator does.
(module
  (table 100000000 funcref)
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 1024))
)
