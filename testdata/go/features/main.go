// features: one Go module with the roles a Go SDK user writes, chosen by the plugin
// configuration:
//
//	http     counts requests in shared data (CAS, across workers), in a metric, and on a
//	         shared queue; /callout pauses the request for a callout to cluster "auth"
//	         (/copy too, with the request's own headers);
//	         /upper buffers the request body and upper-cases it; /hold pauses the request
//	         and arms a one-second tick that resumes it; response bodies are counted.
//	ticker   ticks every second, logging the tick and making a callout to "auth".
//	service  (a Wasm service) registers queue "paths" and logs every item.
//	tcp      counts a connection's bytes and logs them with upstream.address on close.
package main

import (
	"bytes"
	"strconv"
	"strings"

	"proxywasm.test/guests/proxy"
)

func main() {}

func init() { proxy.SetVMContext(vmContext{}) }

type vmContext struct{}

func (vmContext) OnVMStart(int) bool { return true }

func (vmContext) NewPluginContext(id uint32) proxy.PluginContext {
	return &pluginContext{id: id}
}

type pluginContext struct {
	proxy.DefaultPluginContext
	id      uint32
	role    string
	ticks   int
	metric  uint32
	queue   uint32
	held    []uint32
	waiting map[uint32]uint32
}

func (p *pluginContext) OnPluginStart(size int) bool {
	config, _ := proxy.Buffer(proxy.PluginConfig, 0, size)
	p.role = string(config)
	p.waiting = map[uint32]uint32{}
	switch p.role {
	case "http":
		p.metric, _ = proxy.DefineMetric(proxy.MetricCounter, "go_requests")
	case "ticker":
		proxy.SetTickPeriod(1000)
	case "service":
		id, st := proxy.RegisterQueue("paths")
		p.queue = id
		proxy.Log(proxy.Info, "go service: queue registered: "+strconv.Itoa(int(st)))
	case "tcp":
	default:
		proxy.Log(proxy.Error, "go features: unknown role "+strconv.Quote(p.role))
		return false
	}
	return true
}

func (p *pluginContext) OnTick() {
	p.ticks++
	switch p.role {
	case "ticker":
		proxy.Log(proxy.Info, "go ticker: tick "+strconv.Itoa(p.ticks))
		_, st := proxy.HttpCall("auth", [][2]string{{":method", "GET"}, {":path", "/tick"}, {":authority", "auth"}}, nil, 5000)
		if st != proxy.OK {
			proxy.Log(proxy.Warn, "go ticker: callout refused: "+strconv.Itoa(int(st)))
		}
	case "http":
		// Requests paused for a tick go on now.
		for _, id := range p.held {
			proxy.SetEffectiveContext(id)
			proxy.AddHeader(proxy.RequestHeaders, "x-go-held", "released")
			proxy.ResumeRequest()
		}
		p.held = nil
		proxy.SetTickPeriod(0)
	}
}

func (p *pluginContext) OnQueueReady(queue uint32) {
	for {
		item, st := proxy.Dequeue(queue)
		if st != proxy.OK {
			return
		}
		proxy.Log(proxy.Info, "go service: got "+string(item))
	}
}

func (p *pluginContext) OnHttpCallResponse(token uint32, headers, bodySize, trailers int) {
	status, _ := proxy.Header(proxy.HttpCallHeaders, ":status")
	body, _ := proxy.Buffer(proxy.HttpCallBody, 0, bodySize)
	stream, ok := p.waiting[token]
	if !ok {
		proxy.Log(proxy.Info, "go ticker: callout answered "+status+" with "+strconv.Itoa(len(body))+" bytes")
		return
	}
	delete(p.waiting, token)
	proxy.SetEffectiveContext(stream)
	length, st := proxy.Header(proxy.HttpCallHeaders, "content-length")
	proxy.Log(proxy.Info, "go http: callout answered "+status+": "+string(body)+" (content-length "+length+", status "+strconv.Itoa(int(st))+")")
	if status == "204" {
		proxy.ResumeRequest()
		return
	}
	if status == "400" {
		proxy.SendLocalResponse(400, "bad credentials\n", nil)
		return
	}
	if status != "200" {
		proxy.SendLocalResponse(403, "denied by auth\n", [][2]string{{"x-go-auth", status}})
		return
	}
	proxy.AddHeader(proxy.RequestHeaders, "x-go-auth", string(body))
	proxy.ResumeRequest()
}

func (p *pluginContext) NewHttpContext(id uint32) proxy.HttpContext {
	if p.role != "http" {
		return nil
	}
	return &httpContext{id: id, plugin: p}
}

func (p *pluginContext) NewTcpContext(id uint32) proxy.TcpContext {
	if p.role != "tcp" {
		return nil
	}
	return &tcpContext{}
}

type httpContext struct {
	proxy.DefaultHttpContext
	id       uint32
	plugin   *pluginContext
	path     string
	response int
}

