package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// TraceBytesHeader tells a caller how many leading bytes of a response body are the
// trace (the body minus padding and the closing brace), so that it can embed the
// callee's trace without parsing the padding.
const TraceBytesHeader = "X-Meshmark-Trace-Bytes"

// HealthPath answers 200 without running the script.
const HealthPath = "/healthz"

// ServedPath answers how many requests this pod has served since it started (health
// checks and these reads excepted), as a decimal number. The study runner reads it in
// every pod before and after a trial to check that each service's versions got their
// intended shares of the traffic: one atomic add per request, nothing on the load
// generator's path.
const ServedPath = "/meshmark/served"

// propagatedHeaders are copied from each inbound request to every call it causes, as
// Istio's bookinfo does, so that tracing and request-id based routing work through the
// graph.
var propagatedHeaders = []string{
	"X-Request-Id",
	"X-B3-Traceid", "X-B3-Spanid", "X-B3-Parentspanid", "X-B3-Sampled", "X-B3-Flags", "B3",
	"X-Ot-Span-Context", "Traceparent", "Tracestate", "X-Cloud-Trace-Context", "Grpc-Trace-Bin",
	"X-Datadog-Trace-Id", "X-Datadog-Parent-Id", "X-Datadog-Sampling-Priority", "Sw8",
	"End-User", "User-Agent", "Cookie", "Authorization",
}

// ServerOptions choose which service of a graph a Server plays.
type ServerOptions struct {
	Service string
	Version string // empty means the service's only version
	Pod     string // reported in traces; empty means $POD_NAME, then the host name
	// Resolve overrides name resolution for calls: service name → "ip" or "ip:port".
	Resolve map[string]string
	// Callees replaces, per called service, the "name:port" of its URLs with another
	// authority (host:port): meshes whose clients address services by mesh names
	// (Traefik Mesh: <svc>.<ns>.traefik.mesh on a port of the node's proxy) set it.
	Callees map[string]string
	// Spread makes this service's calls to a callee pick one of the callee's endpoints
	// for each request, by weight, instead of calling the service's address (whose
	// balancing, kube-proxy style, is per connection). It is client-side balancing,
	// what a gRPC client's round-robin policy or a mesh's proxy does per request, for a
	// baseline whose request mix must match the meshes'. The Host header (gRPC
	// authority) stays the service's name and port. An endpoint named by a host name
	// (a cluster's headless Service of one version) stands for every address the name
	// resolves to, its weight shared among them, and is resolved again at most every
	// second while requests use it.
	Spread map[string][]Endpoint
	// LookupHost resolves the host names of Spread endpoints; nil means the system's
	// resolver.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// CallTimeout bounds each request's whole script; 0 means 30s.
	CallTimeout time.Duration
}

// Endpoint is one pod of a callee for Spread: its ip:port and its share of requests;
// or, as name:port, every pod the name resolves to, sharing the weight evenly.
type Endpoint struct {
	Addr   string
	Weight int
}

// spreadRefresh is how long resolved Spread names are used before they are resolved
// again: a pod that becomes ready or goes is seen within about that long after the
// cluster's DNS has it.
const spreadRefresh = time.Second

// Server plays one version of one service of a graph. It answers HTTP/1.1 and
// cleartext HTTP/2 (prior knowledge) on its port whatever its protocol, and gRPC too when
// the service speaks gRPC, so health checks and mesh probes need no protocol of their
// own; it calls each callee in the callee's protocol.
type Server struct {
	service  *Service
	version  *Version
	pod      string
	program  []op
	client   *http.Client // HTTP/1.1 callees
	h2client *http.Client // HTTP/2 callees (h2c, prior knowledge)
	grpc     grpcCallers  // gRPC callees
	grpcSrv  *grpc.Server // set when the service speaks gRPC
	timeout  time.Duration
	// wrap, when set, is served instead of the Server itself (tests observe requests).
	wrap http.Handler

	served atomic.Int64 // requests answered, see ServedPath

	head       []byte // `{"service":"…","version":"…","pod":"…"`
	padding    []byte // ResponseSize bytes of 'x'
	payload    []byte // the largest request body any call sends, zeros
	fixedBody  []byte // the whole success response when the script makes no calls
	fixedLen   []string
	fixedTrace []string
}

