//go:build wasip1

package proxy

import "unsafe"

// The host's imports, as proxy-wasm ABI 0.2.1 names them and as the Go SDK declares them.

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg *byte, size int32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path *byte, pathSize int32, ret unsafe.Pointer, retSize *int32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(kind uint32, start int32, max int32, ret unsafe.Pointer, retSize *int32) uint32

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(kind uint32, start int32, max int32, data *byte, size int32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(kind uint32, key *byte, keySize int32, ret unsafe.Pointer, retSize *int32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(kind uint32, key *byte, keySize int32, value *byte, valueSize int32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(kind uint32, key *byte, keySize int32, value *byte, valueSize int32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(kind uint32, ret unsafe.Pointer, retSize *int32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details *byte, detailsSize int32, body *byte, bodySize int32, headers *byte, headersSize int32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(kind uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(ms uint32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key *byte, keySize int32, ret unsafe.Pointer, retSize *int32, cas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key *byte, keySize int32, value *byte, valueSize int32, cas uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(name *byte, nameSize int32, id *uint32) uint32

//go:wasmimport env proxy_resolve_shared_queue
func proxyResolveSharedQueue(vm *byte, vmSize int32, name *byte, nameSize int32, id *uint32) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func proxyEnqueueSharedQueue(id uint32, value *byte, size int32) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func proxyDequeueSharedQueue(id uint32, ret unsafe.Pointer, retSize *int32) uint32

//go:wasmimport env proxy_http_call
func proxyHttpCall(upstream *byte, upstreamSize int32, headers *byte, headersSize int32, body *byte, bodySize int32, trailers *byte, trailersSize int32, timeout uint32, token *uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(kind uint32, name *byte, nameSize int32, id *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, offset int64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, value *uint64) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32
