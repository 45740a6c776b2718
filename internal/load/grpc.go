package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	grpcstats "google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// HealthCheckMethod is what the gRPC client calls when the URL names no method: the
// standard health service, which well-behaved servers offer, with an empty request
// (the server's overall health).
const HealthCheckMethod = "/grpc.health.v1.Health/Check"

// NewGRPCClient returns a client of unary gRPC calls through grpc-go. The request URL is
// http://host:port/package.Service/Method: the path is the full method name, exactly as
// gRPC puts it in the HTTP/2 :path (empty or "/": HealthCheckMethod). The body is the
// request message as serialised protobuf, sent as is, and the response is counted, not
// decoded, so no generated code is needed for the service under test. Request.Method
// is ignored (gRPC calls are POSTs); headers are sent as metadata, Host as :authority.
//
// A session carries one call at a time over a grpc.ClientConn, that is one HTTP/2
// connection in cleartext (h2c): by default a channel of its own; with
// ClientOptions.Streams = m, every m sessions share one channel as concurrent streams
// (as ghz --connections with several concurrent calls each). DisableKeepAlive is not
// supported: a channel per call measures channel setup, which no gRPC client does per
// call.
//
// Statuses: see GRPCHTTPStatus.
func NewGRPCClient(o ClientOptions) (Client, error) {
	if o.DisableKeepAlive {
		return nil, errors.New("grpc: a new connection per call is not supported; gRPC channels are long-lived")
	}
	c := &grpcClient{dial: o.dial()}
	c.channels = connGroup[*grpcChannel]{size: o.streams(), newConn: func() *grpcChannel { return &grpcChannel{c: c} }}
	return c, nil
}

type grpcClient struct {
	dial     DialFunc
	channels connGroup[*grpcChannel]
}

type grpcRequest struct {
	target    string // host:port
	authority string // "" : host:port
	userAgent string
	method    string
	md        metadata.MD
	health    bool   // the response is a grpc.health.v1.HealthCheckResponse
	channel   string // what a ClientConn is made for: target, authority, user agent
}

func (c *grpcClient) Prepare(r Request) (*Prepared, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("request URL %q: %w", r.URL, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("request URL %q: scheme %q not supported by the gRPC client (want http, gRPC over cleartext HTTP/2)", r.URL, u.Scheme)
	}
	if u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("request URL %q: want host:port", r.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("request URL %q: a gRPC target has no query or fragment", r.URL)
	}
	method := u.Path
	if method == "" || method == "/" {
		method = HealthCheckMethod
	}
	if err := checkGRPCMethod(method); err != nil {
		return nil, fmt.Errorf("request URL %q: %w", r.URL, err)
	}
	gr := &grpcRequest{target: u.Host, method: method, md: metadata.MD{}, health: method == HealthCheckMethod}
	for k, vs := range r.Header {
		key := strings.ToLower(k)
		switch {
		case key == "host":
			gr.authority = vs[0]
			continue
		case key == "user-agent":
			gr.userAgent = vs[0]
			continue
		case !validToken(k) || strings.HasPrefix(key, "grpc-") || key == "content-type" || key == "te":
			return nil, fmt.Errorf("header %q cannot be sent as gRPC metadata", k)
		}
		for _, v := range vs {
			if !strings.HasSuffix(key, "-bin") && strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r > '~' }) {
				return nil, fmt.Errorf("header %s: gRPC metadata values are printable ASCII (binary values need a -bin key)", k)
			}
		}
		gr.md[key] = vs
	}
	if gr.userAgent == "" {
		gr.userAgent = "meshmark"
	}
	gr.channel = gr.target + " " + gr.authority + " " + gr.userAgent
	return &Prepared{Request: r, Encoded: gr}, nil
}

// checkGRPCMethod accepts /package.Service/Method.
func checkGRPCMethod(m string) error {
	svc, meth, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	if !strings.HasPrefix(m, "/") || !ok || svc == "" || meth == "" || strings.Contains(meth, "/") {
		return fmt.Errorf("gRPC method %q: want /package.Service/Method", m)
	}
	return nil
}

func (c *grpcClient) NewSession() Session {
	ch := c.channels.join()
	ch.enter()
	return &grpcSession{ch: ch, base: time.Now()}
}

// grpcChannel is one ClientConn shared by the sessions of a group.
type grpcChannel struct {
	c  *grpcClient
	mu sync.Mutex // guards cc and key
	cc *grpc.ClientConn
	// key is the grpcRequest.channel cc was made for.
	key string
	sharers

	// Written by grpc-go's goroutines while a call is in flight.
	dials   atomic.Int32            // successful dials not yet reported
	dialErr atomic.Pointer[error]   // the last dial's error; nil after a successful dial
	conn    atomic.Pointer[errConn] // the newest connection
}

