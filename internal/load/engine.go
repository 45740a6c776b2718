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
	ended  time.Time // when the last request finished
	sched  Schedule

	inflight, peak atomic.Int64
	claimed        atomic.Int64
	sent           atomic.Int64
	scheduled      atomic.Int64 // intended sends after warmup, open model
	lastIntended   atomic.Int64 // ns offset
	late, dropped  atomic.Int64
	// dequeued counts the late sends that left the queue for a connection, sent or
	// dropped: late less dequeued are waiting. Only a send that queues touches either.
	dequeued        atomic.Int64
	aborted, dialed atomic.Int64
	hard            context.Context // cancelled when in-flight requests must be abandoned
	// spin is the time the open loop spent waiting for send times without parking;
	// only that loop's goroutine writes it, before Run reads it.
	spin       time.Duration
	spinWindow time.Duration
	// dialWait and dialLongest are the open loop's dials that reached into the
	// measured window (see noteDial); only that loop's goroutine writes them.
	dialWait, dialLongest time.Duration
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
		e.client = NewHTTP1Client(ClientOptions{Dial: c.Dial, DisableKeepAlive: c.DisableKeepAlive, TLS: c.TLS})
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
	var raw *rawLog
	if c.RawLog != nil {
		if raw, err = newRawLog(c.RawLog); err != nil {
			return nil, err
		}
	}

	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	e.start = time.Now()
	if c.Duration > 0 {
		e.end = e.start.Add(c.Duration)
	}
	var windowEnd time.Time // a run ended by its count is measured until its last completion
	if c.Duration > 0 {
		windowEnd = e.end
	}
	e.rec = newRecorder(e.start.Add(c.Warmup), windowEnd, raw)
	if raw != nil {
		raw.run(e.start)
	}

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
		// The schedule ends the sending, not the clock: a scheduler running behind
		// still sends (late, and measured so) what was intended before the end.
		if !e.runOpenEpoll(ctx, prepared[0]) {
			e.runOpen(ctx, prepared[0])
		}
	case c.Closed != nil:
		if !e.runClosedEpoll(soft, prepared[0]) && !e.runClosedH2Epoll(soft, prepared[0]) {
			e.runClosed(soft, prepared[0])
		}
	default:
		e.runUsers(soft, prepared)
	}
	e.ended = time.Now()
	ivs := intervals()
	// before the CPU is read: writing the log is part of what the run cost
	rawStatus := e.rec.closeRaw()
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	res := e.result(ivs, cpuDelta(ru0.Utime, ru1.Utime), cpuDelta(ru0.Stime, ru1.Stime))
	if rawStatus != nil {
		res.RawLog = rawStatus
		if !rawStatus.Complete() {
			res.Warnings = append(res.Warnings, "raw log: "+rawStatus.Error)
		}
	}
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

// claim reserves one send against Count. Sends during the warm-up are free: Count is
// how many requests are measured, as with oha -n after discarded warm-up runs.
func (e *engine) claim() bool {
	if e.cfg.Count == 0 || (e.cfg.Warmup > 0 && time.Now().Before(e.rec.warmupEnd)) {
		return true
	}
	return e.claimed.Add(1) <= e.cfg.Count
}

func (e *engine) send(s Session, p *Prepared, intended time.Time) {
	if e.hard.Err() != nil {
		e.dropped.Add(1)
		return
	}
	t := e.begin(intended)
	var out Outcome
	err := s.Do(e.hard, p, t.sent.Add(e.cfg.Timeout), &out)
	e.finish(&t, &out, err)
}

// waiting is how many due sends of the open model wait for a connection.
func (e *engine) waiting() int64 { return e.late.Load() - e.dequeued.Load() }

// begin stamps the actual send and counts the request in flight.
func (e *engine) begin(intended time.Time) timing { return e.beginAt(intended, time.Now()) }

// beginAt is begin for a caller that has just read the clock.
func (e *engine) beginAt(intended, sent time.Time) timing {
	n := e.inflight.Add(1)
	for {
		pk := e.peak.Load()
		if n <= pk || e.peak.CompareAndSwap(pk, n) {
			break
		}
	}
	t := timing{intended: intended, sent: sent}
	if !intended.Before(e.rec.warmupEnd) {
		e.sent.Add(1)
	}
	return t
}

