//go:build wasip1

package proxy

// VMContext is the VM's root: it makes one PluginContext per plugin (root context).
type VMContext interface {
	OnVMStart(vmConfigSize int) bool
	NewPluginContext(contextID uint32) PluginContext
}

// PluginContext is one plugin's root context: its configuration, its timer, its queues
// and callouts, and the streams it makes.
type PluginContext interface {
	OnPluginStart(configSize int) bool
	OnTick()
	OnQueueReady(queueID uint32)
	OnHttpCallResponse(token uint32, headers, bodySize, trailers int)
	NewHttpContext(contextID uint32) HttpContext
	NewTcpContext(contextID uint32) TcpContext
}

// HttpContext is one HTTP stream.
type HttpContext interface {
	OnRequestHeaders(headers int, endOfStream bool) Action
	OnRequestBody(size int, endOfStream bool) Action
	OnResponseHeaders(headers int, endOfStream bool) Action
	OnResponseBody(size int, endOfStream bool) Action
	OnStreamDone()
}

// TcpContext is one TCP connection.
type TcpContext interface {
	OnNewConnection() Action
	OnDownstreamData(size int, endOfStream bool) Action
	OnUpstreamData(size int, endOfStream bool) Action
	OnDownstreamClose()
	OnStreamDone()
}

// DefaultPluginContext answers every plugin callback with the host's default.
type DefaultPluginContext struct{}

func (DefaultPluginContext) OnPluginStart(int) bool                   { return true }
func (DefaultPluginContext) OnTick()                                  {}
func (DefaultPluginContext) OnQueueReady(uint32)                      {}
func (DefaultPluginContext) OnHttpCallResponse(uint32, int, int, int) {}
func (DefaultPluginContext) NewHttpContext(uint32) HttpContext        { return nil }
func (DefaultPluginContext) NewTcpContext(uint32) TcpContext          { return nil }

// DefaultHttpContext continues every HTTP callback.
type DefaultHttpContext struct{}

func (DefaultHttpContext) OnRequestHeaders(int, bool) Action  { return Continue }
func (DefaultHttpContext) OnRequestBody(int, bool) Action     { return Continue }
func (DefaultHttpContext) OnResponseHeaders(int, bool) Action { return Continue }
func (DefaultHttpContext) OnResponseBody(int, bool) Action    { return Continue }
func (DefaultHttpContext) OnStreamDone()                      {}

// DefaultTcpContext continues every TCP callback.
type DefaultTcpContext struct{}

func (DefaultTcpContext) OnNewConnection() Action           { return Continue }
func (DefaultTcpContext) OnDownstreamData(int, bool) Action { return Continue }
func (DefaultTcpContext) OnUpstreamData(int, bool) Action   { return Continue }
func (DefaultTcpContext) OnDownstreamClose()                {}
func (DefaultTcpContext) OnStreamDone()                     {}

var (
	vm      VMContext
	plugins = map[uint32]PluginContext{}
	https   = map[uint32]HttpContext{}
	tcps    = map[uint32]TcpContext{}
)

// SetVMContext is called from a guest's init().
func SetVMContext(v VMContext) { vm = v }

//go:wasmexport proxy_abi_version_0_2_1
func proxyAbiVersion021() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) *byte {
	if size == 0 {
		size = 1
	}
	buf := make([]byte, size)
	return &buf[0]
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {
	if parent == 0 {
		plugins[id] = vm.NewPluginContext(id)
		return
	}
	p := plugins[parent]
	if p == nil {
		return
	}
	if h := p.NewHttpContext(id); h != nil {
		https[id] = h
	} else if t := p.NewTcpContext(id); t != nil {
		tcps[id] = t
	}
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

//go:wasmexport proxy_on_vm_start
func proxyOnVmStart(id uint32, size uint32) uint32 { return b2u(vm.OnVMStart(int(size))) }

//go:wasmexport proxy_on_configure
func proxyOnConfigure(id uint32, size uint32) uint32 {
	return b2u(plugins[id].OnPluginStart(int(size)))
}

//go:wasmexport proxy_on_tick
func proxyOnTick(id uint32) { plugins[id].OnTick() }

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(id, queue uint32) { plugins[id].OnQueueReady(queue) }

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(id, token, headers, body, trailers uint32) {
	plugins[id].OnHttpCallResponse(token, int(headers), int(body), int(trailers))
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, headers, eos uint32) uint32 {
	return uint32(https[id].OnRequestHeaders(int(headers), eos != 0))
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(id, size, eos uint32) uint32 {
	return uint32(https[id].OnRequestBody(int(size), eos != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, headers, eos uint32) uint32 {
	return uint32(https[id].OnResponseHeaders(int(headers), eos != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(id, size, eos uint32) uint32 {
	return uint32(https[id].OnResponseBody(int(size), eos != 0))
}

//go:wasmexport proxy_on_new_connection
func proxyOnNewConnection(id uint32) uint32 { return uint32(tcps[id].OnNewConnection()) }

//go:wasmexport proxy_on_downstream_data
func proxyOnDownstreamData(id, size, eos uint32) uint32 {
	return uint32(tcps[id].OnDownstreamData(int(size), eos != 0))
}

//go:wasmexport proxy_on_upstream_data
func proxyOnUpstreamData(id, size, eos uint32) uint32 {
	return uint32(tcps[id].OnUpstreamData(int(size), eos != 0))
}

//go:wasmexport proxy_on_downstream_connection_close
func proxyOnDownstreamConnectionClose(id, peer uint32) {
	if t := tcps[id]; t != nil {
		t.OnDownstreamClose()
	}
}

//go:wasmexport proxy_on_upstream_connection_close
func proxyOnUpstreamConnectionClose(id, peer uint32) {}

//go:wasmexport proxy_on_done
func proxyOnDone(id uint32) uint32 {
	if h := https[id]; h != nil {
		h.OnStreamDone()
	} else if t := tcps[id]; t != nil {
		t.OnStreamDone()
	}
	return 1
}

//go:wasmexport proxy_on_log
func proxyOnLog(id uint32) {}

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {
	delete(https, id)
	delete(tcps, id)
}
