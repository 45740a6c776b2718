package load

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// openQueueSize bounds the sends waiting for a connection when MaxInFlight is reached;
// beyond it sends are dropped (and counted), so a dead target cannot eat the memory.
const openQueueSize = 1 << 16

// lagLimit is the send lag p99 above which an open run is flagged: the generator did not
// keep to its schedule. Go timers wake within about a millisecond, so normal lag is below.
const lagLimit = 5 * time.Millisecond

type engine struct {
	cfg    Config
	client Client
	rec    *recorder
	start  time.Time
	end    time.Time // intended end of sending; zero when the count ends the run
	sched  Schedule

	inflight, peak  atomic.Int64
	claimed         atomic.Int64
	sent            atomic.Int64
	scheduled       atomic.Int64 // intended sends after warmup, open model
	lastIntended    atomic.Int64 // ns offset
	late, dropped   atomic.Int64
	aborted, dialed atomic.Int64
	hard            context.Context // cancelled when in-flight requests must be abandoned
}

// Run drives one load run and returns what it measured. The result is returned even when
// ctx is cancelled part way (then Result.Incomplete is set and the error is ctx's).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	e := &engine{cfg: c, client: c.Client}
	if e.client == nil {
		e.client = NewHTTP1Client(ClientOptions{Dial: c.Dial, DisableKeepAlive: c.DisableKeepAlive})
	}
	if c.Open != nil {
		s, err := NewSchedule(c.Open.Schedule, c.Duration)
		if err != nil {
			return nil, err
		}
		e.sched = s
	}
	prepared, err := e.prepareAll()
	if err != nil {
		return nil, err
	}

	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	e.start = time.Now()
	if c.Duration > 0 {
		e.end = e.start.Add(c.Duration)
	}
	e.rec = newRecorder(e.start.Add(c.Warmup))

	// soft: stop sending new requests; hard: abandon those in flight. The hard stop comes
	// one timeout after the end, when every request sent in time has met its deadline.
	soft, cancelSoft := context.WithCancel(ctx)
	hard, cancelHard := context.WithCancel(ctx)
	defer cancelSoft()
	defer cancelHard()
	if !e.end.IsZero() {
		t1 := time.AfterFunc(c.Duration, cancelSoft)
		t2 := time.AfterFunc(c.Duration+c.Timeout+time.Second, cancelHard)
		defer t1.Stop()
		defer t2.Stop()
	}
	e.hard = hard

	intervals := e.startIntervals()
	switch {
	case c.Open != nil:
		done := make(chan struct{})
		go func() { // its own goroutine: the precise clock pins it to a thread
			defer close(done)
			e.runOpen(soft, prepared[0])
		}()
		<-done
	case c.Closed != nil:
		e.runClosed(soft, prepared[0])
	default:
		e.runUsers(soft, prepared)
	}
	ivs := intervals()
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	res := e.result(ivs, cpuDelta(ru0.Utime, ru1.Utime), cpuDelta(ru0.Stime, ru1.Stime))
	if ctx.Err() != nil {
		res.Incomplete = true
		return res, ctx.Err()
	}
	return res, nil
}

func cpuDelta(a, b syscall.Timeval) time.Duration {
	return time.Duration(b.Nano() - a.Nano())
}

func (e *engine) prepareAll() ([]*Prepared, error) {
	if e.cfg.Users == nil {
		p, err := e.client.Prepare(e.cfg.Request)
		return []*Prepared{p}, err
	}
	out := make([]*Prepared, len(e.cfg.Users.Tasks))
	for i, t := range e.cfg.Users.Tasks {
		p, err := e.client.Prepare(t.Request)
		if err != nil {
			return nil, fmt.Errorf("task %d (%s): %w", i, t.Name, err)
		}
		out[i] = p
	}
	return out, nil
}

// claim reserves one send against Count.
func (e *engine) claim() bool {
	return e.cfg.Count == 0 || e.claimed.Add(1) <= e.cfg.Count
}

func (e *engine) send(s Session, p *Prepared, intended time.Time) {
	if e.hard.Err() != nil {
		e.dropped.Add(1)
		return
	}
	n := e.inflight.Add(1)
	for {
		pk := e.peak.Load()
		if n <= pk || e.peak.CompareAndSwap(pk, n) {
			break
		}
	}
	t := timing{intended: intended, sent: time.Now()}
	if !intended.Before(e.rec.warmupEnd) {
		e.sent.Add(1)
	}
	var out Outcome
	t.err = s.Do(e.hard, p, t.sent.Add(e.cfg.Timeout), &out)
	t.done = time.Now()
	e.inflight.Add(-1)
	if out.Dialed {
		e.dialed.Add(1)
	}
	if t.err != nil && e.hard.Err() != nil {
		e.aborted.Add(1) // cut off by the end of the run, not by the target
		return
	}
	t.status, t.firstByte, t.bytesIn = out.Status, out.FirstByte, out.BytesIn
	e.rec.record(&t)
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, timer *time.Timer, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		timer.Stop()
		return false
	}
}

