package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// ServerOptions shape a generator.
type ServerOptions struct {
	// AllowAnyTarget lets plans load any address; otherwise only loopback,
	// 198.18.0.0/15 and the services of AllowNamespace.
	AllowAnyTarget bool
	// AllowNamespace also allows the Kubernetes services of this namespace by name:
	// NAME, NAME.NS, NAME.NS.svc and NAME.NS.svc.cluster.local.
	AllowNamespace string
	// Resolve maps host:port to the address to dial instead, like curl --resolve.
	Resolve map[string]string
	// RawDir, when set, keeps every request of every plan as a raw CSV log there.
	RawDir string
	// Log receives one line per plan.
	Log io.Writer
}

// Longest a plan may wait for its start, and how late it may arrive.
const (
	maxStartAhead = time.Minute
	maxStartLate  = 5 * time.Second
)

// Server runs one plan at a time.
type Server struct {
	opts ServerOptions
	grpc *grpc.Server

	mu      sync.Mutex
	running string // who the running plan came from, and since when
}

// NewServer makes a generator; Serve starts it.
func NewServer(opts ServerOptions) *Server {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	s := &Server{opts: opts, grpc: grpc.NewServer()}
	s.grpc.RegisterService(&serviceDesc, s)
	return s
}

// Serve answers plans on lis until Stop.
func (s *Server) Serve(lis net.Listener) error { return s.grpc.Serve(lis) }

// Stop ends the running plan and the server.
func (s *Server) Stop() { s.grpc.Stop() }

func (s *Server) run(p *Plan, stream grpc.ServerStream) error {
	ctx := stream.Context()
	from := "unknown"
	if pr, ok := peer.FromContext(ctx); ok {
		from = pr.Addr.String()
	}
	s.mu.Lock()
	if s.running != "" {
		busy := s.running
		s.mu.Unlock()
		return status.Errorf(codes.ResourceExhausted, "busy: running a plan from %s", busy)
	}
	s.running = fmt.Sprintf("%s since %s", from, time.Now().Format(time.TimeOnly))
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running = ""
		s.mu.Unlock()
	}()

	cfg, err := s.prepare(p)
	if err != nil {
		return err
	}
	start := p.StartAt
	if start.IsZero() {
		start = time.Now()
	}
	if s.opts.RawDir != "" {
		name := filepath.Join(s.opts.RawDir, fmt.Sprintf("plan-%s-%d.csv", start.UTC().Format("20060102T150405.000000000"), p.Share.Index))
		f, err := os.Create(name)
		if err != nil {
			return status.Errorf(codes.Internal, "raw log: %v", err)
		}
		defer f.Close()
		cfg.RawLog = f
	}
	// The engine calls Progress from its own goroutine and must not wait on the
	// network: events queue here and one goroutine sends them, in order. Every interval
	// is part of the result now, so none is dropped; a driver that stops reading for
	// maxBacklog intervals stops the plan instead.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	q := newEventQueue()
	sent := make(chan error, 1)
	go func() { sent <- q.drain(stream.SendMsg) }()
	intervals := 0
	cfg.StreamIntervals = true
	cfg.Progress = func(pr load.Progress) {
		iv := pr.Interval
		intervals++
		if !q.push(&Event{Interval: &iv, InFlight: pr.InFlight, Elapsed: pr.Elapsed, Total: pr.Total}) {
			stopRun(errDriverBehind)
		}
	}
	select {
	case <-time.After(time.Until(start)):
	case <-ctx.Done():
		q.close()
		<-sent
		return status.FromContextError(ctx.Err()).Err()
	}
	res, runErr := load.Run(runCtx, cfg)
	if res != nil && runCtx.Err() == nil {
		// The driver has every interval whole; the result's are their figures alone
		// (Config.StreamIntervals), which judged the run here.
		final := *res
		final.Intervals = nil
		q.push(&Event{Result: &final, Intervals: intervals})
	}
	q.close()
	sendErr := <-sent
	share := fmt.Sprintf("%s (share %d/%d)", cfg.Request.URL, p.Share.Index+1, max(p.Share.Of, 1))
	switch {
	case errors.Is(context.Cause(runCtx), errDriverBehind):
		fmt.Fprintf(s.opts.Log, "plan from %s: %s: stopped: %v\n", from, share, errDriverBehind)
		return status.Error(codes.ResourceExhausted, errDriverBehind.Error())
	case ctx.Err() != nil:
		fmt.Fprintf(s.opts.Log, "plan from %s: %s: stopped: the driver went away\n", from, share)
		return status.FromContextError(ctx.Err()).Err()
	case res == nil:
		return status.Errorf(codes.Internal, "load: %v", runErr)
	}
	fmt.Fprintf(s.opts.Log, "plan from %s: %s: %d requests, %d errors, %d intervals\n", from, share, res.Completed, res.Errors.Total(), intervals)
	return sendErr
}

