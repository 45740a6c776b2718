package load

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grpcTestServer is a grpc-go server with the standard health service and test.Svc:
// Echo returns its BytesValue, Sleep waits for its Duration, Drop closes every
// connection of the server (a crashed target), Probe fails unless metadata x-probe is
// "yes".
type grpcTestServer struct {
	addr   string
	health *health.Server
	conns  atomic.Int64
	calls  atomic.Int64
	mu     sync.Mutex
	open   []net.Conn
	// onCall, when set, runs as a call starts; what it returns runs as the call ends.
	onCall func() func()
}

type countingListener struct {
	net.Listener
	s *grpcTestServer
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.s.conns.Add(1)
		l.s.mu.Lock()
		l.s.open = append(l.s.open, c)
		l.s.mu.Unlock()
	}
	return c, err
}

func startGRPC(t *testing.T) *grpcTestServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &grpcTestServer{addr: ln.Addr().String(), health: health.NewServer()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.calls.Add(1)
		if s.onCall != nil {
			defer s.onCall()()
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, s.health)
	unary := func(name string, in func() proto.Message, f func(ctx context.Context, req proto.Message) (proto.Message, error)) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := in()
			if err := dec(req); err != nil {
				return nil, err
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/test.Svc/" + name}, func(ctx context.Context, r any) (any, error) {
				return f(ctx, r.(proto.Message))
			})
		}}
	}
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "test.Svc", HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{
		unary("Echo", func() proto.Message { return new(wrapperspb.BytesValue) }, func(_ context.Context, r proto.Message) (proto.Message, error) {
			return r, nil
		}),
		unary("Sleep", func() proto.Message { return new(durationpb.Duration) }, func(ctx context.Context, r proto.Message) (proto.Message, error) {
			select {
			case <-time.After(r.(*durationpb.Duration).AsDuration()):
				return r, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}),
		unary("Drop", func() proto.Message { return new(wrapperspb.BytesValue) }, func(context.Context, proto.Message) (proto.Message, error) {
			s.mu.Lock()
			for _, c := range s.open {
				c.(*net.TCPConn).SetLinger(0) // a reset, as from a killed process
				c.Close()
			}
			s.open = nil
			s.mu.Unlock()
			return new(wrapperspb.BytesValue), nil
		}),
		unary("Probe", func() proto.Message { return new(wrapperspb.BytesValue) }, func(ctx context.Context, r proto.Message) (proto.Message, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("x-probe"); len(v) != 1 || v[0] != "yes" {
				return nil, status.Errorf(codes.InvalidArgument, "x-probe is %q", v)
			}
			if a := md.Get(":authority"); len(a) != 1 || a[0] != "svc.example:80" {
				return nil, status.Errorf(codes.InvalidArgument, ":authority is %q", a)
			}
			if ua := md.Get("user-agent"); len(ua) != 1 || !strings.HasPrefix(ua[0], "meshmark ") {
				return nil, status.Errorf(codes.InvalidArgument, "user-agent is %q", ua)
			}
			return r, nil
		}),
	}}, nil)
	go srv.Serve(countingListener{ln, s})
	t.Cleanup(srv.Stop)
	return s
}

func (s *grpcTestServer) url(method string) string { return "http://" + s.addr + method }

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newGRPC(t *testing.T) Client {
	t.Helper()
	c, err := NewGRPCClient(ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGRPCHealthClosedAndOpen(t *testing.T) {
	s := startGRPC(t)
	c := newGRPC(t)
	res := run(t, Config{Request: Request{URL: s.url("")}, Closed: &ClosedModel{Connections: 2}, Count: 300, Client: c})
	if res.Succeeded != 300 || s.calls.Load() != 300 || res.StatusCodes[200] != 300 {
		t.Fatalf("closed: ok %d, server calls %d, codes %v, errors %+v %v", res.Succeeded, s.calls.Load(), res.StatusCodes, res.Errors, res.ErrorSamples)
	}
	// HealthCheckResponse{status: SERVING} is two bytes on the wire
	if res.BytesIn != 300*2 {
		t.Errorf("bytes in %d, want 600", res.BytesIn)
	}
	if s.conns.Load() != 2 || res.Health.Connections != 2 {
		t.Errorf("closed -c 2: server accepted %d connections, client dialed %d; want 2 and 2", s.conns.Load(), res.Health.Connections)
	}
	if fb := res.FirstByte.Quantile(50); fb <= 0 || fb > res.Service.Quantile(50) {
		t.Errorf("first byte p50 %v, service p50 %v", fb, res.Service.Quantile(50))
	}

	calls := s.calls.Load()
	res = run(t, Config{
		Request:  Request{URL: s.url("/")},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}},
		Duration: 1500 * time.Millisecond,
		Client:   c,
	})
	if n := s.calls.Load() - calls; res.Errors.Total() != 0 || res.Completed != res.Sent || res.Sent != n || res.Sent < 280 {
		t.Fatalf("open: sent %d, completed %d, server calls %d, errors %+v %v", res.Sent, res.Completed, n, res.Errors, res.ErrorSamples)
	}
}

