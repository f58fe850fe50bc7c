//go:build wasip1

// Package proxy is the tests' own small proxy-wasm layer for Go guests: the ABI spoken
// through //go:wasmimport and //go:wasmexport as the Go SDK speaks it, with the SDK's words
// (VMContext, PluginContext, HttpContext, TcpContext), and no third-party code.
package proxy

import (
	"encoding/binary"
	"unsafe"
)

// Status is the host's answer to a hostcall.
type Status uint32

const (
	OK             Status = 0
	NotFound       Status = 1
	BadArgument    Status = 2
	CasMismatch    Status = 8
	Empty          Status = 7
	InternalFailed Status = 10
)

// Action is what a stream callback returns.
type Action uint32

const (
	Continue Action = 0
	Pause    Action = 1
)

// Log levels.
const (
	Trace = 0
	Debug = 1
	Info  = 2
	Warn  = 3
	Error = 4
)

// Map and buffer kinds.
const (
	RequestHeaders  = 0
	ResponseHeaders = 2
	HttpCallHeaders = 6
	RequestBody     = 0
	ResponseBody    = 1
	DownstreamData  = 2
	UpstreamData    = 3
	HttpCallBody    = 4
	VMConfiguration = 6
	PluginConfig    = 7
	StreamRequest   = 0
	StreamResponse  = 1
	MetricCounter   = 0
	MetricGauge     = 1
)

func ptr(s string) *byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.StringData(s)
}

func bptr(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

// owned copies what the host allocated in our memory (through proxy_on_memory_allocate).
func owned(p *byte, n int32) []byte {
	if p == nil || n <= 0 {
		return nil
	}
	return append([]byte(nil), unsafe.Slice(p, n)...)
}

// Log writes msg to the proxy's log at level.
func Log(level uint32, msg string) {
	proxyLog(level, ptr(msg), int32(len(msg)))
}

// Property reads a property by its path segments.
func Property(path ...string) ([]byte, Status) {
	var joined []byte
	for i, p := range path {
		if i > 0 {
			joined = append(joined, 0)
		}
		joined = append(joined, p...)
	}
	var data *byte
	var size int32
	st := Status(proxyGetProperty(bptr(joined), int32(len(joined)), unsafe.Pointer(&data), &size))
	return owned(data, size), st
}

// Buffer reads up to max bytes of a buffer from start.
func Buffer(kind uint32, start, max int) ([]byte, Status) {
	var data *byte
	var size int32
	st := Status(proxyGetBufferBytes(kind, int32(start), int32(max), unsafe.Pointer(&data), &size))
	return owned(data, size), st
}

// SetBuffer replaces size bytes of a buffer from start with data.
func SetBuffer(kind uint32, start, size int, data []byte) Status {
	return Status(proxySetBufferBytes(kind, int32(start), int32(size), bptr(data), int32(len(data))))
}

// Header reads one header of a map.
func Header(kind uint32, key string) (string, Status) {
	var data *byte
	var size int32
	st := Status(proxyGetHeaderMapValue(kind, ptr(key), int32(len(key)), unsafe.Pointer(&data), &size))
	return string(owned(data, size)), st
}

// AddHeader adds a header to a map.
func AddHeader(kind uint32, key, value string) Status {
	return Status(proxyAddHeaderMapValue(kind, ptr(key), int32(len(key)), ptr(value), int32(len(value))))
}

// ReplaceHeader sets a header of a map.
func ReplaceHeader(kind uint32, key, value string) Status {
	return Status(proxyReplaceHeaderMapValue(kind, ptr(key), int32(len(key)), ptr(value), int32(len(value))))
}

// Headers reads a whole map, in order.
func Headers(kind uint32) [][2]string {
	var data *byte
	var size int32
	if Status(proxyGetHeaderMapPairs(kind, unsafe.Pointer(&data), &size)) != OK {
		return nil
	}
	return decodePairs(owned(data, size))
}

func decodePairs(b []byte) [][2]string {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > len(b)/8 {
		return nil
	}
	sizes := b[4:]
	at := 4 + 8*n
	out := make([][2]string, 0, n)
	for i := 0; i < n; i++ {
		k := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		v := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if at+k+1+v+1 > len(b) {
			return out
		}
		key := string(b[at : at+k])
		at += k + 1
		out = append(out, [2]string{key, string(b[at : at+v])})
		at += v + 1
	}
	return out
}

func encodePairs(pairs [][2]string) []byte {
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(pairs)))
	for _, p := range pairs {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(p[0])))
		out = binary.LittleEndian.AppendUint32(out, uint32(len(p[1])))
	}
	for _, p := range pairs {
		out = append(out, p[0]...)
		out = append(out, 0)
		out = append(out, p[1]...)
		out = append(out, 0)
	}
	return out
}