// runOpen sends at the schedule's intended times. A pool of connections grows while
// every connection is busy, up to MaxInFlight; beyond it sends queue (late) and the
// queue's overflow is dropped, each counted.
func (e *engine) runOpen(ctx context.Context, p *Prepared) {
	o := e.cfg.Open
	queue := make(chan int64, openQueueSize)
	var idle atomic.Int64
	var wg sync.WaitGroup
	workers := 0
	spawn := func() {
		workers++
		idle.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.client.NewSession()
			defer s.Close()
			for off := range queue {
				idle.Add(-1)
				e.send(s, p, e.start.Add(time.Duration(off)))
				idle.Add(1)
			}
		}()
	}
	for range o.Connections {
		spawn()
	}
	warm := e.cfg.Warmup
	clock := newPreciseClock()
	for {
		off, ok := e.sched.Next()
		if !ok || (e.cfg.Duration > 0 && off >= e.cfg.Duration) || !e.claim() {
			break
		}
		if !clock.sleepUntil(ctx, e.start.Add(off)) {
			break
		}
		if off >= warm {
			e.scheduled.Add(1)
		}
		e.lastIntended.Store(int64(off))
		if idle.Load() <= 0 {
			if workers < o.MaxInFlight {
				spawn()
			} else {
				e.late.Add(1)
			}
		}
		select {
		case queue <- int64(off):
		default:
			e.dropped.Add(1)
		}
	}
	close(queue)
	wg.Wait()
}

// runClosed keeps each connection busy back to back, optionally at an overall rate.
func (e *engine) runClosed(ctx context.Context, p *Prepared) {
	c := e.cfg.Closed
	var slot atomic.Int64
	var wg sync.WaitGroup
	for range c.Connections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := e.client.NewSession()
			defer s.Close()
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			for ctx.Err() == nil && e.claim() {
				intended := time.Now()
				if c.Rate > 0 {
					k := slot.Add(1) - 1
					intended = e.start.Add(seconds(float64(k) / c.Rate))
					if (!e.end.IsZero() && !intended.Before(e.end)) || !sleepUntil(ctx, timer, intended) {
						return
					}
				}
				e.send(s, p, intended)
			}
		}()
	}
	wg.Wait()
}

// runUsers starts users at SpawnRate; each loops: weighted task, think, repeat.
func (e *engine) runUsers(ctx context.Context, prepared []*Prepared) {
	u := e.cfg.Users
	cum := make([]int, len(u.Tasks))
	sum := 0
	for i, t := range u.Tasks {
		sum += t.Weight
		cum[i] = sum
	}
	var wg sync.WaitGroup
	spawnTimer := time.NewTimer(time.Hour)
	spawnTimer.Stop()
	for i := range u.Users {
		if u.SpawnRate > 0 && !sleepUntil(ctx, spawnTimer, e.start.Add(seconds(float64(i)/u.SpawnRate))) {
			break
		}
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(u.Seed, uint64(id)))
			s := e.client.NewSession()
			defer s.Close()
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			for it := 0; u.Iterations == 0 || it < u.Iterations; it++ {
				if ctx.Err() != nil || !e.claim() {
					return
				}
				pick := rng.IntN(sum)
				task := 0
				for cum[task] <= pick {
					task++
				}
				e.send(s, prepared[task], time.Now())
				if u.Iterations > 0 && it == u.Iterations-1 {
					return // no think after the last task
				}
				if !sleepUntil(ctx, timer, time.Now().Add(u.Think.draw(rng))) {
					return
				}
			}
		}(i)
	}
	wg.Wait()
}

func (t Think) draw(rng *rand.Rand) time.Duration {
	if t.Max <= 0 {
		return 0
	}
	if t.Exponential {
		mean := float64(t.Min+t.Max) / 2
		return time.Duration(rng.ExpFloat64() * mean)
	}
	return t.Min + time.Duration(rng.Int64N(int64(t.Max-t.Min)+1))
}