// op is a compiled script step.
type op struct {
	call  *upstream
	sleep *Delay
	cpu   time.Duration
	group []op
}

type upstream struct {
	service     string
	protocol    string
	url         string // HTTP callees
	target      string // host:port, gRPC callees
	path        string // gRPC callees: the method
	method      string
	size        int64
	probability float64
	// spread, when set, is picked from per request (ServerOptions.Spread); authority
	// is then the Host every request carries.
	spread    *spreader
	authority string
}

// spreadTarget is one endpoint a spread call may go to; upTo is the running total of
// weights up to and including it.
type spreadTarget struct {
	url, target string
	upTo        int
}

// spreader is a callee's Spread endpoints: addresses, and names resolved to addresses
// (refreshed every spreadRefresh while in use), as one table of weighted targets.
type spreader struct {
	path   string
	static []Endpoint // ip:port
	names  []Endpoint // name:port, each weight shared by the name's addresses
	lookup func(ctx context.Context, host string) ([]string, error)

	table      atomic.Pointer[[]spreadTarget]
	mu         sync.Mutex
	resolvedAt time.Time
	refreshing bool
	last       map[string][]string // each name's last answer
}

// targets is the current table, resolving the names first when there is none yet,
// and again in the background when it is older than spreadRefresh.
func (s *spreader) targets() []spreadTarget {
	t := s.table.Load()
	if len(s.names) == 0 {
		return *t
	}
	s.mu.Lock()
	stale := !s.refreshing && time.Since(s.resolvedAt) >= spreadRefresh
	if stale {
		s.refreshing = true
	}
	s.mu.Unlock()
	switch {
	case stale && (t == nil || len(*t) == 0):
		s.resolve()
		t = s.table.Load()
	case stale:
		go s.resolve()
	}
	if t == nil {
		return nil
	}
	return *t
}

// resolve builds the table anew from the static addresses and what each name resolves
// to now. A name that does not resolve keeps the addresses it had last.
func (s *spreader) resolve() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	type weighted struct {
		addr   string
		weight int
	}
	var all []weighted
	for _, ep := range s.static {
		all = append(all, weighted{ep.Addr, ep.Weight * 1000})
	}
	for _, ep := range s.names {
		host, port, _ := net.SplitHostPort(ep.Addr)
		ips, err := s.lookup(ctx, host)
		s.mu.Lock()
		if err == nil {
			sort.Strings(ips)
			s.last[host] = ips
		} else {
			ips = s.last[host]
		}
		s.mu.Unlock()
		for _, ip := range ips {
			all = append(all, weighted{net.JoinHostPort(ip, port), max(1, ep.Weight*1000/len(ips))})
		}
	}
	var table []spreadTarget
	total := 0
	for _, w := range all {
		total += w.weight
		table = append(table, spreadTarget{url: "http://" + w.addr + s.path, target: w.addr, upTo: total})
	}
	s.table.Store(&table)
	s.mu.Lock()
	s.resolvedAt, s.refreshing = time.Now(), false
	s.mu.Unlock()
}

// newSpreader is the spread of a callee's endpoints of positive weight, or nil when it
// has none. Addresses make the table at once; names when first used.
func newSpreader(eps []Endpoint, path string, lookup func(context.Context, string) ([]string, error)) *spreader {
	s := &spreader{path: path, lookup: lookup, last: map[string][]string{}}
	for _, ep := range eps {
		if ep.Weight <= 0 {
			continue
		}
		if host, _, err := net.SplitHostPort(ep.Addr); err == nil && net.ParseIP(host) == nil {
			s.names = append(s.names, ep)
		} else {
			s.static = append(s.static, ep)
		}
	}
	if len(s.static)+len(s.names) == 0 {
		return nil
	}
	if len(s.names) == 0 {
		s.resolve()
	}
	return s
}

