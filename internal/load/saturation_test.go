package load

import (
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The one-thread server answers at most one request per 2 ms: 500 req/s. Below that
// the run must come out as requested with nothing flagged on the target; above it the
// achieved rate must be the server's capacity and the target, not the generator, named
// as saturated. The bounds are 5% on the rates, and a rule rather than a timing for
// the rest: the machine these run on is a shared 2-core VM, on which the generator's
// own send lag may legitimately be flagged when other work starves it, so the test
// asks only that such a flag name the generator's own cause.
func TestTargetSaturationAgainstKnownCapacity(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the generator below the rates measured here")
	}
	const service, capacity = 2 * time.Millisecond, 500.0
	url := oneThreadServer(t, service)
	cfg := func(rate float64) Config {
		return Config{
			Request:  Request{URL: url},
			Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: rate}},
			Duration: 7 * time.Second,
			Warmup:   time.Second,
		}
	}

	below := run(t, cfg(0.6*capacity))
	t.Logf("at %.0f req/s: achieved %.1f/s, %+v, warnings %q", below.RequestedRate, below.AchievedRate, below.Saturation, below.Warnings)
	if below.Saturation == nil || below.TargetSaturated() {
		t.Errorf("below capacity: saturation %+v, want judged and not saturated", below.Saturation)
	}
	// A generator starved by other work on the machine sends late and reads answers
	// late, and says so; then what completed inside the window is partly its doing (11%
	// short was seen at a load average of 16), and the bound is looser.
	tolerance := 0.05
	if below.Health.Bottleneck {
		tolerance = 0.20
		t.Logf("below capacity: the generator was starved (%q)", below.Health.Why)
	}
	if d := below.AchievedRate/below.RequestedRate - 1; d < -tolerance || d > tolerance {
		t.Errorf("below capacity: achieved %.1f/s of %.1f/s requested, want within %.0f%%", below.AchievedRate, below.RequestedRate, 100*tolerance)
	}
	for _, w := range below.Warnings {
		// nothing may blame the target, or make sends wait
		if strings.Contains(w, "target") || strings.Contains(w, "max in-flight") || strings.Contains(w, "dropped") {
			t.Errorf("below capacity: warning %q", w)
		}
	}

	above := run(t, cfg(1.4*capacity))
	t.Logf("at %.0f req/s: achieved %.1f/s, %d completed after the window, %+v, warnings %q",
		above.RequestedRate, above.AchievedRate, above.CompletedAfterWindow, above.Saturation, above.Warnings)
	if !above.TargetSaturated() {
		t.Fatalf("above capacity: not flagged as saturated: %+v", above.Saturation)
	}
	if d := above.AchievedRate/capacity - 1; d < -0.05 || d > 0.05 {
		t.Errorf("above capacity: achieved %.1f/s, want the server's capacity %.0f/s within 5%%", above.AchievedRate, capacity)
	}
	s := above.Saturation
	// 6 s at 200 req/s over capacity is 1200 requests of backlog
	if s.BacklogTo-s.BacklogFrom < 600 || s.IntendedRate != above.RequestedRate || s.CompletedRate != above.AchievedRate {
		t.Errorf("above capacity: evidence %+v", s)
	}
	if above.CompletedAfterWindow < 600 || above.Completed != above.Sent {
		t.Errorf("above capacity: %d of %d sent completed, %d of them after the window; want the backlog answered after it",
			above.Completed, above.Sent, above.CompletedAfterWindow)
	}
	if above.Health.Bottleneck {
		t.Errorf("above capacity: the generator is blamed: %q", above.Warnings)
	}
	var out strings.Builder
	if err := WriteTable(&out, above); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "TARGET SATURATED") || strings.Contains(text, "the generator did not keep to its schedule") {
		t.Errorf("the table does not name the target as saturated, or blames the generator:\n%s", text)
	}
}