type grpcSession struct {
	ch     *grpcChannel
	closed bool
	base   time.Time
	// firstByte is written by grpc-go's goroutines while this session's call is in
	// flight: ns after base when the response began; 0: not yet.
	firstByte atomic.Int64
}

// sessionKey carries the calling session in a call's context to the stats handler,
// which the sessions sharing a channel share.
type sessionKey struct{}

// rawCodec passes messages through as bytes. It keeps the name "proto" so that the
// content-type is application/grpc+proto, which every server accepts, and the server
// decodes the bytes with its own protobuf codec.
type rawCodec struct{}

// grpcReply is what a call keeps of the response message.
type grpcReply struct {
	n      int
	health bool   // decode the serving status
	status uint64 // HealthCheckResponse.status
}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	// The buffer is read-only and shared by every call; SliceBuffer's Free does nothing.
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r := v.(*grpcReply)
	r.n = data.Len()
	if r.health {
		b := data.Materialize()
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if num == 1 && typ == protowire.VarintType {
				s, m := protowire.ConsumeVarint(b)
				if m < 0 {
					return protowire.ParseError(m)
				}
				r.status = s
				b = b[m:]
				continue
			}
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	return nil
}

// errConn remembers how a connection failed, because grpc-go reports a broken or
// refused connection only as an Unavailable status with the cause flattened into text.
type errConn struct {
	net.Conn
	err atomic.Pointer[error]
}

func (c *errConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

func (c *errConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// channel returns the ClientConn for gr, making it when there is none for gr's channel
// key; a changed key replaces the channel of every session sharing it.
func (ch *grpcChannel) channel(gr *grpcRequest) (*grpc.ClientConn, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.cc != nil && ch.key == gr.channel {
		return ch.cc, nil
	}
	ch.closeLocked()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := ch.c.dial(ctx, "tcp", addr)
			if err != nil {
				ch.dialErr.Store(&err)
				return nil, err
			}
			ch.dialErr.Store(nil)
			ch.dials.Add(1)
			ec := &errConn{Conn: conn}
			ch.conn.Store(ec)
			return ec, nil
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})),
		grpc.WithStatsHandler(grpcStats{}),
		grpc.WithUserAgent(gr.userAgent),
		// The default backoff (1 s, growing to 2 min) would keep failing calls fast for
		// seconds after a restarted target is back; a benchmark wants to see it back.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if gr.authority != "" {
		opts = append(opts, grpc.WithAuthority(gr.authority))
	}
	// passthrough: the address goes to the dialer as is, no name resolution.
	cc, err := grpc.NewClient("passthrough:///"+gr.target, opts...)
	if err != nil {
		return nil, err
	}
	ch.cc, ch.key = cc, gr.channel
	return cc, nil
}

func (ch *grpcChannel) closeLocked() error {
	if ch.cc == nil {
		return nil
	}
	err := ch.cc.Close()
	ch.cc, ch.key = nil, ""
	ch.conn.Store(nil)
	return err
}

