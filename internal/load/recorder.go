package load

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

const maxErrorSamples = 5

// stats is one set of counters and histograms; the recorder keeps one for the totals and
// one for the current interval. latency and service hold every request that ended,
// answered or failed; the totals also keep the answered and the failed apart.
type stats struct {
	latency, service, firstByte, sendLag *hdrhistogram.Histogram
	answered, failed                     *hdrhistogram.Histogram // totals only
	completed, succeeded, bytesIn        int64
	clamped                              int64
	maxLag                               int64
	errs                                 Errors
	status                               [600]int64 // by code; other codes at 0
}

func newStats(full bool) *stats {
	s := &stats{latency: NewHistogram(), service: NewHistogram()}
	if full {
		s.firstByte, s.sendLag = NewHistogram(), NewHistogram()
		s.answered, s.failed = NewHistogram(), NewHistogram()
	}
	return s
}

func (s *stats) reset() {
	s.latency.Reset()
	s.service.Reset()
	s.completed, s.succeeded, s.bytesIn, s.clamped, s.maxLag = 0, 0, 0, 0, 0
	s.errs = Errors{}
}

// recordUS records a value in microseconds, clamping to the histogram's range.
func recordUS(h *hdrhistogram.Histogram, d time.Duration) (clamped bool) {
	v := int64(d / time.Microsecond)
	if v < HistLowest {
		v = HistLowest
	} else if v > HistHighest {
		v, clamped = HistHighest, true
	}
	_ = h.RecordValue(v) // in range by construction
	return clamped
}

// recorder collects every request's timing. One mutex serialises recording: it costs far
// less than the request itself and keeps interval rotation exact.
type recorder struct {
	mu        sync.Mutex
	warmupEnd time.Time
	total     *stats
	cur       *stats
	spare     *stats // the previous interval, being summarised outside the lock
	samples   []string
	lastDone  time.Time
	raw       *rawLog // nil without Config.RawLog

	// windowEnd closes the measured window of a timed run (zero: the window lasts until
	// the last completion). inWindow counts what completed inside the window whatever
	// its intended time, okInWindow the successful part of it, and afterWindow what
	// was intended in the window but completed after it: a target that falls behind
	// answers its backlog after the end, and those answers are not its rate.
	windowEnd                         time.Time
	inWindow, okInWindow, afterWindow int64
}

func newRecorder(warmupEnd, windowEnd time.Time, raw *rawLog) *recorder {
	return &recorder{warmupEnd: warmupEnd, windowEnd: windowEnd, total: newStats(true), cur: newStats(false), spare: newStats(false), raw: raw}
}

// timing is one request's life: intended send, actual send, first response byte, done.
type timing struct {
	intended, sent, firstByte, done time.Time
	status                          int
	bytesIn                         int64
	err                             error
	detail                          string // Outcome.Detail
}

func (r *recorder) record(t *timing) {
	kind := Classify(t.err)
	if kind == KindNone && (t.status < 200 || t.status > 299) {
		kind = KindNon2xx
	}
	lag := t.sent.Sub(t.intended)
	if r.raw != nil {
		r.recordRaw(t, kind, lag)
		return
	}
	r.mu.Lock()
	r.addAll(t, kind, lag)
	r.mu.Unlock()
}

// recordRaw is record with a raw log; apart so that the row's stack buffer costs
// nothing without one.
func (r *recorder) recordRaw(t *timing, kind ErrorKind, lag time.Duration) {
	var buf [rawRowMax]byte
	var row []byte
	if !r.raw.failed.Load() {
		row = r.raw.format(buf[:0], t, kind, t.intended.Before(r.warmupEnd))
	}
	r.mu.Lock()
	r.addAll(t, kind, lag)
	full := r.raw.add(row)
	r.mu.Unlock()
	if full != nil {
		r.raw.full <- full
	}
}