func TestGRPCStatusesAreFailures(t *testing.T) {
	s := startGRPC(t)
	c := newGRPC(t)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	res := run(t, Config{Request: Request{URL: s.url("")}, Closed: &ClosedModel{Connections: 1}, Count: 5, Client: c})
	if res.Succeeded != 0 || res.Errors.Non2xx != 5 || res.StatusCodes[503] != 5 || res.Latency.TotalCount() != 5 {
		t.Errorf("NOT_SERVING: ok %d, errors %+v, codes %v, latencies %d", res.Succeeded, res.Errors, res.StatusCodes, res.Latency.TotalCount())
	}
	if len(res.ErrorSamples) != 1 || !strings.Contains(res.ErrorSamples[0], "NOT_SERVING") {
		t.Errorf("NOT_SERVING samples %q", res.ErrorSamples)
	}

	for _, tc := range []struct {
		name, url string
		body      []byte
		code      int
		sample    string
	}{
		{"unknown method", s.url("/test.Nope/Call"), nil, 501, "Unimplemented: unknown service test.Nope"},
		{"unknown health service", s.url(HealthCheckMethod), mustMarshal(t, &healthpb.HealthCheckRequest{Service: "nope"}), 404, "NotFound: unknown service"},
		{"missing metadata", s.url("/test.Svc/Probe"), nil, 400, `InvalidArgument: x-probe is []`},
		{"malformed request", s.url("/test.Svc/Echo"), []byte{0xff, 0xff}, 500, "Internal: grpc: failed to unmarshal"},
	} {
		res := run(t, Config{Request: Request{URL: tc.url, Body: tc.body}, Closed: &ClosedModel{Connections: 1}, Count: 4, Client: c})
		if res.Errors.Non2xx != 4 || res.StatusCodes[tc.code] != 4 || res.Latency.TotalCount() != 4 {
			t.Errorf("%s: errors %+v, codes %v, latencies %d; want 4×%d", tc.name, res.Errors, res.StatusCodes, res.Latency.TotalCount(), tc.code)
		}
		if len(res.ErrorSamples) != 1 || !strings.Contains(res.ErrorSamples[0], tc.sample) {
			t.Errorf("%s: samples %q, want one with %q", tc.name, res.ErrorSamples, tc.sample)
		}
	}
}

func TestGRPCRequestBodyAndMetadata(t *testing.T) {
	s := startGRPC(t)
	c := newGRPC(t)
	body := mustMarshal(t, wrapperspb.Bytes([]byte(strings.Repeat("m", 5000))))
	res := run(t, Config{Request: Request{URL: s.url("/test.Svc/Echo"), Body: body}, Closed: &ClosedModel{Connections: 2}, Count: 20, Client: c})
	if res.Succeeded != 20 || res.BytesIn != int64(20*len(body)) {
		t.Errorf("echo: ok %d, bytes in %d, want %d; errors %v", res.Succeeded, res.BytesIn, 20*len(body), res.ErrorSamples)
	}
	hdr := http.Header{"X-Probe": {"yes"}, "Host": {"svc.example:80"}}
	res = run(t, Config{Request: Request{URL: s.url("/test.Svc/Probe"), Header: hdr}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: c})
	if res.Succeeded != 3 {
		t.Errorf("metadata: ok %d, errors %+v %v", res.Succeeded, res.Errors, res.ErrorSamples)
	}
}