// pick returns the url and target of this request's endpoint: one of the spread's,
// by weight, or the service's own address when there is no spread or none of its
// names resolves.
func (u *upstream) pick() (url, target string) {
	if u.spread == nil {
		return u.url, u.target
	}
	t := u.spread.targets()
	if len(t) == 0 {
		return u.url, u.target
	}
	n := rand.IntN(t[len(t)-1].upTo)
	for _, x := range t {
		if n < x.upTo {
			return x.url, x.target
		}
	}
	return u.url, u.target // not reached: n < the last upTo
}

var (
	jsonContentType = []string{"application/json"}
	padEnd          = []byte(`"}`)
	bufPool         = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}
)

// NewServer prepares a server for one service version of g.
func NewServer(g *Graph, opts ServerOptions) (*Server, error) {
	svc := g.Service(opts.Service)
	if svc == nil {
		names := make([]string, len(g.Services))
		for i, s := range g.Services {
			names[i] = s.Name
		}
		return nil, fmt.Errorf("graph %s has no service %q (services: %s)", g.Name, opts.Service, strings.Join(names, ", "))
	}
	var ver *Version
	switch {
	case opts.Version != "":
		ver = svc.Version(opts.Version)
	case len(svc.Versions) == 1:
		ver = svc.Versions[0]
	}
	if ver == nil {
		names := make([]string, len(svc.Versions))
		for i, v := range svc.Versions {
			names[i] = v.Name
		}
		return nil, fmt.Errorf("service %s has no version %q (versions: %s)", svc.Name, opts.Version, strings.Join(names, ", "))
	}
	pod := opts.Pod
	if pod == "" {
		pod = os.Getenv("POD_NAME")
	}
	if pod == "" {
		pod, _ = os.Hostname()
	}
	s := &Server{service: svc, version: ver, pod: pod, timeout: opts.CallTimeout}
	if s.timeout <= 0 {
		s.timeout = 30 * time.Second
	}
	var maxSize int64
	lookup := opts.LookupHost
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	s.program = compile(g, ver.Script, opts.Callees, opts.Spread, lookup, &maxSize)
	s.payload = make([]byte, maxSize)
	s.padding = bytes.Repeat([]byte{'x'}, int(svc.ResponseSize))
	s.client = &http.Client{Transport: newTransport(opts.Resolve, false)}
	s.h2client = &http.Client{Transport: newTransport(opts.Resolve, true)}
	s.grpc.dial = s.h2client.Transport.(*http.Transport).DialContext
	if svc.Protocol == ProtocolGRPC {
		s.grpcSrv = s.newGRPCServer()
	}

	head, _ := json.Marshal(struct {
		Service string `json:"service"`
		Version string `json:"version"`
		Pod     string `json:"pod"`
	}{svc.Name, ver.Name, pod})
	s.head = head[:len(head)-1]

	if len(ver.Script.Calls()) == 0 {
		trace := append(append([]byte{}, s.head...), `,"code":200`...)
		s.fixedTrace = []string{strconv.Itoa(len(trace))}
		s.fixedBody = s.pad(trace)
		s.fixedLen = []string{strconv.Itoa(len(s.fixedBody))}
	}
	return s, nil
}