// Do implements Session.
func (s *grpcSession) Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error {
	gr, ok := p.Encoded.(*grpcRequest)
	if !ok {
		return errors.New("grpc: request was not prepared by this client")
	}
	*out = Outcome{}
	s.ch.reopen(&s.closed)
	cc, err := s.ch.channel(gr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithDeadline(context.WithValue(ctx, sessionKey{}, s), deadline)
	defer cancel()
	if len(gr.md) > 0 {
		cctx = metadata.NewOutgoingContext(cctx, gr.md)
	}
	body := p.Request.Body
	reply := grpcReply{health: gr.health}
	s.firstByte.Store(0)
	err = cc.Invoke(cctx, gr.method, &body, &reply)
	out.Dialed = s.ch.dials.Swap(0) > 0
	if fb := s.firstByte.Load(); fb != 0 {
		out.FirstByte = s.base.Add(time.Duration(fb))
	}
	if err == nil {
		out.Status, out.BytesIn = 200, int64(reply.n)
		if gr.health && reply.status != 1 { // SERVING
			// A health check answering anything else failed, whatever its gRPC status:
			// 503, as an HTTP health endpoint would answer.
			out.Status = 503
			out.Detail = fmt.Sprintf("grpc %s answered %s", gr.method, healthStatusName(reply.status))
		}
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	answered := !out.FirstByte.IsZero()
	// grpc-go turns everything into a status; failures of the call's own transport are
	// given back their kind (timeout, refused, reset), as the HTTP clients report them.
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case cctx.Err() != nil || !time.Now().Before(deadline):
		// The deadline is checked on the clock too: grpc-go compares it with the clock
		// when the server gives up on the call as well, which can precede the context's
		// own timer.
		return fmt.Errorf("grpc %s: %w", gr.method, context.DeadlineExceeded)
	case st.Code() == codes.Unavailable && !answered && s.ch.dialErr.Load() != nil:
		return fmt.Errorf("grpc %s: %w", gr.method, *s.ch.dialErr.Load())
	case st.Code() == codes.Unavailable && s.ch.conn.Load() != nil && s.ch.conn.Load().err.Load() != nil:
		return fmt.Errorf("grpc %s: connection: %w", gr.method, *s.ch.conn.Load().err.Load())
	case answered:
		// The server, or a proxy on the way, answered with a status: a response, timed
		// and counted like a non-2xx HTTP response.
		out.Status = GRPCHTTPStatus(st.Code())
	default:
		code, ok := nonGRPCStatus(st.Message())
		if !ok {
			return err // a protocol failure of this connection
		}
		out.Status = code // an HTTP answer without gRPC framing, e.g. a proxy's 503
	}
	out.Detail = fmt.Sprintf("grpc %s: %s: %s", gr.method, st.Code(), st.Message())
	return nil
}

// nonGRPCPrefix starts the message grpc-go gives a call answered by a plain HTTP
// response (no gRPC content-type), such as an error page from a proxy.
const nonGRPCPrefix = "unexpected HTTP status code received from server: "

// nonGRPCStatus recovers that response's HTTP status, which grpc-go's mapping to a gRPC
// code would blur (404 becomes Unimplemented, 429 Unavailable).
func nonGRPCStatus(msg string) (int, bool) {
	rest, ok := strings.CutPrefix(msg, nonGRPCPrefix)
	if !ok || len(rest) < 3 {
		return 0, false
	}
	code, err := strconv.Atoi(rest[:3])
	if err != nil || code < 100 || code > 599 {
		return 0, false
	}
	return code, true
}

func healthStatusName(s uint64) string {
	switch s {
	case 0:
		return "UNKNOWN"
	case 1:
		return "SERVING"
	case 2:
		return "NOT_SERVING"
	case 3:
		return "SERVICE_UNKNOWN"
	}
	return fmt.Sprintf("serving status %d", s)
}

// Close closes the channel once none of the sessions sharing it is open.
func (s *grpcSession) Close() error {
	if !s.ch.leave(&s.closed) {
		return nil
	}
	s.ch.mu.Lock()
	defer s.ch.mu.Unlock()
	return s.ch.closeLocked()
}

// GRPCHTTPStatus maps a gRPC status code to the HTTP status that stands for it in
// results, following the mapping documented in google/rpc/code.proto (and used by
// grpc-gateway and Envoy): OK 200, InvalidArgument, FailedPrecondition and OutOfRange
// 400, Unauthenticated 401, PermissionDenied 403, NotFound 404, AlreadyExists and
// Aborted 409, ResourceExhausted 429, Canceled 499, Unknown, Internal and DataLoss 500,
// Unimplemented 501, Unavailable 503, DeadlineExceeded 504.
//
// Results keep HTTP statuses, rather than gaining a second, gRPC-only status column,
// so that every report, comparison and 2xx success rule reads the same for every
// protocol, and a mesh's overload answer (Unavailable, HTTP 503) reads the same whether
// the service speaks HTTP or gRPC. The mapping merges a few codes (400, 409, 500); the
// exact code and message of each failure go to Outcome.Detail, which appears in the
// report's error samples.
func GRPCHTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.Unauthenticated:
		return 401
	case codes.PermissionDenied:
		return 403
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.ResourceExhausted:
		return 429
	case codes.Canceled:
		return 499
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	case codes.DeadlineExceeded:
		return 504
	}
	return 500 // Unknown, Internal, DataLoss and codes outside the standard set
}

// grpcStats takes the time the response began from grpc-go's stats events: the
// connection is read by grpc-go's own goroutine, so there is no read of ours to time.
// The call's context names its session, since sessions may share the channel.
type grpcStats struct{}

func (grpcStats) TagRPC(ctx context.Context, _ *grpcstats.RPCTagInfo) context.Context { return ctx }
func (grpcStats) TagConn(ctx context.Context, _ *grpcstats.ConnTagInfo) context.Context {
	return ctx
}
func (grpcStats) HandleConn(context.Context, grpcstats.ConnStats) {}

func (grpcStats) HandleRPC(ctx context.Context, st grpcstats.RPCStats) {
	switch st.(type) {
	case *grpcstats.InHeader, *grpcstats.InTrailer: // a trailers-only response has no header
		if s, ok := ctx.Value(sessionKey{}).(*grpcSession); ok {
			s.firstByte.CompareAndSwap(0, int64(time.Since(s.base)))
		}
	}
}