func (e *engine) finish(t *timing, out *Outcome, err error) {
	e.finishAt(t, out, err, time.Now())
}

// finishAt is finish for a caller that read the clock when the response had come.
func (e *engine) finishAt(t *timing, out *Outcome, err error, done time.Time) {
	t.done = done
	e.inflight.Add(-1)
	if out.Dialed {
		e.dialed.Add(1)
	}
	if err != nil && e.hard.Err() != nil {
		e.aborted.Add(1) // cut off by the end of the run, not by the target
		return
	}
	t.err = err
	t.status, t.firstByte, t.bytesIn, t.detail = out.Status, out.FirstByte, out.BytesIn, out.Detail
	e.rec.record(t)
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

// openPool is the open model's connections. Warm workers have an open connection and
// block reading it, so the scheduling goroutine can write a request on it and the
// response wakes the worker through the network poller: in steady state no goroutine is
// woken to send, which keeps the send at the intended time. Cold workers (no connection
// yet, or after it closed) wait for a job on their channel and dial. Sends that find
// MaxInFlight reached wait in pending, oldest first.
type openPool struct {
	mu       sync.Mutex
	warm     []*openWorker // most recently used last, so few connections stay busy
	cold     []*openWorker
	pending  []int64 // intended offsets
	workers  int
	inFlight sync.WaitGroup // dispatched or pending sends not yet finished
	exited   sync.WaitGroup
}

type openWorker struct {
	s    Session
	jobs chan int64 // intended offsets for a cold worker
	job  *openJob   // set under openPool.mu when the scheduler wrote on a warm worker
	// jobBuf holds the job w.job points to, so that sending allocates nothing.
	jobBuf openJob
}

// openJob is a request the scheduler wrote on a warm worker's connection.
type openJob struct {
	t   timing
	err error // from the write
}

// runOpen sends at the schedule's intended times; see openPool.
func (e *engine) runOpen(ctx context.Context, p *Prepared) {
	o := e.cfg.Open
	pool := &openPool{}
	stop, stopWarm := context.WithCancel(e.hard)
	defer stopWarm()
	newWorker := func() *openWorker {
		w := &openWorker{s: e.client.NewSession(), jobs: make(chan int64, 1)}
		pool.workers++
		pool.exited.Add(1)
		go e.openWorker(stop, pool, w, p)
		return w
	}
	pool.mu.Lock()
	for range o.Connections {
		pool.cold = append(pool.cold, newWorker())
	}
	pool.mu.Unlock()
	warm := e.cfg.Warmup
	clock := newPreciseClock(ctx)
	defer clock.Close()
	for {
		off, ok := e.sched.Next()
		if !ok || (e.cfg.Duration > 0 && off >= e.cfg.Duration) || !e.claim() {
			break
		}
		if off >= warm {
			e.scheduled.Add(1)
		}
		if !clock.sleepUntil(ctx, e.start.Add(off)) {
			break
		}
		e.lastIntended.Store(int64(off))
		intended := e.start.Add(off)
		woke := false
		pool.mu.Lock()
		pool.inFlight.Add(1)
		if n := len(pool.warm); n > 0 && e.hard.Err() == nil {
			w := pool.warm[n-1]
			pool.warm = pool.warm[:n-1]
			ss := w.s.(SplitSession)
			t := e.begin(intended)
			err := ss.Send(p, t.sent.Add(e.cfg.Timeout))
			w.jobBuf = openJob{t: t, err: err}
			w.job = &w.jobBuf
		} else {
			var w *openWorker
			if n := len(pool.cold); n > 0 {
				w, pool.cold = pool.cold[n-1], pool.cold[:n-1]
			} else if pool.workers < o.MaxInFlight {
				w = newWorker()
			}
			switch {
			case w != nil:
				w.jobs <- int64(off)
				woke = true
			case len(pool.pending) < openQueueSize:
				pool.pending = append(pool.pending, int64(off))
				e.late.Add(1)
			default:
				pool.inFlight.Done()
				e.dropped.Add(1)
			}
		}
		pool.mu.Unlock()
		if woke {
			// The woken worker sits in this thread's run queue; yielding hands the
			// processor over instead of stranding it while this thread sleeps.
			runtime.Gosched()
		}
	}
	pool.inFlight.Wait()
	stopWarm()
	pool.mu.Lock()
	for _, w := range pool.cold {
		close(w.jobs)
	}
	pool.cold = nil
	pool.mu.Unlock()
	pool.exited.Wait()
}

// idempotent methods may be resent after a kept-alive connection turned out closed.
func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE":
		return true
	}
	return false
}