func compile(g *Graph, sc Script, callees map[string]string, spread map[string][]Endpoint, lookup func(context.Context, string) ([]string, error), maxSize *int64) []op {
	out := make([]op, 0, len(sc))
	for _, st := range sc {
		switch {
		case st.Call != nil:
			callee := g.Service(st.Call.Service)
			path := st.Call.Path
			if path == "" {
				path = callee.Path
			}
			method := http.MethodGet
			if st.Call.Size > 0 {
				method = http.MethodPost
			}
			*maxSize = max(*maxSize, st.Call.Size)
			target := callee.Name + ":" + strconv.Itoa(callee.Port)
			if a, ok := callees[callee.Name]; ok {
				target = a // the mesh's own name for the callee
			}
			u := &upstream{
				service:     callee.Name,
				protocol:    callee.Protocol,
				url:         "http://" + target + path,
				target:      target,
				method:      method,
				size:        st.Call.Size,
				probability: st.Call.Probability,
			}
			if callee.Protocol == ProtocolGRPC {
				u.path = grpcMethod(path)
			}
			if sp := newSpreader(spread[callee.Name], path, lookup); sp != nil {
				u.spread, u.authority = sp, target
			}
			out = append(out, op{call: u})
		case st.Sleep != nil:
			out = append(out, op{sleep: st.Sleep})
		case st.Concurrent != nil:
			out = append(out, op{group: compile(g, st.Concurrent, callees, spread, lookup, maxSize)})
		default:
			out = append(out, op{cpu: st.CPU})
		}
	}
	return out
}

// pad completes a trace into a response body of at least ResponseSize bytes.
func (s *Server) pad(trace []byte) []byte {
	body := append([]byte{}, trace...)
	need := int(s.service.ResponseSize) - len(trace) - 1
	const padField = len(`,"pad":""`)
	switch {
	case need >= padField:
		body = append(body, `,"pad":"`...)
		body = append(body, s.padding[:need-padField]...)
		body = append(body, '"')
	case need > 0:
		body = append(body, bytes.Repeat([]byte{' '}, need)...)
	}
	return append(body, '}')
}

// grpcMethod is the method a call with this path invokes: the path itself when it
// names one (/package.Service/Method), else CallMethod.
func grpcMethod(path string) string {
	if m := GRPCMethod(path); m != "" {
		return m
	}
	return CallMethod
}

// GRPCMethod returns path when it names a gRPC method (/package.Service/Method), else "".
func GRPCMethod(path string) string {
	svc, m, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if strings.HasPrefix(path, "/") && ok && strings.Contains(svc, ".") && m != "" && !strings.Contains(m, "/") {
		return path
	}
	return ""
}

func newTransport(resolve map[string]string, h2c bool) *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if len(resolve) > 0 {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err == nil {
				if to, ok := resolve[host]; ok {
					if h, p, perr := net.SplitHostPort(to); perr == nil {
						host, port = h, p
					} else {
						host = to
					}
					addr = net.JoinHostPort(host, port)
				}
			}
			return dialer.DialContext(ctx, network, addr)
		}
	}
	t := &http.Transport{
		Proxy:               nil, // calls go where the graph says, never to $HTTP_PROXY
		DialContext:         dial,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	if h2c {
		// Prior knowledge, as gRPC and h2c clients do: no HTTP/1.1 Upgrade round trip,
		// and requests to a callee share its connection as concurrent streams.
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		t.Protocols = p
	}
	return t
}

// ParseResolve reads --resolve values of the form name=ip or name=ip:port.
func ParseResolve(specs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, spec := range specs {
		name, to, ok := strings.Cut(spec, "=")
		if !ok || name == "" || to == "" {
			return nil, fmt.Errorf("--resolve %q: want name=ip or name=ip:port", spec)
		}
		host := to
		if h, _, err := net.SplitHostPort(to); err == nil {
			host = h
		}
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("--resolve %q: %q is not an IP address", spec, host)
		}
		out[name] = to
	}
	return out, nil
}

// ParseCallees reads --callee values of the form service=host:port.
func ParseCallees(specs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, spec := range specs {
		name, to, ok := strings.Cut(spec, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--callee %q: want service=host:port", spec)
		}
		host, port, err := net.SplitHostPort(to)
		if err != nil || host == "" {
			return nil, fmt.Errorf("--callee %q: %q is not host:port", spec, to)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--callee %q: port %q out of range", spec, port)
		}
		out[name] = to
	}
	return out, nil
}

