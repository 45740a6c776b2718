package load

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// startServer serves h on a fresh loopback port until the test ends.
func startServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

const testPrSetTimerSlack = 29 // PR_SET_TIMERSLACK

// preciseSleep sleeps d with microsecond precision (time.Sleep may wake up to 1 ms late
// on an idle runtime), so that the server's delay is what the test says it is.
func preciseSleep(d time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, testPrSetTimerSlack, 1000, 0)
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, testPrSetTimerSlack, 50000, 0)
}

func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func within(got, want time.Duration, frac float64) bool {
	d := float64(got - want)
	return d <= frac*float64(want) && -d <= frac*float64(want)
}

// startDelayServer is a minimal HTTP/1.1 server that answers every request exactly
// delay after reading it (sleeping most of it, spinning the rest), so that the test
// measures the generator rather than a server's scheduling noise.
func startDelayServer(t *testing.T, delay time.Duration) string {
	t.Helper()
	return serveRaw(t, func(c net.Conn) bool {
		due := time.Now().Add(delay)
		if d := time.Until(due) - 200*time.Microsecond; d > 0 {
			preciseSleep(d)
		}
		for time.Now().Before(due) {
		}
		_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		return err == nil
	})
}

// serveRaw is a bare HTTP/1.1 server for the engine's tests and benchmarks: it reads
// each request's header lines (the tests send no bodies) and calls answer once per
// request; answer returns false to close the connection.
func serveRaw(tb testing.TB, answer func(c net.Conn) bool) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serveRawOn(tb, ln, "http", answer)
}

// serveRawOn is serveRaw on ln, whose URLs have scheme.
func serveRawOn(tb testing.TB, ln net.Listener, scheme string, answer func(c net.Conn) bool) string {
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tb.Cleanup(func() { c.Close() })
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 && !answer(c) {
						return
					}
				}
			}()
		}
	}()
	return scheme + "://" + ln.Addr().String() + "/"
}

// TestFixedDelayMedian: a server that answers in exactly 2 ms must measure as 2 ms
// above the loopback round trip (within 5%); the round trip itself, 80–100 µs on this
// 2-core VM, is 5% of 2 ms and is measured beside it rather than budgeted. The
// machine is shared, so a run spoiled by someone else's burst is retried twice; a
// generator that adds its own delay fails every attempt.
func TestFixedDelayMedian(t *testing.T) {
	if raceEnabled {
		t.Skip("a 5% timing bound means nothing under the race detector")
	}
	const delay = 2 * time.Millisecond
	url := startDelayServer(t, delay)
	// The same server with no delay gives this machine's loopback round trip (both
	// ends' wake-ups), measured beside each attempt: the generator must report the
	// server's 2 ms, not the transport under it.
	floorURL := startDelayServer(t, 0)
	var problems []string
	for attempt := 1; attempt <= 3; attempt++ {
		floor := run(t, Config{
			Request:  Request{URL: floorURL},
			Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}},
			Duration: 1500 * time.Millisecond,
			Warmup:   500 * time.Millisecond,
		}).Service.Quantile(50)
		res := run(t, Config{
			Request:  Request{URL: url},
			Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}},
			Duration: 3 * time.Second,
			Warmup:   500 * time.Millisecond,
		})
		if res.Errors.Total() != 0 || res.Succeeded < 450 {
			t.Fatalf("succeeded %d, errors %+v %v", res.Succeeded, res.Errors, res.ErrorSamples)
		}
		if r := res.RequestedRate; r < 199 || r > 201 {
			t.Errorf("requested rate %.1f, want 200", r)
		}
		if r := res.AchievedRate; r < 190 || r > 210 {
			t.Errorf("achieved rate %.1f, want about 200", r)
		}
		if len(res.Intervals) < 3 {
			t.Errorf("%d intervals over 3 s, want at least 3", len(res.Intervals))
		}
		lat, svc := res.Latency.Quantile(50), res.Service.Quantile(50)
		if lat < svc {
			t.Errorf("latency from intended time (%v) below service time (%v)", lat, svc)
		}
		t.Logf("attempt %d: p50 latency %v, service %v, send lag %v, loopback floor %v", attempt, lat, svc, res.Health.SendLag.Quantile(50), floor)
		problems = problems[:0]
		for name, p50 := range map[string]time.Duration{"latency": lat, "service": svc} {
			if p50 < delay || !within(p50-floor, delay, 0.05) {
				problems = append(problems, fmt.Sprintf("%s p50 = %v (%v above the %v loopback floor), want at least %v and within 5%% of it above the floor",
					name, p50, p50-floor, floor, delay))
			}
		}
		if len(problems) == 0 {
			return
		}
	}
	t.Error(strings.Join(problems, "; "))
}