// With the connections capped, as a study's fixed-rate experiment with `connections`
// caps them, a target that cannot serve the rate holds every connection and the backlog
// piles up in the generator's queue for one, not in flight. Counting only what was in
// flight, a run at 1.4× the one-thread server's capacity over 8 connections was judged
// "kept up" and the sends that waited blamed on the generator ("raise --max-inflight").
func TestTargetSaturationWithCappedConnections(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the generator below the rates measured here")
	}
	const service, capacity, conns = 2 * time.Millisecond, 500.0, 8
	url := oneThreadServer(t, service)
	below := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 0.6 * capacity}, Connections: conns, MaxInFlight: conns},
		Duration: 5 * time.Second,
		Warmup:   time.Second,
	})
	t.Logf("below capacity: achieved %.1f/s, late %d, %+v", below.AchievedRate, below.Health.Late, below.Saturation)
	if below.Saturation == nil || below.TargetSaturated() || below.Saturation.WaitingLow > 0 {
		t.Errorf("below capacity over %d connections: %+v, want judged, not saturated, nothing queued", conns, below.Saturation)
	}
	// the epoll loop and, with a Client given, the goroutine path keep their own queues
	for _, path := range []struct {
		name   string
		client Client
	}{{"epoll", nil}, {"goroutines", NewHTTP1Client(ClientOptions{})}} {
		t.Run(path.name, func(t *testing.T) {
			res := run(t, Config{
				Request:  Request{URL: url},
				Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 1.4 * capacity}, Connections: conns, MaxInFlight: conns},
				Duration: 7 * time.Second,
				Warmup:   time.Second,
				Client:   path.client,
			})
			checkSaturatedOverCappedConnections(t, res, capacity, conns)
		})
	}
}

func checkSaturatedOverCappedConnections(t *testing.T, res *Result, capacity float64, conns int64) {
	t.Helper()
	t.Logf("achieved %.1f/s, late %d, peak in flight %d, %+v, warnings %q",
		res.AchievedRate, res.Health.Late, res.Health.PeakInFlight, res.Saturation, res.Warnings)
	if res.Health.PeakInFlight > conns {
		t.Fatalf("peak in flight %d over the cap of %d connections", res.Health.PeakInFlight, conns)
	}
	if !res.TargetSaturated() {
		t.Fatalf("not flagged as saturated: %+v", res.Saturation)
	}
	s := res.Saturation
	// 6 s at 200 req/s over capacity is 1200 requests of backlog, nearly all waiting
	if s.BacklogTo-s.BacklogFrom < 600 || s.WaitingLow < 300 {
		t.Errorf("evidence %+v: want the backlog grown by the sends waiting for a connection", s)
	}
	if d := res.AchievedRate/capacity - 1; d < -0.05 || d > 0.05 {
		t.Errorf("achieved %.1f/s, want the server's capacity %.0f/s within 5%%", res.AchievedRate, capacity)
	}
	if res.Health.Bottleneck {
		t.Errorf("the generator is blamed: %q", res.Health.Why)
	}
	last := res.Intervals[len(res.Intervals)-1]
	var csvOut strings.Builder
	if err := WriteCSV(&csvOut, res); err != nil {
		t.Fatal(err)
	}
	header := strings.SplitN(csvOut.String(), "\n", 2)[0]
	if !strings.HasSuffix(header, ",in_flight,waiting") || last.InFlight > conns {
		t.Errorf("CSV header %q, last interval in flight %d waiting %d", header, last.InFlight, last.Waiting)
	}
}