// FormatSpread writes one --spread value, the inverse of ParseSpread.
func FormatSpread(service string, eps []Endpoint) string {
	list := make([]string, len(eps))
	for i, ep := range eps {
		list[i] = ep.Addr + "@" + strconv.Itoa(ep.Weight)
	}
	return service + "=" + strings.Join(list, ",")
}

// hostName is a DNS name: dot-separated RFC 1123 labels.
var hostName = regexp.MustCompile(`^(?i)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// ParseSpread reads --spread values of the form service=ip:port@weight,ip:port@weight,...
// (@weight may be left out: 1), where an endpoint may also be name:port, every address
// the name resolves to; a service given twice is an error.
func ParseSpread(specs []string) (map[string][]Endpoint, error) {
	out := map[string][]Endpoint{}
	for _, spec := range specs {
		name, list, ok := strings.Cut(spec, "=")
		if !ok || name == "" || list == "" {
			return nil, fmt.Errorf("--spread %q: want service=ip:port@weight, with more endpoints after commas", spec)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--spread %q: service %s given twice", spec, name)
		}
		eps := []Endpoint{}
		positive := false
		for _, item := range strings.Split(list, ",") {
			addr, w, hasWeight := strings.Cut(item, "@")
			weight := 1
			if hasWeight {
				n, err := strconv.Atoi(w)
				if err != nil || n < 0 || n > 1_000_000 {
					return nil, fmt.Errorf("--spread %q: weight %q of %s is not a whole number from 0 to 1000000", spec, w, addr)
				}
				weight = n
			}
			host, port, err := net.SplitHostPort(addr)
			if err != nil || net.ParseIP(host) == nil && !hostName.MatchString(host) {
				return nil, fmt.Errorf("--spread %q: %q is not ip:port or name:port", spec, addr)
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("--spread %q: port %q out of range", spec, port)
			}
			positive = positive || weight > 0
			eps = append(eps, Endpoint{Addr: addr, Weight: weight})
		}
		if !positive {
			return nil, fmt.Errorf("--spread %q: every endpoint of %s has weight 0", spec, name)
		}
		out[name] = eps
	}
	return out, nil
}

// ServeHTTP answers one request: health checks directly, everything else by running
// the script and replying with the trace of the whole call graph.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.grpcSrv != nil && r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		s.grpcSrv.ServeHTTP(w, r) // counted in the gRPC handler
		return
	}
	switch r.URL.Path {
	case HealthPath:
		w.Header()["Content-Type"] = []string{"text/plain"}
		io.WriteString(w, "ok\n")
		return
	case ServedPath:
		w.Header()["Content-Type"] = []string{"text/plain"}
		io.WriteString(w, strconv.FormatInt(s.served.Load(), 10)+"\n")
		return
	}
	s.served.Add(1)
	if r.Body != nil && r.ContentLength != 0 {
		io.Copy(io.Discard, r.Body)
	}
	h := w.Header()
	if id, ok := r.Header["X-Request-Id"]; ok {
		h["X-Request-Id"] = id
	}
	h["Content-Type"] = jsonContentType

	if s.service.ErrorRate > 0 && rand.Float64() < s.service.ErrorRate {
		s.reply(w, http.StatusInternalServerError, "injected fault", nil)
		return
	}
	if s.fixedBody != nil {
		if !s.runLocal(r.Context()) {
			s.reply(w, http.StatusGatewayTimeout, "request cancelled", nil)
			return
		}
		h["Content-Length"] = s.fixedLen
		h[TraceBytesHeader] = s.fixedTrace
		w.Write(s.fixedBody)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	defer cancel()
	run := &execution{server: s, ctx: ctx, in: r.Header}
	run.steps(s.program)
	if run.failure != "" {
		s.reply(w, http.StatusBadGateway, run.failure, run.calls)
		return
	}
	s.reply(w, http.StatusOK, "", run.calls)
}

// runLocal runs a script without calls (sleeps and CPU only).
func (s *Server) runLocal(ctx context.Context) bool {
	for i := range s.program {
		o := &s.program[i]
		switch {
		case o.sleep != nil:
			if !sleepCtx(ctx, o.sleep.Sample(nil)) {
				return false
			}
		case o.group != nil:
			var wg sync.WaitGroup
			for j := range o.group {
				wg.Add(1)
				go func(m *op) {
					defer wg.Done()
					if m.sleep != nil {
						sleepCtx(ctx, m.sleep.Sample(nil))
					} else {
						BurnCPU(m.cpu)
					}
				}(&o.group[j])
			}
			wg.Wait()
		default:
			BurnCPU(o.cpu)
		}
	}
	return ctx.Err() == nil
}

// body is the whole response body reply would write, and the length of its trace.
func (s *Server) body(code int, failure string, calls [][]byte) ([]byte, int) {
	rec := &bodyRecorder{header: http.Header{}}
	s.reply(rec, code, failure, calls)
	n, _ := strconv.Atoi(rec.header.Get(TraceBytesHeader))
	return rec.buf.Bytes(), n
}

// bodyRecorder captures what reply writes.
type bodyRecorder struct {
	header http.Header
	buf    bytes.Buffer
}

func (r *bodyRecorder) Header() http.Header         { return r.header }
func (r *bodyRecorder) Write(b []byte) (int, error) { return r.buf.Write(b) }
func (r *bodyRecorder) WriteHeader(int)             {}

func (s *Server) reply(w http.ResponseWriter, code int, failure string, calls [][]byte) {
	bp := bufPool.Get().(*[]byte)
	b := append((*bp)[:0], s.head...)
	b = append(b, `,"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	if failure != "" {
		b = append(b, `,"error":`...)
		b = appendJSONString(b, failure)
	}
	if len(calls) > 0 {
		b = append(b, `,"calls":[`...)
		for i, c := range calls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, c...)
		}
		b = append(b, ']')
	}
	traceLen := len(b)
	const padField = len(`,"pad":""`)
	padLen, spaces := -1, 0
	if code == http.StatusOK {
		if need := int(s.service.ResponseSize) - traceLen - 1; need >= padField {
			padLen = need - padField
		} else if need > 0 {
			spaces = need
		}
	}
	total := traceLen + spaces + 1
	if padLen >= 0 {
		total += padField + padLen
	}
	h := w.Header()
	h[TraceBytesHeader] = []string{strconv.Itoa(traceLen)}
	h["Content-Length"] = []string{strconv.Itoa(total)}
	w.WriteHeader(code)
	switch {
	case padLen > 32<<10:
		// large pads go straight from the shared padding instead of through a copy
		b = append(b, `,"pad":"`...)
		w.Write(b)
		w.Write(s.padding[:padLen])
		w.Write(padEnd)
	case padLen >= 0:
		b = append(b, `,"pad":"`...)
		b = append(b, s.padding[:padLen]...)
		b = append(b, padEnd...)
		w.Write(b)
	default:
		for ; spaces > 0; spaces-- {
			b = append(b, ' ')
		}
		b = append(b, '}')
		w.Write(b)
	}
	*bp = b
	bufPool.Put(bp)
}