func (e *engine) openWorker(stop context.Context, pool *openPool, w *openWorker, p *Prepared) {
	defer pool.exited.Done()
	defer w.s.Close()
	ss, split := w.s.(SplitSession)
	for {
		// cold: a job arrives on the channel and the worker sends it itself
		off, ok := <-w.jobs
		if !ok {
			return
		}
		e.send(w.s, p, e.start.Add(time.Duration(off)))
		pool.inFlight.Done()
		for {
			e.drainPending(pool, w, p)
			if !split || !ss.Ready(p) || stop.Err() != nil {
				break
			}
			ss.Idle(stop)
			pool.mu.Lock()
			pool.warm = append(pool.warm, w)
			pool.mu.Unlock()

			var out Outcome
			err := ss.Await(p, &out)

			pool.mu.Lock()
			job := w.job
			w.job = nil
			if job == nil { // the connection ended while idle, or the run is over
				for i, x := range pool.warm {
					if x == w {
						pool.warm = append(pool.warm[:i], pool.warm[i+1:]...)
						break
					}
				}
			}
			pool.mu.Unlock()
			if job == nil {
				w.s.Close()
				break
			}
			if job.err != nil {
				err = job.err
			}
			if err != nil || out.Close {
				w.s.Close()
			}
			if err != nil && out.FirstByte.IsZero() && Classify(err) == KindReset && idempotent(p.Request.Method) && e.hard.Err() == nil {
				// a kept-alive connection the server had closed: resend on a new one
				err = w.s.Do(e.hard, p, job.t.sent.Add(e.cfg.Timeout), &out)
			}
			e.finish(&job.t, &out, err)
			pool.inFlight.Done()
		}
		if stop.Err() != nil {
			return
		}
		pool.mu.Lock()
		pool.cold = append(pool.cold, w)
		pool.mu.Unlock()
	}
}