// A target that sheds what it cannot take, answering 503 at once past a queue of 50
// (as Envoy does past its circuit breakers), completes every request intended with a
// backlog that stops growing after the warm-up. Judged by its backlog alone, a run at
// 1.4× its capacity "kept up" with 30% of its requests failed; it saturated.
func TestTargetSaturationWhenTheTargetSheds(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the generator below the rates measured here")
	}
	const service, capacity, queue = 2 * time.Millisecond, 500.0, 50
	url := oneThreadServerShedding(t, service, queue)
	res := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 1.4 * capacity}},
		Duration: 6 * time.Second,
		Warmup:   time.Second,
	})
	t.Logf("achieved %.1f/s, succeeded %d of %d, codes %v, %+v", res.AchievedRate, res.Succeeded, res.Completed, res.StatusCodes, res.Saturation)
	s := res.Saturation
	if !res.TargetSaturated() || s.BacklogLow-s.BacklogFrom >= saturationMinGrowth {
		t.Fatalf("%+v: want saturated with a backlog that did not grow", s)
	}
	// it answers 503 to what it cannot serve: about 200 of the 700 req/s
	if share := float64(s.Shed) / float64(s.Completed); s.Shed != res.StatusCodes[503] || share < 0.2 || share > 0.4 {
		t.Errorf("shed %d of %d (503s: %d), want about 2/7", s.Shed, s.Completed, res.StatusCodes[503])
	}
	if !strings.Contains(s.String(), "failed as an overloaded target fails them") {
		t.Errorf("evidence %q does not name the failures", s)
	}
	// the same server below its capacity sheds nothing and is not flagged
	below := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 0.6 * capacity}},
		Duration: 4 * time.Second,
		Warmup:   time.Second,
	})
	if below.TargetSaturated() || below.Saturation.Shed != 0 {
		t.Errorf("below capacity: %+v, want kept up with nothing shed", below.Saturation)
	}
}

// DetectSaturation's second rule, on intervals written out: a backlog that stopped
// growing after the warm-up, with sends queued for a connection at every interval's
// end through the window's second half, is a target that did not serve the rate over
// its connections; the same backlog with nothing queued is a slow target keeping up,
// and a queue at one interval's end only is a burst.
func TestSaturationFromSendsWaitingThroughout(t *testing.T) {
	res := func(waiting ...int64) *Result {
		r := &Result{Warmup: time.Second, RequestedRate: 300, AchievedRate: 300}
		r.Intervals = append(r.Intervals, Interval{Start: 0, Length: time.Second, Completed: 300, InFlight: 32, Waiting: waiting[0]})
		for i, w := range waiting[1:] {
			r.Intervals = append(r.Intervals, Interval{Start: time.Duration(i+1) * time.Second, Length: time.Second, Completed: 300, InFlight: 32, Waiting: w})
		}
		return r
	}
	for _, c := range []struct {
		name    string
		waiting []int64
		want    bool
	}{
		{"queued throughout", []int64{600, 610, 590, 605, 600, 598, 602}, true},
		{"nothing queued", []int64{0, 0, 0, 0, 0, 0, 0}, false},
		{"a burst at one end", []int64{0, 0, 0, 0, 0, 40, 0}, false},
		{"a few queued now and then", []int64{5, 3, 6, 2, 4, 7, 3}, false},
	} {
		s := DetectSaturation(res(c.waiting...), 7*time.Second)
		if s == nil || s.Saturated != c.want {
			t.Errorf("%s: %+v, want saturated %v", c.name, s, c.want)
		}
	}
}