// stallServer stops answering for stall at the start of every period, like a GC pause or
// a SIGSTOP of the target.
func stallServer(t *testing.T, period, stall time.Duration) string {
	start := time.Now()
	return startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if phase := time.Since(start) % period; phase < stall {
			time.Sleep(stall - phase)
		}
		w.Write([]byte("ok"))
	})
}

// TestStallsShowInCorrectedLatency is wrk2's demonstration: with one connection the
// stalled request holds back every request scheduled behind it. Their service times are
// short, so a generator that measures from the actual send (coordinated omission) would
// report a clean p99; measured from the intended time, the stall is in the p99.
func TestStallsShowInCorrectedLatency(t *testing.T) {
	url := stallServer(t, 2*time.Second, 300*time.Millisecond)
	res := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}, Connections: 1, MaxInFlight: 1},
		Duration: 4500 * time.Millisecond,
		Timeout:  5 * time.Second,
	})
	if res.Errors.Total() != 0 {
		t.Fatalf("errors %+v %v", res.Errors, res.ErrorSamples)
	}
	// about 60 of every 400 requests are scheduled into a stall and wait for it
	if p99 := res.Latency.Quantile(99); p99 < 200*time.Millisecond {
		t.Errorf("corrected p99 %v hides the 300 ms stalls", p99)
	}
	if p99 := res.Service.Quantile(99); p99 > 50*time.Millisecond {
		t.Errorf("service p99 %v: want low, only one request per stall waits on the wire", p99)
	}
	if res.Health.Late == 0 || !res.Health.Bottleneck {
		t.Errorf("late %d, bottleneck %v: sends held back by the in-flight cap must be counted and flagged", res.Health.Late, res.Health.Bottleneck)
	}
	if res.Health.PeakInFlight != 1 {
		t.Errorf("peak in flight %d, cap was 1", res.Health.PeakInFlight)
	}

	// Without a cap the pool grows: sends stay on time and the stall is service time too.
	res = run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 200}},
		Duration: 2500 * time.Millisecond,
		Timeout:  5 * time.Second,
	})
	if p99 := res.Latency.Quantile(99); p99 < 200*time.Millisecond {
		t.Errorf("growing pool: corrected p99 %v hides the stall", p99)
	}
	if p99 := res.Service.Quantile(99); p99 < 200*time.Millisecond {
		t.Errorf("growing pool: service p99 %v, want the stall (requests were sent on time)", p99)
	}
	if res.Health.Late != 0 || res.Health.PeakInFlight < 20 {
		t.Errorf("growing pool: late %d, peak in flight %d; want 0 late and about 60 in flight during a stall", res.Health.Late, res.Health.PeakInFlight)
	}
}

func TestPoissonRealSending(t *testing.T) {
	var served atomic.Int64
	url := startServer(t, func(w http.ResponseWriter, r *http.Request) { served.Add(1) })
	var progress []Progress
	res := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Poisson, Rate: 500, Seed: 42}},
		Duration: 2 * time.Second,
		Interval: 500 * time.Millisecond,
		Progress: func(p Progress) { progress = append(progress, p) },
	})
	if len(progress) < 4 || progress[0].Total != 2*time.Second || progress[1].Interval.AchievedRate < 300 {
		t.Errorf("progress over 2 s at 500 ms intervals: %d calls, first %+v", len(progress), progress[0])
	}
	if res.Completed != res.Sent || res.Sent != served.Load() || res.Errors.Total() != 0 {
		t.Fatalf("sent %d, completed %d, served %d, errors %+v", res.Sent, res.Completed, served.Load(), res.Errors)
	}
	if d := (res.AchievedRate - res.RequestedRate) / res.RequestedRate; d < -0.03 || d > 0.03 {
		t.Errorf("achieved %.1f/s vs requested %.1f/s", res.AchievedRate, res.RequestedRate)
	}
	if r := res.RequestedRate; r < 450 || r > 550 {
		t.Errorf("Poisson schedule at 500/s requested %.1f/s over 2 s", r)
	}
}

// inflightServer counts concurrent requests server side.
type inflightServer struct {
	now, peak, total atomic.Int64
}

func (s *inflightServer) handle(w http.ResponseWriter, r *http.Request) {
	n := s.now.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.total.Add(1)
	time.Sleep(time.Millisecond)
	s.now.Add(-1)
}