func TestGRPCLatencyAndTransportErrors(t *testing.T) {
	s := startGRPC(t)
	c := newGRPC(t)
	sleep := mustMarshal(t, durationpb.New(20*time.Millisecond))
	res := run(t, Config{Request: Request{URL: s.url("/test.Svc/Sleep"), Body: sleep}, Closed: &ClosedModel{Connections: 2}, Count: 20, Client: c})
	if res.Succeeded != 20 {
		t.Fatalf("sleep: ok %d, errors %v", res.Succeeded, res.ErrorSamples)
	}
	if p50 := res.Service.Quantile(50); p50 < 20*time.Millisecond || p50 > 60*time.Millisecond {
		t.Errorf("20 ms handler: service p50 %v", p50)
	}
	if p50 := res.FirstByte.Quantile(50); p50 < 20*time.Millisecond {
		t.Errorf("20 ms handler: first byte p50 %v", p50)
	}

	long := mustMarshal(t, durationpb.New(2*time.Second))
	res = run(t, Config{Request: Request{URL: s.url("/test.Svc/Sleep"), Body: long}, Closed: &ClosedModel{Connections: 1}, Count: 2, Timeout: 50 * time.Millisecond, Client: c})
	if res.Errors.Timeout != 2 {
		t.Errorf("timeouts: errors %+v %v", res.Errors, res.ErrorSamples)
	}

	res = run(t, Config{Request: Request{URL: s.url("/test.Svc/Drop")}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: c})
	if res.Errors.Reset != 3 {
		t.Errorf("dropped connections: errors %+v %v", res.Errors, res.ErrorSamples)
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := closed.Addr().String()
	closed.Close()
	res = run(t, Config{Request: Request{URL: "http://" + addr}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: c})
	if res.Errors.Refused != 3 || res.Health.Connections != 0 {
		t.Errorf("refused: errors %+v %v, dials %d", res.Errors, res.ErrorSamples, res.Health.Connections)
	}
}

// TestGRPCPlainHTTPAnswer: a proxy answering a call with a plain HTTP error (no gRPC
// framing) is reported with that HTTP status, not the gRPC code grpc-go derives.
func TestGRPCPlainHTTPAnswer(t *testing.T) {
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no upstream", http.StatusTooManyRequests) })
	res := run(t, Config{Request: Request{URL: strings.TrimSuffix(s.url, "/")}, Closed: &ClosedModel{Connections: 1}, Count: 3, Client: newGRPC(t)})
	if res.Errors.Non2xx != 3 || res.StatusCodes[429] != 3 {
		t.Errorf("plain 429: errors %+v, codes %v, samples %q", res.Errors, res.StatusCodes, res.ErrorSamples)
	}
}

func TestGRPCPrepareRejects(t *testing.T) {
	if _, err := NewGRPCClient(ClientOptions{DisableKeepAlive: true}); err == nil {
		t.Error("DisableKeepAlive accepted")
	}
	c := newGRPC(t)
	for _, r := range []Request{
		{URL: "https://127.0.0.1:443/"},
		{URL: "http://127.0.0.1/"},
		{URL: "http://127.0.0.1:50051/onlyservice"},
		{URL: "http://127.0.0.1:50051/a/b/c"},
		{URL: "http://127.0.0.1:50051/a//"},
		{URL: "http://127.0.0.1:50051/?q=1"},
		{URL: "http://127.0.0.1:50051/", Header: http.Header{"Grpc-Timeout": {"1S"}}},
		{URL: "http://127.0.0.1:50051/", Header: http.Header{"X-Raw": {"\x00"}}},
	} {
		if _, err := c.Prepare(r); err == nil {
			t.Errorf("Prepare(%+v) accepted", r)
		}
	}
	if _, err := c.Prepare(Request{URL: "http://127.0.0.1:50051/", Header: http.Header{"X-Data-Bin": {"\x00\x01"}}}); err != nil {
		t.Errorf("binary value with a -bin key: %v", err)
	}
}

func TestGRPCHTTPStatus(t *testing.T) {
	want := map[codes.Code]int{
		codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400,
		codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409,
		codes.PermissionDenied: 403, codes.ResourceExhausted: 429, codes.FailedPrecondition: 400,
		codes.Aborted: 409, codes.OutOfRange: 400, codes.Unimplemented: 501, codes.Internal: 500,
		codes.Unavailable: 503, codes.DataLoss: 500, codes.Unauthenticated: 401, codes.Code(99): 500,
	}
	for c, w := range want {
		if got := GRPCHTTPStatus(c); got != w {
			t.Errorf("%v → %d, want %d", c, got, w)
		}
	}
}

// TestGRPCStreamsShareChannels: 6 sessions with 3 streams each are 2 connections, each
// carrying 3 calls at once.
func TestGRPCStreamsShareChannels(t *testing.T) {
	s := startGRPC(t)
	c, err := NewGRPCClient(ClientOptions{Streams: 3})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now, most := 0, 0
	s.onCall = func() func() {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		return func() { mu.Lock(); now--; mu.Unlock() }
	}
	body := mustMarshal(t, durationpb.New(20*time.Millisecond))
	res := run(t, Config{Request: Request{URL: s.url("/test.Svc/Sleep"), Body: body}, Closed: &ClosedModel{Connections: 6}, Count: 120, Client: c})
	if res.Succeeded != 120 {
		t.Fatalf("ok %d, errors %+v %v", res.Succeeded, res.Errors, res.ErrorSamples)
	}
	if s.conns.Load() != 2 || res.Health.Connections != 2 {
		t.Errorf("6 sessions, 3 streams each: server accepted %d connections, client dialed %d; want 2", s.conns.Load(), res.Health.Connections)
	}
	if most != 6 {
		t.Errorf("at most %d calls in flight, want 6 (3 on each of 2 connections)", most)
	}
	if fb := res.FirstByte.Quantile(50); fb < 20*time.Millisecond {
		t.Errorf("first byte p50 %v: the shared stats handler credited another session's response", fb)
	}
}