// countRequest adds one to the shared counter, retrying when another worker wrote first.
func countRequest() int {
	for try := 0; try < 10; try++ {
		value, cas, st := proxy.SharedData("requests")
		n := 0
		if st == proxy.OK {
			n, _ = strconv.Atoi(string(value))
		}
		if proxy.SetSharedData("requests", []byte(strconv.Itoa(n+1)), cas) == proxy.OK {
			return n + 1
		}
	}
	return -1
}

func (h *httpContext) OnRequestHeaders(int, bool) proxy.Action {
	h.path, _ = proxy.Header(proxy.RequestHeaders, ":path")
	n := countRequest()
	proxy.IncrementMetric(h.plugin.metric, 1)
	if q, st := proxy.ResolveQueue("go-service", "paths"); st == proxy.OK {
		proxy.Enqueue(q, []byte(h.path))
	}
	proxy.ReplaceHeader(proxy.RequestHeaders, "x-go-count", strconv.Itoa(n))
	id, _ := proxy.Property("plugin_root_id")
	route, _ := proxy.Property("route_name")
	proxy.Log(proxy.Info, "go http: request "+h.path+" number "+strconv.Itoa(n)+" root "+string(id)+" route "+string(route))
	switch h.path {
	case "/callout":
		return h.callAuth([][2]string{{":method", "GET"}, {":path", "/check"}, {":authority", "auth"}})
	case "/copy":
		// The request's own headers (x-forwarded-proto among them) go to the auth service.
		headers := proxy.Headers(proxy.RequestHeaders)
		for i := range headers {
			switch headers[i][0] {
			case ":path":
				headers[i][1] = "/check"
			case ":authority":
				headers[i][1] = "auth"
			}
		}
		return h.callAuth(headers)
	case "/hold":
		h.plugin.held = append(h.plugin.held, h.id)
		proxy.SetTickPeriod(1000)
		return proxy.Pause
	}
	return proxy.Continue
}

// callAuth pauses the request on a callout to cluster "auth"; its answer resumes it.
func (h *httpContext) callAuth(headers [][2]string) proxy.Action {
	token, st := proxy.HttpCall("auth", headers, nil, 5000)
	if st != proxy.OK {
		proxy.SendLocalResponse(503, "auth unavailable\n", nil)
		return proxy.Pause
	}
	h.plugin.waiting[token] = h.id
	return proxy.Pause
}

func (h *httpContext) OnRequestBody(size int, end bool) proxy.Action {
	if h.path == "/callout" {
		proxy.Log(proxy.Info, "go http: request body of "+strconv.Itoa(size)+" bytes, end "+strconv.FormatBool(end))
	}
	if h.path != "/upper" {
		return proxy.Continue
	}
	if !end {
		return proxy.Pause
	}
	body, _ := proxy.Buffer(proxy.RequestBody, 0, size)
	proxy.SetBuffer(proxy.RequestBody, 0, size, bytes.ToUpper(body))
	proxy.Log(proxy.Info, "go http: upper-cased "+strconv.Itoa(size)+" bytes")
	return proxy.Continue
}

func (h *httpContext) OnResponseHeaders(int, bool) proxy.Action {
	// The host only: the port is the upstream's, which a test's upstream picks.
	upstream, st := proxy.Property("upstream", "address")
	host, _, _ := strings.Cut(string(upstream), ":")
	proxy.Log(proxy.Info, "go http: upstream host "+host+" status "+strconv.Itoa(int(st)))
	requests, _, _ := proxy.SharedData("requests")
	total, _ := proxy.Metric(h.plugin.metric)
	proxy.AddHeader(proxy.ResponseHeaders, "x-go-requests", string(requests))
	proxy.AddHeader(proxy.ResponseHeaders, "x-go-metric", strconv.FormatUint(total, 10))
	return proxy.Continue
}

func (h *httpContext) OnResponseBody(size int, end bool) proxy.Action {
	h.response += size
	if end {
		proxy.Log(proxy.Info, "go http: response body of "+strconv.Itoa(h.response)+" bytes")
	}
	return proxy.Continue
}

type tcpContext struct {
	proxy.DefaultTcpContext
	down, up int
}

func (t *tcpContext) OnDownstreamData(size int, end bool) proxy.Action {
	t.down += size
	return proxy.Continue
}

func (t *tcpContext) OnUpstreamData(size int, end bool) proxy.Action {
	t.up += size
	if t.up == size && size > 0 {
		// The host only: the port is the upstream's, which a test's upstream picks.
		upstream, st := proxy.Property("upstream", "address")
		host, _, _ := strings.Cut(string(upstream), ":")
		proxy.Log(proxy.Info, "go tcp: upstream host "+host+" status "+strconv.Itoa(int(st)))
	}
	return proxy.Continue
}

func (t *tcpContext) OnStreamDone() {
	proxy.Log(proxy.Info, "go tcp: "+strconv.Itoa(t.down)+" bytes in, "+strconv.Itoa(t.up)+" bytes out")
}
