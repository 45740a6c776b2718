package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Services speaking gRPC answer any unary method with the script's trace as the
// response message: the graph models call shapes, not APIs, so no generated code is
// needed (callers and the load generator send whatever bytes they like). CallMethod is
// the method callers use.
const CallMethod = "/meshmark.Workload/Call"

// gRPC metadata carrying what the HTTP protocols carry in headers: the trace length on
// success (header), the whole trace on failure (trailer, binary so any error text fits).
const (
	grpcTraceBytesKey = "x-meshmark-trace-bytes"
	grpcTraceKey      = "x-meshmark-trace-bin"
)

// passCodec sends *[]byte messages as they are and everything else as protobuf, under
// the name "proto" so that every peer accepts it: the script's trace goes out raw while
// the standard health service keeps working on the same server.
type passCodec struct{}

func (passCodec) Name() string { return "proto" }

func (passCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*[]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("workload codec: cannot marshal %T", v)
	}
	b, err := proto.Marshal(m)
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (passCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if b, ok := v.(*[]byte); ok {
		*b = data.Materialize()
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("workload codec: cannot unmarshal into %T", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

var _ encoding.CodecV2 = passCodec{}

// newGRPCServer serves every method with the script and the standard health service
// with SERVING.
func (s *Server) newGRPCServer() *grpc.Server {
	g := grpc.NewServer(grpc.ForceServerCodecV2(passCodec{}), grpc.UnknownServiceHandler(s.serveGRPC))
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(s.service.Name, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	return g
}

// serveGRPC answers one unary call of any method by running the script.
func (s *Server) serveGRPC(_ any, stream grpc.ServerStream) error {
	var in []byte
	if err := stream.RecvMsg(&in); err != nil {
		return err
	}
	s.served.Add(1)
	ctx := stream.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	if id := md.Get("x-request-id"); len(id) > 0 {
		_ = stream.SetHeader(metadata.Pairs("x-request-id", id[0]))
	}
	if s.service.ErrorRate > 0 && rand.Float64() < s.service.ErrorRate {
		return s.grpcReply(stream, http.StatusInternalServerError, "injected fault", nil)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	run := &execution{server: s, ctx: ctx, in: headerOf(md)}
	run.steps(s.program)
	if run.failure != "" {
		return s.grpcReply(stream, http.StatusBadGateway, run.failure, run.calls)
	}
	return s.grpcReply(stream, http.StatusOK, "", run.calls)
}

// grpcReply sends the trace: as the response message on success, in the trailer with a
// non-OK status otherwise (500 injected fault: Internal; 502 failed call: Unavailable,
// the status a gRPC client retries on, as for an unreachable backend).
func (s *Server) grpcReply(stream grpc.ServerStream, code int, failure string, calls [][]byte) error {
	body, traceLen := s.body(code, failure, calls)
	if code == http.StatusOK {
		if err := stream.SetHeader(metadata.Pairs(grpcTraceBytesKey, strconv.Itoa(traceLen))); err != nil {
			return err
		}
		return stream.SendMsg(&body)
	}
	stream.SetTrailer(metadata.Pairs(grpcTraceKey, string(body[:traceLen])+"}"))
	c := codes.Internal
	if code == http.StatusBadGateway {
		c = codes.Unavailable
	}
	return status.Error(c, failure)
}

// headerOf turns incoming metadata into the header form execution propagates.
func headerOf(md metadata.MD) http.Header {
	h := make(http.Header, len(md))
	for k, v := range md {
		if !strings.HasPrefix(k, ":") {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	return h
}

// grpcCallers keeps one channel per callee address, shared by every request of the
// service as a gRPC application shares its stubs' channel.
type grpcCallers struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	mu   sync.Mutex
	ccs  map[string]*grpc.ClientConn
}

// channel returns the channel to target; a non-empty authority replaces target as the
// :authority of its calls (a spread call addresses a pod but names the service).
func (g *grpcCallers) channel(target, authority string) (*grpc.ClientConn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cc, ok := g.ccs[target]; ok {
		return cc, nil
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return g.dial(ctx, "tcp", addr) }),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(passCodec{})),
		grpc.WithUserAgent("meshmark-service"),
	}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	cc, err := grpc.NewClient("passthrough:///"+target, opts...)
	if err != nil {
		return nil, err
	}
	if g.ccs == nil {
		g.ccs = map[string]*grpc.ClientConn{}
	}
	g.ccs[target] = cc
	return cc, nil
}

func (g *grpcCallers) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cc := range g.ccs {
		cc.Close()
	}
	g.ccs = nil
}

// callGRPC makes one call to a gRPC callee and returns its trace node.
func (e *execution) callGRPC(u *upstream) []byte {
	_, target := u.pick()
	cc, err := e.server.grpc.channel(target, u.authority)
	if err != nil {
		return e.callFailed(u, 0, err.Error())
	}
	md := metadata.MD{}
	for _, k := range propagatedHeaders {
		if v, ok := e.in[k]; ok && k != "User-Agent" {
			md[strings.ToLower(k)] = v
		}
	}
	ctx := metadata.NewOutgoingContext(e.ctx, md)
	req := e.server.payload[:u.size]
	var resp []byte
	var header, trailer metadata.MD
	err = cc.Invoke(ctx, u.path, &req, &resp, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		st := status.Convert(err)
		if t := trailer.Get(grpcTraceKey); len(t) == 1 && strings.HasPrefix(t[0], "{") {
			e.fail(fmt.Sprintf("call to %s returned %s", u.service, st.Code()))
			return []byte(t[0])
		}
		return e.callFailed(u, 0, fmt.Sprintf("%s: %s", st.Code(), st.Message()))
	}
	n, perr := strconv.Atoi(first(header.Get(grpcTraceBytesKey)))
	if perr != nil || n < 2 || n > len(resp) || resp[0] != '{' {
		return e.callFailed(u, 0, "response carries no meshmark trace: "+snippet(resp))
	}
	node := make([]byte, n+1)
	copy(node, resp[:n])
	node[n] = '}'
	return node
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
