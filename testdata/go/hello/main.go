// hello: what a Go filter author writes first. It logs at VM start (through proxy_log and
// through fmt, which is WASI's fd_write), reads its plugin configuration, and adds one
// header to each request and to each response. A request for /panic panics.
package main

import (
	"fmt"

	"proxywasm.test/guests/proxy"
)

func main() {}

func init() { proxy.SetVMContext(vmContext{}) }

type vmContext struct{}

func (vmContext) OnVMStart(int) bool {
	proxy.Log(proxy.Info, "go hello: vm started")
	fmt.Println("go hello: stdout at vm start")
	fmt.Print("\n")
	return true
}

func (vmContext) NewPluginContext(uint32) proxy.PluginContext { return &pluginContext{} }

type pluginContext struct {
	proxy.DefaultPluginContext
	greeting string
}

func (p *pluginContext) OnPluginStart(size int) bool {
	config, _ := proxy.Buffer(proxy.PluginConfig, 0, size)
	p.greeting = string(config)
	if p.greeting == "" {
		p.greeting = "hello"
	}
	proxy.Log(proxy.Info, "go hello: configured with "+p.greeting)
	return true
}

func (p *pluginContext) NewHttpContext(uint32) proxy.HttpContext {
	return &httpContext{greeting: p.greeting}
}

type httpContext struct {
	proxy.DefaultHttpContext
	greeting string
}

func (h *httpContext) OnRequestHeaders(int, bool) proxy.Action {
	path, _ := proxy.Header(proxy.RequestHeaders, ":path")
	if path == "/panic" {
		panic("go hello: asked to panic")
	}
	proxy.AddHeader(proxy.RequestHeaders, "x-go-greeting", h.greeting)
	proxy.Log(proxy.Info, "go hello: request "+path)
	return proxy.Continue
}

func (h *httpContext) OnResponseHeaders(int, bool) proxy.Action {
	took, _ := proxy.Header(proxy.ResponseHeaders, "x-envoy-upstream-service-time")
	proxy.Log(proxy.Info, "go hello: x-envoy-upstream-service-time: "+took)
	proxy.AddHeader(proxy.ResponseHeaders, "x-go-filter", "hello")
	return proxy.Continue
}