func TestClosedNeverExceedsConnections(t *testing.T) {
	var s inflightServer
	url := startServer(t, s.handle)
	const conns, count = 4, 1500
	res := run(t, Config{
		Request: Request{URL: url},
		Closed:  &ClosedModel{Connections: conns},
		Count:   count,
	})
	if res.Completed != count || s.total.Load() != count {
		t.Fatalf("completed %d, served %d, want %d", res.Completed, s.total.Load(), count)
	}
	if p := s.peak.Load(); p > conns || p < 2 {
		t.Fatalf("server saw %d requests in flight, want 2..%d", p, conns)
	}
	if res.Health.Connections != conns {
		t.Errorf("opened %d connections, want %d (keep-alive)", res.Health.Connections, conns)
	}

	// Count is what gets measured: requests during the warm-up come on top of it.
	var warm inflightServer
	url = startServer(t, warm.handle)
	res = run(t, Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: conns}, Count: 200, Warmup: 300 * time.Millisecond})
	if res.Sent != 200 || res.Completed != 200 {
		t.Errorf("with a warm-up: sent %d, completed %d after it, want 200", res.Sent, res.Completed)
	}
	if served := warm.total.Load(); served <= 200 {
		t.Errorf("server saw %d requests: the warm-up's were counted against Count", served)
	}

	// with a rate limit the closed model sends no faster than asked
	var limited inflightServer
	url = startServer(t, limited.handle)
	res = run(t, Config{
		Request:  Request{URL: url},
		Closed:   &ClosedModel{Connections: conns, Rate: 100},
		Duration: 2 * time.Second,
	})
	if n := limited.total.Load(); n < 190 || n > 201 || res.Completed != n || res.Errors.Total() != 0 {
		t.Errorf("rate-limited closed run: server saw %d, completed %d, errors %+v; want about 200 in 2 s at 100/s", n, res.Completed, res.Errors)
	}
	if p := limited.peak.Load(); p > conns {
		t.Errorf("server saw %d in flight, want at most %d", p, conns)
	}
}

func TestNoKeepAliveAndErrorKinds(t *testing.T) {
	var conns atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/fail" {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			if r.URL.Path == "/slow" {
				time.Sleep(300 * time.Millisecond)
			}
			w.Write([]byte("hello"))
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	res := run(t, Config{Request: Request{URL: base + "/"}, Closed: &ClosedModel{Connections: 2}, Count: 50, DisableKeepAlive: true})
	if res.Succeeded != 50 || conns.Load() != 50 || res.Health.Connections != 50 || res.BytesIn != 250 {
		t.Errorf("no keep-alive: ok %d, server connections %d, dialed %d, bytes %d; want 50, 50, 50, 250",
			res.Succeeded, conns.Load(), res.Health.Connections, res.BytesIn)
	}
	res = run(t, Config{Request: Request{URL: base + "/fail"}, Closed: &ClosedModel{Connections: 1}, Count: 10})
	if res.Errors.Non2xx != 10 || res.StatusCodes[503] != 10 || res.Latency.TotalCount() != 10 {
		t.Errorf("503s: errors %+v, codes %v, latencies %d", res.Errors, res.StatusCodes, res.Latency.TotalCount())
	}
	res = run(t, Config{Request: Request{URL: base + "/slow"}, Closed: &ClosedModel{Connections: 1}, Count: 2, Timeout: 50 * time.Millisecond})
	if res.Errors.Timeout != 2 {
		t.Errorf("timeouts: errors %+v %v", res.Errors, res.ErrorSamples)
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := closed.Addr().String()
	closed.Close()
	res = run(t, Config{Request: Request{URL: "http://" + addr + "/"}, Closed: &ClosedModel{Connections: 1}, Count: 3})
	if res.Errors.Refused != 3 || len(res.ErrorSamples) == 0 {
		t.Errorf("refused: errors %+v %v", res.Errors, res.ErrorSamples)
	}
}