// addAll counts t in the interval and, after the warm-up, in the totals; under r.mu.
func (r *recorder) addAll(t *timing, kind ErrorKind, lag time.Duration) {
	if t.done.After(r.lastDone) {
		r.lastDone = t.done
	}
	r.add(r.cur, t, kind, lag, false)
	switch {
	case !t.done.Before(r.warmupEnd) && (r.windowEnd.IsZero() || !t.done.After(r.windowEnd)):
		r.inWindow++
		if kind == KindNone {
			r.okInWindow++
		}
	case !r.windowEnd.IsZero() && t.done.After(r.windowEnd) && !t.intended.Before(r.warmupEnd):
		r.afterWindow++
	}
	if !t.intended.Before(r.warmupEnd) {
		r.add(r.total, t, kind, lag, true)
		if len(r.samples) < maxErrorSamples {
			if t.err != nil {
				r.sample(t.err.Error())
			} else if kind != KindNone && t.detail != "" {
				r.sample(t.detail)
			}
		}
	}
}

// closeRaw hands the last rows to the raw log's writer and waits for it; nil without a
// raw log. It must come after every record call has returned: those hand buffers over
// after releasing the lock.
func (r *recorder) closeRaw() *RawLogStatus {
	l := r.raw
	if l == nil {
		return nil
	}
	r.mu.Lock()
	l.closed = true
	if len(l.cur.b) > 0 {
		l.full <- l.cur
	}
	recorded := l.recorded
	r.mu.Unlock()
	st := l.close(recorded)
	return &st
}

func (r *recorder) sample(msg string) {
	for _, s := range r.samples {
		if s == msg {
			return
		}
	}
	r.samples = append(r.samples, msg)
}

func (r *recorder) add(s *stats, t *timing, kind ErrorKind, lag time.Duration, total bool) {
	s.completed++
	if int64(lag) > s.maxLag {
		s.maxLag = int64(lag)
	}
	if total {
		recordUS(s.sendLag, lag)
	}
	if kind != KindNone {
		s.errs.add(kind, 1)
	}
	// A failed request is timed to its failure, so that a target that times out or
	// resets its slowest requests cannot show a better tail by doing so.
	latency := t.done.Sub(t.intended)
	if recordUS(s.latency, latency) {
		s.clamped++
	}
	recordUS(s.service, t.done.Sub(t.sent))
	if t.err != nil {
		if total {
			recordUS(s.failed, latency)
		}
		return // no response: no status, bytes or first byte
	}
	if total {
		recordUS(s.answered, latency)
	}
	if kind == KindNone {
		s.succeeded++
	}
	s.bytesIn += t.bytesIn
	code := t.status
	if code < 0 || code >= len(s.status) {
		code = 0
	}
	s.status[code]++
	if total && !t.firstByte.IsZero() {
		recordUS(s.firstByte, t.firstByte.Sub(t.sent))
	}
}

// pending says whether the current interval holds any request.
func (r *recorder) pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur.completed > 0
}

// rotate closes the current interval, which began at offset start from runStart; inFlight
// is how many requests were sent and not yet answered as it closed, waiting how many
// were due and not yet sent for want of a connection.
func (r *recorder) rotate(start, length time.Duration, requestedRate float64, inFlight, waiting int64) Interval {
	r.mu.Lock()
	s := r.cur
	r.cur, r.spare = r.spare, nil
	r.mu.Unlock()

	iv := Interval{
		Start:         start,
		Length:        length,
		Completed:     s.completed,
		Errors:        s.errs,
		RequestedRate: requestedRate,
		LatencyP50:    Histogram{s.latency}.Quantile(50),
		LatencyP90:    Histogram{s.latency}.Quantile(90),
		LatencyP99:    Histogram{s.latency}.Quantile(99),
		LatencyMax:    Histogram{s.latency}.Quantile(100),
		ServiceP99:    Histogram{s.service}.Quantile(99),
		SendLagMax:    time.Duration(s.maxLag),
		InFlight:      inFlight,
		Waiting:       waiting,
	}
	if length > 0 {
		iv.AchievedRate = float64(s.completed) / length.Seconds()
	}
	iv.Latency, _ = EncodeHistogram(s.latency) // cannot fail for a histogram we built
	iv.Service, _ = EncodeHistogram(s.service)
	s.reset()
	r.mu.Lock()
	r.spare = s
	r.mu.Unlock()
	return iv
}
