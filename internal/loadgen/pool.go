package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// startLead is how far ahead the common start of several generators is set, so that
// every plan arrives before it (through a port-forward, a round trip can take a
// while). One generator starts as soon as its plan arrives: nothing needs to line up,
// and a trial should not wait a second for nothing.
const startLead = time.Second

// Pool is a set of generators driven together.
type Pool struct {
	addrs []string
	conns []*grpc.ClientConn
}

// Dial connects to every generator and waits until each one accepts a connection,
// until ctx ends; the error names the generators that did not.
func Dial(ctx context.Context, addrs []string) (*Pool, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no load generators")
	}
	p := &Pool{addrs: addrs}
	for _, a := range addrs {
		target := "passthrough:///" + a
		if strings.HasPrefix(a, "unix:") {
			target = a // gRPC's own unix resolver: unix:PATH or unix:///PATH
		}
		conn, err := grpc.NewClient(target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.CallContentSubtype(codecName)))
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("generator %s: %w", a, err)
		}
		p.conns = append(p.conns, conn)
	}
	var down []error
	for i, conn := range p.conns {
		if err := waitReady(ctx, conn); err != nil {
			down = append(down, fmt.Errorf("generator %s: %w", addrs[i], err))
		}
	}
	if len(down) > 0 {
		p.Close()
		return nil, errors.Join(down...)
	}
	return p, nil
}

// waitReady connects, retrying as gRPC does, until the connection is up or ctx ends.
func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		st := conn.GetState()
		if st == connectivity.Ready {
			return nil
		}
		if st == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("not reachable (%s): %w", st, ctx.Err())
		}
	}
}

// Close ends every connection.
func (p *Pool) Close() {
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Size is how many generators the pool drives.
func (p *Pool) Size() int { return len(p.addrs) }

// Run has every generator run its share of spec, starting together, and returns the
// exact merge of their results and each one's (with one generator, its result as it
// is). progress, if set, is called with interval i merged from every generator once all
// have sent it. When one generator fails, the others are stopped and the error names
// it.
func (p *Pool) Run(ctx context.Context, spec load.Spec, progress func(load.Progress)) (*load.Result, []*load.Result, error) {
	if spec.Version == 0 {
		spec.Version = load.SpecVersion // a Spec written out by hand rather than by load.NewSpec
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("load spec: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := len(p.conns)
	var start time.Time
	if n > 1 {
		start = time.Now().Add(startLead)
	}
	results := make([]*load.Result, n)
	errs := make([]error, n)
	m := newIntervalMerger(n, progress)
	var wg sync.WaitGroup
	for i, conn := range p.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runOne(ctx, conn, &Plan{Load: data, Share: Share{Index: i, Of: n}, StartAt: start}, func(ev *Event) { m.add(i, ev) })
			if err != nil {
				errs[i] = fmt.Errorf("generator %s: %w", p.addrs[i], err)
				cancel()
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	if err := firstCause(errs); err != nil {
		return nil, nil, err
	}
	if n == 1 {
		return results[0], results, nil
	}
	merged, err := load.Merge(results)
	return merged, results, err
}

// runOne sends a plan and reads its events until the result, into which it puts the
// intervals that came before it.
func runOne(ctx context.Context, conn *grpc.ClientConn, plan *Plan, onInterval func(*Event)) (*load.Result, error) {
	stream, err := conn.NewStream(ctx, &serviceDesc.Streams[0], RunMethod)
	if err != nil {
		return nil, describe(err)
	}
	if err := stream.SendMsg(plan); err != nil {
		return nil, describe(err)
	}
	if err := stream.CloseSend(); err != nil {
		return nil, describe(err)
	}
	var res *load.Result
	var intervals []load.Interval
	for {
		var ev Event
		err := stream.RecvMsg(&ev)
		if err == io.EOF {
			if res == nil {
				return nil, errors.New("ended without a result")
			}
			return res, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err() // stopped by the driver, not failed
			}
			return nil, describe(err)
		}
		switch {
		case ev.Result != nil:
			if ev.Intervals != len(intervals) {
				return nil, fmt.Errorf("sent %d intervals, then a result of %d", len(intervals), ev.Intervals)
			}
			res = ev.Result
			res.Intervals = intervals
		case ev.Interval != nil:
			intervals = append(intervals, *ev.Interval)
			onInterval(&ev)
		}
	}
}

// describe turns a gRPC status into the generator's own words.
func describe(err error) error {
	if st, ok := status.FromError(err); ok {
		if st.Code() == codes.Unavailable {
			return fmt.Errorf("unreachable or gone: %s", st.Message())
		}
		return errors.New(st.Message())
	}
	return err
}

// firstCause picks the error that explains a failed run: one generator's own failure
// rather than the cancellations it caused in the others.
func firstCause(errs []error) error {
	var cancelled error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, context.Canceled) {
			if cancelled == nil {
				cancelled = err
			}
			continue
		}
		return err
	}
	return cancelled
}

// intervalMerger holds intervals until every generator has sent the same one, then
// reports their exact merge.
type intervalMerger struct {
	mu       sync.Mutex
	progress func(load.Progress)
	pending  [][]*Event
	next     int
}

func newIntervalMerger(n int, progress func(load.Progress)) *intervalMerger {
	return &intervalMerger{progress: progress, pending: make([][]*Event, n)}
}

func (m *intervalMerger) add(gen int, ev *Event) {
	if m.progress == nil {
		return
	}
	if len(m.pending) == 1 {
		// One generator: its interval is the merge.
		m.progress(load.Progress{Interval: *ev.Interval, Elapsed: ev.Elapsed, Total: ev.Total, InFlight: ev.InFlight})
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending[gen] = append(m.pending[gen], ev)
	for {
		for _, evs := range m.pending {
			if len(evs) <= m.next {
				return
			}
		}
		sets := make([][]load.Interval, len(m.pending))
		var inFlight int64
		var last *Event
		for g, evs := range m.pending {
			e := evs[m.next]
			evs[m.next] = nil // merged below; an hour of intervals need not stay
			sets[g] = []load.Interval{*e.Interval}
			inFlight += e.InFlight
			last = e
		}
		merged, err := load.MergeIntervals(sets)
		m.next++
		if err != nil || len(merged) == 0 {
			continue
		}
		m.progress(load.Progress{Interval: merged[0], Elapsed: last.Elapsed, Total: last.Total, InFlight: inFlight})
	}
}