// A target that holds some requests past the client's timeout must show them in the
// latency over all requests, at their time to failure, and apart from the answered
// ones: leaving them out made a target that times out its slowest requests look faster.
func TestTransportFailuresInLatencyAtTimeToFailure(t *testing.T) {
	const timeout, hang = 200 * time.Millisecond, time.Second
	var n atomic.Int64
	url := serveRaw(t, func(c net.Conn) bool {
		if n.Add(1)%5 == 0 {
			time.Sleep(hang) // the client gives up first
			return false
		}
		_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		return err == nil
	})
	res := run(t, Config{
		Request:  Request{URL: url},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 100}},
		Duration: 2 * time.Second,
		Timeout:  timeout,
	})
	failed, answered, all := res.Failed.TotalCount(), res.Answered.TotalCount(), res.Latency.TotalCount()
	t.Logf("completed %d: answered %d, failed %d (%+v); all p50 %v p90 %v max %v; failed min %v max %v",
		res.Completed, answered, failed, res.Errors, res.Latency.Quantile(50), res.Latency.Quantile(90), res.Latency.Quantile(100),
		time.Duration(res.Failed.Min())*time.Microsecond, res.Failed.Quantile(100))
	if failed == 0 || failed != res.Errors.Timeout || failed != res.Failures() {
		t.Fatalf("failed latencies %d, timeouts %d, failures %d: want one latency per timeout", failed, res.Errors.Timeout, res.Failures())
	}
	if answered != res.Succeeded || all != res.Completed || all != answered+failed {
		t.Errorf("latencies: all %d, answered %d, failed %d; completed %d, succeeded %d", all, answered, failed, res.Completed, res.Succeeded)
	}
	// each failure is timed to its timeout (the engine checks deadlines every few ms)
	if lo := time.Duration(res.Failed.Min()) * time.Microsecond; lo < timeout || res.Failed.Quantile(100) > timeout+hang/2 {
		t.Errorf("failures timed %v to %v, want from the %v timeout", lo, res.Failed.Quantile(100), timeout)
	}
	// a fifth of the requests failed at 200 ms: the tail of all requests shows them,
	// the answered ones alone do not
	if res.Latency.Quantile(90) < timeout || res.Answered.Quantile(90) >= timeout {
		t.Errorf("p90 of all requests %v, of answered %v: want the failures in the first only", res.Latency.Quantile(90), res.Answered.Quantile(90))
	}
	var out strings.Builder
	if err := WriteTable(&out, res); err != nil {
		t.Fatal(err)
	}
	if text := out.String(); !strings.Contains(text, "failed (to failure)") || !strings.Contains(text, "without a response") {
		t.Errorf("the table does not show the failures apart:\n%s", text)
	}
}

// Without a warm-up the backlog starts from nothing, and a target that keeps up builds
// its steady rate × latency over the first latency: that is not growth. A server with
// room for every request, answering in 200 ms, at 100 req/s holds about 20; `meshmark
// load` (no warm-up by default) called a 240 ms server at 150 req/s saturated, "from 0
// to 36". The one-thread server above its capacity must still be flagged from a cold
// start.
func TestNoWarmupSlowTargetKeepingUpIsNotSaturated(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the generator below the rates measured here")
	}
	slow := run(t, Config{
		Request:  Request{URL: startDelayServer(t, 200*time.Millisecond)},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 100}},
		Duration: 4 * time.Second,
	})
	t.Logf("slow target keeping up: achieved %.1f/s, %+v", slow.AchievedRate, slow.Saturation)
	if s := slow.Saturation; s == nil || s.Saturated || s.BacklogFrom < 10 {
		t.Errorf("a 200 ms target at 100 req/s with no warm-up: %+v, want judged from its steady backlog (about 20) and not saturated", s)
	}

	const service, capacity = 2 * time.Millisecond, 500.0
	over := run(t, Config{
		Request:  Request{URL: oneThreadServer(t, service)},
		Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 1.4 * capacity}},
		Duration: 4 * time.Second,
	})
	t.Logf("over capacity from a cold start: achieved %.1f/s, %+v", over.AchievedRate, over.Saturation)
	if !over.TargetSaturated() {
		t.Errorf("the one-thread server at 1.4× its capacity with no warm-up: %+v, want saturated", over.Saturation)
	}
}