// startIntervals rotates the recorder every Interval and reports progress; the returned
// function stops it and returns every interval, the last one partial.
func (e *engine) startIntervals() func() []Interval {
	var ivs []Interval
	stop := make(chan struct{})
	done := make(chan struct{})
	every := e.cfg.Interval
	close1 := func(now time.Time, begin time.Duration) time.Duration {
		off := now.Sub(e.start)
		length := off - begin
		var rate float64
		if e.sched != nil {
			rate = e.sched.RateAt(begin + length/2)
		}
		iv := e.rec.rotate(begin, length, rate)
		ivs = append(ivs, iv)
		if e.cfg.Progress != nil {
			e.cfg.Progress(Progress{Interval: iv, Elapsed: off, Total: e.cfg.Duration, InFlight: e.inflight.Load()})
		}
		return off
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var begin time.Duration
		for {
			select {
			case now := <-tick.C:
				begin = close1(now, begin)
			case <-stop:
				if off := time.Since(e.start); off-begin > every/100 || len(ivs) == 0 {
					close1(time.Now(), begin)
				}
				return
			}
		}
	}()
	return func() []Interval {
		close(stop)
		<-done
		return ivs
	}
}

func (e *engine) result(ivs []Interval, user, sys time.Duration) *Result {
	r := e.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.total
	res := &Result{
		Model:        e.modelName(),
		Target:       e.cfg.Request.URL,
		Start:        e.start,
		Sent:         e.sent.Load(),
		Completed:    t.completed,
		Succeeded:    t.succeeded,
		Errors:       t.errs,
		BytesIn:      t.bytesIn,
		Latency:      Histogram{t.latency},
		Service:      Histogram{t.service},
		FirstByte:    Histogram{t.firstByte},
		Clamped:      t.clamped,
		Intervals:    ivs,
		StatusCodes:  map[int]int64{},
		ErrorSamples: append([]string(nil), r.samples...),
	}
	for code, n := range t.status {
		if n > 0 {
			res.StatusCodes[code] = n
		}
	}
	if e.cfg.Users != nil {
		res.Target = e.cfg.Users.Tasks[0].Request.URL
	}
	if r.lastDone.After(r.warmupEnd) {
		res.Elapsed = r.lastDone.Sub(r.warmupEnd)
		res.AchievedRate = float64(t.completed) / res.Elapsed.Seconds()
	}
	if e.sched != nil {
		span := e.cfg.Duration - e.cfg.Warmup
		if e.cfg.Duration == 0 {
			span = time.Duration(e.lastIntended.Load()) - e.cfg.Warmup
		}
		if span > 0 {
			res.RequestedRate = float64(e.scheduled.Load()) / span.Seconds()
		}
	}
	h := &res.Health
	h.PeakInFlight = e.peak.Load()
	h.Connections = e.dialed.Load()
	h.Late = e.late.Load()
	h.Dropped = e.dropped.Load()
	h.Aborted = e.aborted.Load()
	h.SendLag = Histogram{t.sendLag}
	h.CPUUser, h.CPUSystem = user, sys
	if t.completed > 0 {
		h.CPUPerRequest = (user + sys) / time.Duration(t.completed)
	}
	e.judge(res)
	return res
}

func (e *engine) modelName() string {
	switch {
	case e.cfg.Open != nil:
		return "open/" + string(e.cfg.Open.Schedule.Arrival)
	case e.cfg.Closed != nil:
		return "closed"
	}
	return "users"
}

// judge flags runs whose numbers describe the generator rather than the target.
func (e *engine) judge(res *Result) {
	h := &res.Health
	warn := func(bottleneck bool, format string, args ...any) {
		res.Warnings = append(res.Warnings, fmt.Sprintf(format, args...))
		h.Bottleneck = h.Bottleneck || bottleneck
	}
	if h.Late > 0 {
		warn(true, "%d sends waited because max in-flight (%d) was reached: raise --max-inflight or lower the rate", h.Late, e.cfg.Open.MaxInFlight)
	}
	if h.Dropped > 0 {
		warn(true, "%d intended sends were dropped (never sent)", h.Dropped)
	}
	if e.cfg.Open != nil {
		if lag := h.SendLag.Quantile(99); lag > lagLimit {
			warn(true, "send lag p99 %v exceeds %v: the generator did not keep to its schedule", lag, lagLimit)
		}
		if res.RequestedRate > 0 && res.AchievedRate < 0.9*res.RequestedRate && res.Errors.Total() == 0 {
			warn(false, "achieved rate %.1f/s is below 90%% of the requested %.1f/s", res.AchievedRate, res.RequestedRate)
		}
	}
	if res.Elapsed > 0 {
		busy := float64(h.CPUUser+h.CPUSystem) / float64(res.Elapsed) / float64(runtime.GOMAXPROCS(0))
		if busy > 0.9 {
			warn(true, "the generator's process used %.0f%% of its %d CPUs: it may have been the bottleneck", 100*busy, runtime.GOMAXPROCS(0))
		}
	}
	if res.Clamped > 0 {
		warn(false, "%d latencies exceeded %v and were recorded as %v", res.Clamped, time.Duration(HistHighest)*time.Microsecond, time.Duration(HistHighest)*time.Microsecond)
	}
	if res.Completed == 0 {
		warn(false, "no request completed after warm-up")
	}
}