func TestUsersThinkAndSpawn(t *testing.T) {
	var mu sync.Mutex
	arrivals := map[string][]time.Time{}
	start := time.Now()
	url := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals[r.RemoteAddr] = append(arrivals[r.RemoteAddr], time.Now())
		mu.Unlock()
	})
	const users, iterations = 3, 4
	think := Think{Min: 100 * time.Millisecond, Max: 200 * time.Millisecond}
	res := run(t, Config{
		Users: &UsersModel{Users: users, SpawnRate: 5, Think: think, Iterations: iterations, Tasks: []Task{
			{Name: "main", Weight: 3, Request: Request{URL: url + "main"}},
			{Name: "other", Weight: 1, Request: Request{URL: url + "other"}},
		}},
	})
	if res.Completed != users*iterations || len(arrivals) != users {
		t.Fatalf("completed %d over %d connections, want %d over %d", res.Completed, len(arrivals), users*iterations, users)
	}
	var firsts []time.Duration
	for addr, ts := range arrivals {
		firsts = append(firsts, ts[0].Sub(start))
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			if gap < think.Min || gap > think.Max+500*time.Millisecond {
				t.Errorf("user %s: gap %v between requests, think time is %v-%v", addr, gap, think.Min, think.Max)
			}
		}
	}
	// spawn rate 5/s: the third user starts 400 ms after the first
	lo, hi := firsts[0], firsts[0]
	for _, f := range firsts {
		lo, hi = min(lo, f), max(hi, f)
	}
	if hi-lo < 350*time.Millisecond {
		t.Errorf("first requests at %v: users started together despite a spawn rate of 5/s", firsts)
	}
}

func TestResultJSONRoundTrip(t *testing.T) {
	url := startServer(t, func(w http.ResponseWriter, r *http.Request) {})
	res := run(t, Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: 2}, Count: 300, Interval: 100 * time.Millisecond})
	var buf bytes.Buffer
	if err := WriteJSON(&buf, res); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Latency.Equals(res.Latency.Histogram) || !back.Service.Equals(res.Service.Histogram) || !back.Health.SendLag.Equals(res.Health.SendLag.Histogram) {
		t.Fatal("histograms changed through JSON")
	}
	merged := NewHistogram()
	for _, iv := range back.Intervals {
		h, err := DecodeHistogram(iv.Latency)
		if err != nil {
			t.Fatal(err)
		}
		merged.Merge(h)
	}
	if merged.TotalCount() != res.Latency.TotalCount() {
		t.Errorf("intervals hold %d latencies, total %d", merged.TotalCount(), res.Latency.TotalCount())
	}
	var table, csv bytes.Buffer
	if err := WriteTable(&table, res); err != nil || !strings.Contains(table.String(), "p99.99") {
		t.Errorf("table: %v\n%s", err, table.String())
	}
	if err := WriteCSV(&csv, res); err != nil || strings.Count(csv.String(), "\n") != len(res.Intervals)+1 {
		t.Errorf("csv: %v\n%s", err, csv.String())
	}
}

func TestRefusesOtherTargetsAndCancels(t *testing.T) {
	_, err := Run(context.Background(), Config{Request: Request{URL: "http://8.8.8.8/"}, Closed: &ClosedModel{Connections: 1}, Count: 1})
	if err == nil || !strings.Contains(err.Error(), "198.18.0.0/15") {
		t.Fatalf("non-benchmark target: %v", err)
	}
	url := startServer(t, func(w http.ResponseWriter, r *http.Request) { time.Sleep(10 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	res, err := Run(ctx, Config{Request: Request{URL: url}, Open: &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 50}}, Duration: time.Minute})
	if err == nil || res == nil || !res.Incomplete {
		t.Fatalf("cancelled run: err %v, result %v", err, res)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("cancelled run took %v to return", d)
	}
	if res.Health.Aborted == 0 {
		t.Errorf("requests cut off by cancellation not counted as aborted: %+v", res.Health)
	}
}

// TestIntervalsHoldEveryRequest: the interval series must add up to every request of
// the run, also when the last responses arrive a moment after the last tick (a sliver
// shorter than 1% of an interval used to be dropped with what completed in it; seen as
// 1199 of 1200 requests in a merge of four generators). Each run ends with responses
// 1 ms late at the 200 ms tick, so most runs put requests in such a sliver.
func TestIntervalsHoldEveryRequest(t *testing.T) {
	url := startDelayServer(t, time.Millisecond)
	for i := 0; i < 12; i++ {
		res := run(t, Config{
			Request:  Request{URL: url},
			Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 1000}},
			Duration: 400 * time.Millisecond,
			Interval: 200 * time.Millisecond,
		})
		var sum int64
		for _, iv := range res.Intervals {
			sum += iv.Completed
		}
		if sum != res.Completed || res.Completed != 400 {
			t.Fatalf("run %d: %d intervals hold %d requests; the run completed %d of 400", i+1, len(res.Intervals), sum, res.Completed)
		}
	}
}