// A target that is slow to accept connections stalls the open model's loop, which
// dials on itself: the sends due meanwhile go late. That is the target's doing, and
// must be named so, not blamed on the generator. The stall is real: a listener whose
// accept queue holds one connection (backlog 0) and which accepts nothing after its
// first connection until the gate opens, so the kernel drops further SYNs and the
// client retries after its one-second retransmission timeout, as a Service whose
// rules a node has not programmed yet lets a SYN go unanswered.
func TestConnectStallNamesTheTargetNotTheGenerator(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the generator below the rate measured here")
	}
	answer := func(c net.Conn) bool {
		time.Sleep(20 * time.Millisecond) // 150 req/s then needs about three connections
		_, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		return err == nil
	}
	cfg := func(url string) Config {
		return Config{
			Request: Request{URL: url},
			// eight connections serve 400 req/s: enough to catch up once the gate opens
			Open:     &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 150}, MaxInFlight: 8},
			Duration: 3 * time.Second,
			Warmup:   500 * time.Millisecond,
		}
	}

	gate := make(chan struct{})
	url := serveRawOn(t, gatedListener(t, gate), "http", answer)
	loops := openEpollRuns.Load()
	time.AfterFunc(700*time.Millisecond, func() { close(gate) })
	res := run(t, cfg(url))
	t.Logf("stalled: achieved %.1f/s, dials %v (longest %v), lag p99 %v, %+v, warnings %q",
		res.AchievedRate, res.Health.DialWait, res.Health.DialLongest, res.Health.SendLag.Quantile(99), res.Saturation, res.Warnings)
	if openEpollRuns.Load() == loops {
		t.Fatal("the open model's epoll loop did not run; this test is about its dials")
	}
	if !res.TargetSaturated() || res.Saturation.ConnectStall < 200*time.Millisecond || res.Saturation.ConnectLongest < connectStallMin {
		t.Errorf("the stalled connect is not named as the target's: %+v", res.Saturation)
	}
	if res.Health.Bottleneck {
		t.Errorf("the generator is blamed for the target's stall: %q", res.Health.Why)
	}
	var out strings.Builder
	if err := WriteTable(&out, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "new connections the target was slow to accept") || strings.Contains(out.String(), "did not keep to its schedule") {
		t.Errorf("the text output does not name the target's stall:\n%s", out.String())
	}

	stalled := res

	// the control: the same listener, open from the start
	open := make(chan struct{})
	close(open)
	res = run(t, cfg(serveRawOn(t, gatedListener(t, open), "http", answer)))
	if res.Health.DialLongest >= connectStallMin || res.Saturation == nil || res.Saturation.ConnectStall > 0 || res.TargetSaturated() {
		t.Errorf("control: dials %v (longest %v), %+v, warnings %q", res.Health.DialWait, res.Health.DialLongest, res.Saturation, res.Warnings)
	}

	// two generators of one trial (pods on a cluster), one of which met the stall:
	// their merged result keeps it, which the backlogs summed cannot show
	merged, err := Merge([]*Result{res, stalled})
	if err != nil {
		t.Fatal(err)
	}
	if !merged.TargetSaturated() || merged.Saturation.ConnectStall != stalled.Saturation.ConnectStall || merged.Health.Bottleneck {
		t.Errorf("merged: %+v, generator blamed %v", merged.Saturation, merged.Health.Bottleneck)
	}
}

// gatedListener listens on loopback with an accept queue of one connection, and
// accepts its first connection at once and the others once gate is closed, from when
// its queue is of the usual length.
func gatedListener(t *testing.T, gate <-chan struct{}) net.Listener {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "gated listener")
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	return &gated{Listener: ln, gate: gate}
}

type gated struct {
	net.Listener
	gate     <-chan struct{}
	accepted int // Accept is called from one goroutine
}

func (g *gated) Accept() (net.Conn, error) {
	if g.accepted == 1 {
		<-g.gate
		// from now on an ordinary listener: a queue that holds one connection would
		// go on dropping the SYNs of the connections the generator opens to catch up
		if raw, err := g.Listener.(*net.TCPListener).SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) { _ = unix.Listen(int(fd), 128) })
		}
	}
	g.accepted++
	return g.Listener.Accept()
}
