package loadgen

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
)

// startServer serves a generator on a loopback port for the test.
func startServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerOptions{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dialPool(t *testing.T, addrs ...string) *Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Dial(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A long run of many intervals arrives whole, though all its intervals together are
// more than gRPC lets one message carry (4 MiB): each came on its own as it ended, and
// the result that ends the stream carries none of them.
func TestLongRunStreamsEveryInterval(t *testing.T) {
	var served atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	defer target.Close()
	pool := dialPool(t, startServer(t))
	// 25 s in 1 ms intervals: up to 25 000 intervals, each with its two histograms.
	spec := load.NewSpec(load.Config{Request: load.Request{URL: target.URL}, Duration: 25 * time.Second, Interval: time.Millisecond,
		Open: &load.OpenModel{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: 500}, SpinWindow: -1}})
	var live atomic.Int64
	res, each, err := pool.Run(context.Background(), spec, func(load.Progress) { live.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	// What the generator's last message would have been had it carried the intervals.
	whole, err := json.Marshal(Event{Result: each[0]})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d intervals, %d requests; a result with its intervals is %.1f MiB", len(res.Intervals), res.Completed, float64(len(whole))/(1<<20))
	if len(whole) <= 4<<20 {
		t.Fatalf("the run's intervals take %d bytes, not over gRPC's 4 MiB: the test proves nothing", len(whole))
	}
	var completed int64
	for _, iv := range res.Intervals {
		completed += iv.Completed
	}
	if completed != res.Completed || res.Completed != served.Load() {
		t.Errorf("the intervals hold %d requests, the result %d, the target served %d", completed, res.Completed, served.Load())
	}
	if int(live.Load()) != len(res.Intervals) {
		t.Errorf("%d intervals reported live, %d in the result", live.Load(), len(res.Intervals))
	}
}

// A load whose in-flight requests are capped at its connections keeps to the cap
// through the generator service, and shared by two generators it keeps to it in sum: a
// target that holds every request 20 ms sees at most 3 at once at 300 req/s (about 6
// without the cap, which the uncapped run shows).
func TestInFlightCapThroughGenerators(t *testing.T) {
	var mu sync.Mutex
	var now, peak int
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now++
		peak = max(peak, now)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		now--
		mu.Unlock()
	}))
	defer target.Close()
	pool := dialPool(t, startServer(t), startServer(t))
	run := func(maxInFlight int) (int, *load.Result) {
		mu.Lock()
		peak = 0
		mu.Unlock()
		spec := load.NewSpec(load.Config{Request: load.Request{URL: target.URL}, Duration: 3 * time.Second,
			Open: &load.OpenModel{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: 300}, Connections: 3, MaxInFlight: maxInFlight, SpinWindow: -1}})
		res, _, err := pool.Run(context.Background(), spec, nil)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return peak, res
	}
	capped, res := run(3)
	t.Logf("capped at 3: the target saw at most %d at once; the generators' peaks add to %d, %d sends late", capped, res.Health.PeakInFlight, res.Health.Late)
	if capped > 3 || res.Health.PeakInFlight > 3 || res.Health.Late == 0 {
		t.Errorf("capped at 3 connections: the target saw %d at once, the generators' peaks add to %d, %d late sends; want at most 3 and late sends",
			capped, res.Health.PeakInFlight, res.Health.Late)
	}
	free, res := run(0)
	t.Logf("uncapped: the target saw at most %d at once, %d late", free, res.Health.Late)
	if free <= 3 {
		t.Errorf("uncapped, the target saw only %d at once: the capped run proves nothing", free)
	}
}

// Split shares a cap on requests in flight as it shares the connections, so that the
// shares add up to it.
func TestSplitSharesTheInFlightCap(t *testing.T) {
	for _, c := range []struct{ conns, gens int }{{10, 3}, {4, 4}, {7, 2}, {3, 2}} {
		sum, sumConns := 0, 0
		for i := 0; i < c.gens; i++ {
			cfg := load.Config{Open: &load.OpenModel{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: 100}, Connections: c.conns, MaxInFlight: c.conns}}
			if err := Split(&cfg, Share{Index: i, Of: c.gens}); err != nil {
				t.Fatal(err)
			}
			if cfg.Open.MaxInFlight < cfg.Open.Connections {
				t.Errorf("%d over %d, share %d: %d connections, cap %d", c.conns, c.gens, i, cfg.Open.Connections, cfg.Open.MaxInFlight)
			}
			sum += cfg.Open.MaxInFlight
			sumConns += cfg.Open.Connections
		}
		if sum != c.conns || sumConns != c.conns {
			t.Errorf("a cap of %d over %d generators: shares add to %d in flight, %d connections", c.conns, c.gens, sum, sumConns)
		}
	}
}

// The queue of a plan's events keeps their order, never blocks the engine, refuses
// intervals beyond maxBacklog but always takes the result.
func TestEventQueue(t *testing.T) {
	q := newEventQueue()
	for i := 0; i < maxBacklog; i++ {
		if !q.push(&Event{InFlight: int64(i), Interval: &load.Interval{}}) {
			t.Fatalf("interval %d refused below the backlog limit", i)
		}
	}
	if q.push(&Event{Interval: &load.Interval{}}) {
		t.Error("an interval beyond the backlog was taken")
	}
	if !q.push(&Event{Result: &load.Result{}, Intervals: maxBacklog}) {
		t.Error("the result was refused")
	}
	q.close()
	var got []*Event
	if err := q.drain(func(m any) error { got = append(got, m.(*Event)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != maxBacklog+1 || got[len(got)-1].Result == nil {
		t.Fatalf("drained %d events, want %d then the result", len(got), maxBacklog)
	}
	for i, ev := range got[:maxBacklog] {
		if ev.InFlight != int64(i) {
			t.Fatalf("event %d came as %d", i, ev.InFlight)
		}
	}
}