// drainPending sends the waiting (late) requests while there are any.
func (e *engine) drainPending(pool *openPool, w *openWorker, p *Prepared) {
	for {
		pool.mu.Lock()
		if len(pool.pending) == 0 {
			pool.mu.Unlock()
			return
		}
		off := pool.pending[0]
		pool.pending = pool.pending[1:]
		e.dequeued.Add(1)
		pool.mu.Unlock()
		e.send(w.s, p, e.start.Add(time.Duration(off)))
		pool.inFlight.Done()
	}
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
		iv := e.rec.rotate(begin, length, rate, e.inflight.Load(), e.waiting())
		if e.cfg.StreamIntervals {
			// Progress carries it whole; the result keeps its figures, which judging
			// the run reads (DetectSaturation), and not its histograms.
			kept := iv
			kept.Latency, kept.Service = "", ""
			ivs = append(ivs, kept)
		} else {
			ivs = append(ivs, iv)
		}
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
				// A sliver after the last tick is dropped only when nothing completed in
				// it: the intervals must add up to every request of the run.
				if off := time.Since(e.start); off-begin > every/100 || len(ivs) == 0 || e.rec.pending() {
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
		Model:                e.modelName(),
		Target:               e.cfg.Request.URL,
		Start:                e.start,
		Warmup:               e.cfg.Warmup,
		Sent:                 e.sent.Load(),
		Completed:            t.completed,
		Succeeded:            t.succeeded,
		CompletedInWindow:    r.inWindow,
		SucceededInWindow:    r.okInWindow,
		CompletedAfterWindow: r.afterWindow,
		Errors:               t.errs,
		BytesIn:              t.bytesIn,
		Latency:              Histogram{t.latency},
		Service:              Histogram{t.service},
		Answered:             Histogram{t.answered},
		Failed:               Histogram{t.failed},
		FirstByte:            Histogram{t.firstByte},
		Clamped:              t.clamped,
		Intervals:            ivs,
		StatusCodes:          map[int]int64{},
		ErrorSamples:         append([]string(nil), r.samples...),
	}
	for code, n := range t.status {
		if n > 0 {
			res.StatusCodes[code] = n
		}
	}
	if e.cfg.Users != nil {
		res.Target = e.cfg.Users.Tasks[0].Request.URL
	}
	// A timed run is measured over its window, a counted run until its last
	// completion. The rate is what completed inside the window: requests answered after
	// it are not what the target served in it, however long the run waits for them.
	switch {
	case e.cfg.Duration > 0 && e.ended.Sub(e.start) >= e.cfg.Duration:
		res.Elapsed = e.cfg.Duration - e.cfg.Warmup
	case r.lastDone.After(r.warmupEnd):
		res.Elapsed = r.lastDone.Sub(r.warmupEnd)
	}
	if res.Elapsed > 0 {
		res.AchievedRate = float64(r.inWindow) / res.Elapsed.Seconds()
	}
	if e.sched != nil {
		sendEnd := e.cfg.Duration
		if e.cfg.Duration == 0 {
			sendEnd = time.Duration(e.lastIntended.Load())
		}
		if span := sendEnd - e.cfg.Warmup; span > 0 {
			res.RequestedRate = float64(e.scheduled.Load()) / span.Seconds()
		}
		res.Saturation = DetectSaturation(res, min(sendEnd, e.cfg.Warmup+res.Elapsed))
	}
	h := &res.Health
	h.PeakInFlight = e.peak.Load()
	h.Connections = e.dialed.Load()
	h.Late = e.late.Load()
	h.Dropped = e.dropped.Load()
	h.Aborted = e.aborted.Load()
	h.SendLag = Histogram{t.sendLag}
	h.CPUUser, h.CPUSystem = user, sys
	h.SpinWait, h.SpinWindow = min(e.spin, user+sys), e.spinWindow
	h.DialWait, h.DialLongest = e.dialWait, e.dialLongest
	if t.completed > 0 {
		h.CPUPerRequest = (user + sys - h.SpinWait) / time.Duration(t.completed)
	}
	judgeConnectStall(res)
	e.judge(res)
	return res
}

// noteDial counts a dial the open loop made, and so every send due meanwhile waited
// for: the part of it inside the measured window, and its length if it reached into it.
func (e *engine) noteDial(start, end time.Time) {
	from := start
	if from.Before(e.rec.warmupEnd) {
		from = e.rec.warmupEnd
	}
	if !end.After(from) {
		return
	}
	e.dialWait += end.Sub(from)
	e.dialLongest = max(e.dialLongest, end.Sub(start))
}

// connectStallMin is the shortest dial taken for the target's doing. A connect
// completes in the kernel of the side that accepts it, so on a working path it takes
// well under a millisecond; one that takes a tenth of a second met a lost SYN (a full
// accept queue, a Service whose rules are not there yet), which the client retries
// after a second. The margin keeps a generator's own scheduling delays out of it.
const connectStallMin = 100 * time.Millisecond

// judgeConnectStall names the target when the open loop's send lag began with its
// dials waiting for the target to accept connections: the loop sends nothing while it
// dials, so such a stall, and the backlog it leaves to work off, would otherwise read
// as a generator that did not keep to its schedule. The sends' lag is counted in their
// latency, from their intended times, as any wait at the target is; the trial is the
// target's stall, not its latency at the rate. (A generator short of CPU is still
// named by its own check.)
func judgeConnectStall(res *Result) {
	h := &res.Health
	if h.SendLag.Quantile(99) <= lagLimit || h.DialLongest < connectStallMin || h.DialWait == 0 {
		return
	}
	res.markConnectStall(h.DialWait, h.DialLongest)
}