// execution is the state of one request's script.
type execution struct {
	server  *Server
	ctx     context.Context
	in      http.Header
	mu      sync.Mutex
	calls   [][]byte
	failure string
}

func (e *execution) fail(msg string) {
	e.mu.Lock()
	if e.failure == "" {
		e.failure = msg
	}
	e.mu.Unlock()
}

func (e *execution) steps(program []op) {
	for i := range program {
		if e.failure != "" {
			return
		}
		o := &program[i]
		if o.group == nil {
			if node := e.step(o); node != nil {
				e.calls = append(e.calls, node)
			}
			continue
		}
		nodes := make([][]byte, len(o.group))
		var wg sync.WaitGroup
		for j := range o.group {
			wg.Add(1)
			go func(j int) {
				defer wg.Done()
				nodes[j] = e.step(&o.group[j])
			}(j)
		}
		wg.Wait()
		for _, n := range nodes {
			if n != nil {
				e.calls = append(e.calls, n)
			}
		}
	}
}

// step runs one non-group op and returns the trace node of its call, if it made one.
func (e *execution) step(o *op) []byte {
	switch {
	case o.call != nil:
		if o.call.probability < 1 && rand.Float64() >= o.call.probability {
			return nil
		}
		return e.call(o.call)
	case o.sleep != nil:
		if !sleepCtx(e.ctx, o.sleep.Sample(nil)) {
			e.fail("request cancelled or timed out while sleeping")
		}
	default:
		BurnCPU(o.cpu)
	}
	return nil
}