// SendLocalResponse answers the stream from the filter.
func SendLocalResponse(status uint32, body string, headers [][2]string) Status {
	h := encodePairs(headers)
	return Status(proxySendLocalResponse(status, nil, 0, ptr(body), int32(len(body)), bptr(h), int32(len(h)), -1))
}

// ResumeRequest continues a paused request.
func ResumeRequest() Status { return Status(proxyContinueStream(StreamRequest)) }

// SetTickPeriod arms the calling root context's timer.
func SetTickPeriod(ms uint32) Status { return Status(proxySetTickPeriodMilliseconds(ms)) }

// SharedData reads a key of the VM's shared data with its CAS.
func SharedData(key string) ([]byte, uint32, Status) {
	var data *byte
	var size int32
	var cas uint32
	st := Status(proxyGetSharedData(ptr(key), int32(len(key)), unsafe.Pointer(&data), &size, &cas))
	return owned(data, size), cas, st
}

// SetSharedData writes a key if its CAS is still cas (0: unconditionally).
func SetSharedData(key string, value []byte, cas uint32) Status {
	return Status(proxySetSharedData(ptr(key), int32(len(key)), bptr(value), int32(len(value)), cas))
}

// RegisterQueue registers a shared queue for this root context.
func RegisterQueue(name string) (uint32, Status) {
	var id uint32
	st := Status(proxyRegisterSharedQueue(ptr(name), int32(len(name)), &id))
	return id, st
}

// ResolveQueue finds a queue another VM registered.
func ResolveQueue(vm, name string) (uint32, Status) {
	var id uint32
	st := Status(proxyResolveSharedQueue(ptr(vm), int32(len(vm)), ptr(name), int32(len(name)), &id))
	return id, st
}

// Enqueue adds an item to a queue.
func Enqueue(id uint32, item []byte) Status {
	return Status(proxyEnqueueSharedQueue(id, bptr(item), int32(len(item))))
}

// Dequeue takes an item from a queue.
func Dequeue(id uint32) ([]byte, Status) {
	var data *byte
	var size int32
	st := Status(proxyDequeueSharedQueue(id, unsafe.Pointer(&data), &size))
	return owned(data, size), st
}

// HttpCall sends a callout to cluster; the answer comes to OnHttpCallResponse.
func HttpCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, Status) {
	h := encodePairs(headers)
	var token uint32
	st := Status(proxyHttpCall(ptr(cluster), int32(len(cluster)), bptr(h), int32(len(h)), bptr(body), int32(len(body)), nil, 0, timeoutMs, &token))
	return token, st
}

// DefineMetric defines (or finds) a metric.
func DefineMetric(kind uint32, name string) (uint32, Status) {
	var id uint32
	st := Status(proxyDefineMetric(kind, ptr(name), int32(len(name)), &id))
	return id, st
}

// IncrementMetric adds offset to a metric.
func IncrementMetric(id uint32, offset int64) Status {
	return Status(proxyIncrementMetric(id, offset))
}

// Metric reads a metric.
func Metric(id uint32) (uint64, Status) {
	var v uint64
	st := Status(proxyGetMetric(id, &v))
	return v, st
}

// SetEffectiveContext makes later hostcalls act for context id.
func SetEffectiveContext(id uint32) Status { return Status(proxySetEffectiveContext(id)) }