// markConnectStall records a connect stall in res's saturation evidence, which it
// makes saturated, judged or not by the backlog rules.
func (res *Result) markConnectStall(stall, longest time.Duration) {
	if res.Saturation == nil {
		res.Saturation = &Saturation{IntendedRate: res.RequestedRate, CompletedRate: res.AchievedRate, Completed: res.Completed}
	}
	s := res.Saturation
	s.ConnectStall, s.ConnectLongest = stall, longest
	s.Saturated = true
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

// judge flags runs whose numbers describe the generator rather than the target, and
// runs whose target could not keep up. The generator is blamed (Health.Bottleneck) only
// where it is the cause: its own CPU, or sends that lagged, waited or were dropped while
// the target kept up. A saturated target makes sends wait and drop too; then those are
// its doing, and said so.
func (e *engine) judge(res *Result) {
	h := &res.Health
	warn := func(bottleneck bool, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		res.Warnings = append(res.Warnings, msg)
		if bottleneck {
			h.Bottleneck = true
			h.Why = append(h.Why, msg)
		}
	}
	saturated := res.TargetSaturated()
	if saturated {
		warn(false, "%s: its latency here is that of a queue growing as long as the run lasts, not its latency at this rate", res.Saturation)
	}
	if h.Late > 0 {
		if saturated {
			warn(false, "%d sends waited because max in-flight (%d) was reached, held by the saturated target", h.Late, e.cfg.Open.MaxInFlight)
		} else {
			warn(true, "%d sends waited because max in-flight (%d) was reached: raise --max-inflight or lower the rate", h.Late, e.cfg.Open.MaxInFlight)
		}
	}
	if h.Dropped > 0 {
		warn(!saturated, "%d intended sends were dropped (never sent)", h.Dropped)
	}
	if e.cfg.Open != nil {
		if lag := h.SendLag.Quantile(99); lag > lagLimit {
			if saturated {
				warn(false, "send lag p99 %v exceeds %v while the target was saturated", lag, lagLimit)
			} else {
				warn(true, "send lag p99 %v exceeds %v: the generator did not keep to its schedule", lag, lagLimit)
			}
		}
		// a request or two in flight across the window's edges is no shortfall at a few per second
		short := (res.RequestedRate - res.AchievedRate) * res.Elapsed.Seconds()
		if !saturated && res.RequestedRate > 0 && res.AchievedRate < 0.9*res.RequestedRate && short >= 3 && res.Errors.Total() == 0 {
			why := ""
			if h.Bottleneck {
				why = ", as the generator fell behind"
			}
			warn(false, "achieved rate %.1f/s is below 90%% of the requested %.1f/s%s", res.AchievedRate, res.RequestedRate, why)
		}
	}
	if res.Elapsed > 0 {
		// spinning is waiting, not work: a generator that spins is not saturated by it
		busy := float64(h.CPUUser+h.CPUSystem-h.SpinWait) / float64(res.Elapsed) / float64(runtime.GOMAXPROCS(0))
		if busy > 0.9 {
			warn(true, "the generator's process used %.0f%% of its %d CPUs: it may have been the bottleneck", 100*busy, runtime.GOMAXPROCS(0))
		}
	}
	if f := res.Failures(); f > 0 {
		warn(false, "%d requests failed without a response; latency counts each at its time to failure (answered and failed apart in the JSON result)", f)
	}
	if res.Clamped > 0 {
		warn(false, "%d latencies exceeded %v and were recorded as %v", res.Clamped, time.Duration(HistHighest)*time.Microsecond, time.Duration(HistHighest)*time.Microsecond)
	}
	if res.Completed == 0 {
		warn(false, "no request completed after warm-up")
	}
}

// Saturation rules; a target is saturated when any holds:
//   - over the window's second half (the second half, not just its end, so that one
//     stall just before the end is not a trend), the backlog (requests due and not
//     answered, in flight or waiting for a connection) stays above what it was at the
//     window's start by at least saturationMinGrowth requests and saturationGrowth of
//     the requests intended in the window. A target that keeps up holds about rate ×
//     latency, which wanders but does not climb; one that cannot piles up the
//     difference between the intended and its served rate, every second.
//   - at least saturationMinGrowth sends wait for a connection at every boundary of the
//     window's second half: with the connections capped (MaxInFlight), a target that
//     cannot serve the rate over them queues the rest at the generator, and a queue
//     that built up in the warm-up and then holds shows here and not as growth.
//   - it failed at least saturationMinGrowth of the requests after the warm-up, and
//     saturationShed of them, as an overloaded target fails them (overloadStatus, or
//     timed out): one that sheds the excess, like Envoy past its circuit breakers'
//     limits, serves the rate intended with a steady backlog, part of it failed.
const (
	saturationMinGrowth = 10
	saturationGrowth    = 0.01
	saturationShed      = 0.01
)

// overloadStatus are the statuses a server or proxy answers with when it has more than
// it can take: too many requests, unavailable (Envoy's overflow), gateway timeout.
var overloadStatus = []int{429, 503, 504}

// shedRequests counts the requests of res that failed as an overloaded target fails
// them: an overload status, or no answer before the timeout.
func shedRequests(res *Result) int64 {
	n := res.Errors.Timeout
	for _, code := range overloadStatus {
		n += res.StatusCodes[code]
	}
	return n
}

// firstLatency is the median latency of the first interval in which anything completed.
func firstLatency(ivs []Interval) time.Duration {
	for _, iv := range ivs {
		if iv.Completed > 0 {
			return iv.LatencyP50
		}
	}
	return 0
}

// DetectSaturation judges an open-model result from its intervals' backlogs over the
// window from res.Warmup to sendEnd (the offset at which sending stopped): nil when
// fewer than two intervals fall in it.
func DetectSaturation(res *Result, sendEnd time.Duration) *Saturation {
	from, to := res.Warmup, sendEnd
	type boundary struct {
		at      time.Duration
		backlog int64
		waiting int64
		iv      *Interval
	}
	var bs []boundary
	start := boundary{} // the run's start: nothing due
	for i := range res.Intervals {
		iv := &res.Intervals[i]
		end := iv.Start + iv.Length
		tol := iv.Length / 10 // intervals close on a ticker, a little after their time
		b := boundary{end, iv.InFlight + iv.Waiting, iv.Waiting, iv}
		switch {
		case end <= from+tol:
			start = b
		case end <= to+tol:
			bs = append(bs, b)
		}
	}
	// A target that keeps up holds rate × latency, a backlog that builds up over its
	// first latency. A start earlier than that (the run's, without a warm-up) would
	// count that build-up as growth: a server answering in 240 ms at 150 req/s, with
	// room for any number of requests, was called saturated, "from 0 to 36". The
	// start is then the first boundary after one latency (that of the first requests
	// answered, which met no queue), if two boundaries are left to judge.
	if first := firstLatency(res.Intervals); start.at < first {
		for i, b := range bs {
			if b.at >= first && len(bs)-i-1 >= 2 {
				start, bs = b, bs[i+1:]
				break
			}
		}
	}
	if len(bs) < 2 {
		return nil
	}
	last := bs[len(bs)-1]
	s := &Saturation{
		BacklogFrom:   start.backlog,
		BacklogTo:     last.backlog,
		IntendedRate:  res.RequestedRate,
		CompletedRate: res.AchievedRate,
	}
	// the median of the first and the last interval in which anything completed
	for _, b := range bs {
		if b.iv.Completed > 0 {
			if s.LatencyFrom == 0 {
				s.LatencyFrom = b.iv.LatencyP50
			}
			s.LatencyTo = b.iv.LatencyP50
		}
	}
	half := start.at + (last.at-start.at)/2
	s.BacklogLow, s.WaitingLow = last.backlog, last.waiting
	for _, b := range bs {
		if b.at >= half {
			s.BacklogLow = min(s.BacklogLow, b.backlog)
			s.WaitingLow = min(s.WaitingLow, b.waiting)
		}
	}
	intended := res.RequestedRate * (last.at - start.at).Seconds()
	grew := float64(s.BacklogLow-s.BacklogFrom) >= max(saturationMinGrowth, saturationGrowth*intended)
	s.Shed, s.Completed = shedRequests(res), res.Completed
	shed := float64(s.Shed) >= max(saturationMinGrowth, saturationShed*float64(s.Completed))
	s.Overloaded = grew || shed || s.WaitingLow >= saturationMinGrowth
	s.Saturated = s.Overloaded
	return s
}