func (e *execution) call(u *upstream) []byte {
	client := e.server.client
	switch u.protocol {
	case ProtocolGRPC:
		return e.callGRPC(u)
	case ProtocolHTTP2:
		client = e.server.h2client
	}
	var body io.Reader
	if u.size > 0 {
		body = bytes.NewReader(e.server.payload[:u.size])
	}
	url, _ := u.pick()
	req, err := http.NewRequestWithContext(e.ctx, u.method, url, body)
	if err != nil {
		return e.callFailed(u, 0, err.Error())
	}
	if u.authority != "" {
		req.Host = u.authority
	}
	for _, k := range propagatedHeaders {
		if v, ok := e.in[k]; ok {
			req.Header[k] = v
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return e.callFailed(u, 0, err.Error())
	}
	bp := bufPool.Get().(*[]byte)
	buf := bytes.NewBuffer((*bp)[:0])
	_, err = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	defer func() {
		*bp = buf.Bytes()[:0]
		bufPool.Put(bp)
	}()
	if err != nil {
		return e.callFailed(u, resp.StatusCode, "reading response: "+err.Error())
	}
	got := buf.Bytes()
	n, perr := strconv.Atoi(resp.Header.Get(TraceBytesHeader))
	if perr != nil || n < 2 || n > len(got) || got[0] != '{' {
		return e.callFailed(u, resp.StatusCode, "response carries no meshmark trace: "+snippet(got))
	}
	node := make([]byte, n+1)
	copy(node, got[:n])
	node[n] = '}'
	if resp.StatusCode/100 != 2 {
		e.fail(fmt.Sprintf("call to %s returned %d", u.service, resp.StatusCode))
	}
	return node
}

// callFailed records a call that produced no trace (connection refused, a proxy's own
// error page) as a node of its own.
func (e *execution) callFailed(u *upstream, code int, msg string) []byte {
	if code == 0 {
		e.fail(fmt.Sprintf("call to %s failed: %s", u.service, msg))
	} else {
		e.fail(fmt.Sprintf("call to %s returned %d", u.service, code))
	}
	b := append([]byte(`{"service":`), appendJSONString(nil, u.service)...)
	b = append(b, `,"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"error":`...)
	b = appendJSONString(b, msg)
	return append(b, '}')
}

func snippet(b []byte) string {
	const limit = 120
	if len(b) > limit {
		return string(b[:limit]) + "…"
	}
	return string(b)
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Serve answers requests on ln until ctx is cancelled, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	var handler http.Handler = s
	if s.wrap != nil {
		handler = s.wrap
	}
	srv := &http.Server{
		Handler:           handler,
		Protocols:         protocols,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       10 * time.Minute,
		ErrorLog:          nil,
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(shutdownCtx)
		case <-done:
		}
	}()
	err := srv.Serve(ln)
	close(done)
	s.client.CloseIdleConnections()
	s.h2client.CloseIdleConnections()
	s.grpc.close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Describe is a one-line summary for logs: "reviews v2 (pod reviews-v2-0)".
func (s *Server) Describe() string {
	return fmt.Sprintf("%s %s (pod %s)", s.service.Name, s.version.Name, s.pod)
}