// maxBacklog is how many events may wait for a driver that does not read them: at the
// default interval, over an hour's.
const maxBacklog = 1 << 12

var errDriverBehind = fmt.Errorf("the driver read none of the last %d intervals", maxBacklog)

// eventQueue holds the events of a plan until they are sent, in order, however fast
// the engine produces them; push never blocks.
type eventQueue struct {
	mu     sync.Mutex
	events []*Event
	closed bool
	wake   chan struct{}
}

func newEventQueue() *eventQueue { return &eventQueue{wake: make(chan struct{}, 1)} }

// push queues ev; false, for an interval, when maxBacklog events already wait (the
// result is always queued).
func (q *eventQueue) push(ev *Event) bool {
	q.mu.Lock()
	full := ev.Result == nil && len(q.events) >= maxBacklog
	if !full {
		q.events = append(q.events, ev)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return !full
}

// close lets drain return once every queued event is sent.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// drain sends events with send until the queue is closed and empty; after a failed
// send it discards the rest and returns that error.
func (q *eventQueue) drain(send func(any) error) error {
	var err error
	for {
		q.mu.Lock()
		batch, closed := q.events, q.closed
		q.events = nil
		q.mu.Unlock()
		for _, ev := range batch {
			if err == nil {
				err = send(ev)
			}
		}
		if closed && len(batch) == 0 {
			return err
		}
		if len(batch) == 0 {
			<-q.wake
		}
	}
}

// prepare checks a plan and turns it into this generator's run.
func (s *Server) prepare(p *Plan) (load.Config, error) {
	if p.Share.Of == 0 {
		p.Share.Of = 1
	}
	if p.Share.Of < 1 || p.Share.Index < 0 || p.Share.Index >= p.Share.Of {
		return load.Config{}, status.Errorf(codes.InvalidArgument, "share %d of %d: want 0 <= index < of", p.Share.Index, p.Share.Of)
	}
	if !p.StartAt.IsZero() {
		if d := time.Until(p.StartAt); d > maxStartAhead {
			return load.Config{}, status.Errorf(codes.InvalidArgument, "start %s is %s ahead; at most %s (are the clocks apart?)", p.StartAt.Format(time.RFC3339Nano), d.Round(time.Millisecond), maxStartAhead)
		} else if d < -maxStartLate {
			return load.Config{}, status.Errorf(codes.InvalidArgument, "start %s passed %s ago; at most %s (are the clocks apart?)", p.StartAt.Format(time.RFC3339Nano), (-d).Round(time.Millisecond), maxStartLate)
		}
	}
	if len(p.Load) == 0 {
		return load.Config{}, status.Error(codes.InvalidArgument, "the plan carries no load spec (a driver of another meshmark version?)")
	}
	spec, err := load.ParseSpec(p.Load)
	if err != nil {
		return load.Config{}, status.Error(codes.InvalidArgument, err.Error())
	}
	cfg, err := spec.Config(s.dial)
	if err != nil {
		return cfg, status.Error(codes.InvalidArgument, err.Error())
	}
	targets := []string{cfg.Request.URL}
	if cfg.Users != nil {
		for _, t := range cfg.Users.Tasks {
			targets = append(targets, t.Request.URL)
		}
	}
	for _, t := range targets {
		if err := s.checkTarget(t); err != nil {
			return cfg, status.Error(codes.PermissionDenied, err.Error())
		}
	}
	cfg.AllowAnyTarget = true // judged above, by this generator's rules
	if err := cfg.Validate(); err != nil {
		return cfg, status.Errorf(codes.InvalidArgument, "load %s: %v", cfg.Request.URL, err)
	}
	if err := Split(&cfg, p.Share); err != nil {
		return cfg, status.Error(codes.InvalidArgument, err.Error())
	}
	return cfg, nil
}

// checkTarget applies the generator's rules to a URL: a service of the allowed
// namespace, else the address it dials (after Resolve) must be loopback or in
// 198.18.0.0/15, unless any target is allowed.
func (s *Server) checkTarget(raw string) error {
	if s.opts.AllowAnyTarget {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	host := u.Hostname()
	if ns := s.opts.AllowNamespace; ns != "" {
		name, rest, _ := strings.Cut(host, ".")
		switch rest {
		case "", ns, ns + ".svc", ns + ".svc.cluster.local":
			if name != "" && !strings.Contains(name, ":") && net.ParseIP(host) == nil {
				return nil
			}
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	if to, ok := s.opts.Resolve[net.JoinHostPort(host, port)]; ok {
		return load.CheckTarget("http://" + to)
	}
	if err := load.CheckTarget(raw); err != nil {
		if s.opts.AllowNamespace != "" {
			return fmt.Errorf("%w; this generator also loads the services of namespace %s", err, s.opts.AllowNamespace)
		}
		return err
	}
	return nil
}

// dial connects as the plan asks, to the address Resolve names for host:port if any.
func (s *Server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if to, ok := s.opts.Resolve[addr]; ok {
		addr = to
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// ParseResolve reads curl's --resolve syntax, HOST:PORT:ADDR (ADDR host:port, or an IP
// that keeps PORT), into Resolve's map.
func ParseResolve(specs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, spec := range specs {
		host, rest, ok1 := strings.Cut(spec, ":")
		port, addr, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || host == "" || port == "" || addr == "" {
			return nil, fmt.Errorf("--resolve %q: want HOST:PORT:ADDR", spec)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			if net.ParseIP(strings.Trim(addr, "[]")) == nil {
				return nil, fmt.Errorf("--resolve %q: %s is neither host:port nor an IP address", spec, addr)
			}
			addr = net.JoinHostPort(strings.Trim(addr, "[]"), port)
		}
		out[net.JoinHostPort(host, port)] = addr
	}
	return out, nil
}

// Split turns cfg into generator share.Index's part of it when share.Of generators send
// it together: rates, request counts, connections and users are divided among them.
// Constant arrivals are phased so that the generators' sends interleave into the one
// schedule; Poisson arrivals get a seed of their own.
func Split(cfg *load.Config, share Share) error {
	n, i := share.Of, share.Index
	if n <= 1 {
		return nil
	}
	part := func(total int64) int64 {
		p := total / int64(n)
		if int64(i) < total%int64(n) {
			p++
		}
		return p
	}
	if cfg.Count > 0 {
		if cfg.Count < int64(n) {
			return fmt.Errorf("-n %d is fewer requests than %d generators", cfg.Count, n)
		}
		cfg.Count = part(cfg.Count)
	}
	f := float64(n)
	switch {
	case cfg.Open != nil:
		s := &cfg.Open.Schedule
		total := s.Rate
		s.Rate, s.From, s.To, s.Step = s.Rate/f, s.From/f, s.To/f, s.Step/f
		switch s.Arrival {
		case load.Constant:
			s.Phase = time.Duration(float64(i) / total * float64(time.Second))
		case load.Poisson:
			s.Seed += uint64(i) * 0x9e3779b97f4a7c15
		}
		if cfg.Open.Connections > 0 {
			cfg.Open.Connections = max(1, int(part(int64(cfg.Open.Connections))))
		}
		if cfg.Open.MaxInFlight > 0 {
			// Shared as exactly as the connections, so that a cap at the connection
			// count caps the generators together at that count.
			cfg.Open.MaxInFlight = max(1, int(part(int64(cfg.Open.MaxInFlight))), cfg.Open.Connections)
		}
	case cfg.Closed != nil:
		if cfg.Closed.Connections < n {
			return fmt.Errorf("-c %d is fewer connections than %d generators", cfg.Closed.Connections, n)
		}
		cfg.Closed.Connections = int(part(int64(cfg.Closed.Connections)))
		cfg.Closed.Rate /= f
	case cfg.Users != nil:
		if cfg.Users.Users < n {
			return fmt.Errorf("--users %d is fewer users than %d generators", cfg.Users.Users, n)
		}
		cfg.Users.Users = int(part(int64(cfg.Users.Users)))
		cfg.Users.SpawnRate /= f
		cfg.Users.Seed += uint64(i) * 0x9e3779b97f4a7c15
	default:
		return errors.New("no load model to share")
	}
	return nil
}
