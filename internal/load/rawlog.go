package load

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"
)

// RawLogHeader is the first line of a raw log (Config.RawLog). Each following line is
// one recorded request:
//
//	intended_ns    intended send time   ┐
//	sent_ns        actual send          │ nanoseconds since Result.Start (an absolute
//	first_byte_ns  first response byte  │ wall-clock time; the offsets themselves are
//	done_ns        completion or error  ┘ measured on the monotonic clock)
//	status         HTTP status; empty when no response header arrived
//	error_kind     none, refused, reset, timeout, non2xx, other or lookup (ErrorKind.String)
//	bytes_in       response body bytes
//	warmup         true for requests intended before Config.Warmup ends
//
// first_byte_ns is empty when no byte of a response arrived. Rows come in the order the
// requests were recorded (about completion order), not sorted. Warm-up requests are
// included, flagged, because the log is for re-analysis and the cut-off is then the
// reader's to choose; the rows with warmup=false are exactly the requests the result
// counts in Completed (its latency histograms hold those with error_kind none or
// non2xx). Requests cut off by the end of the run (Health.Aborted) and sends never
// made (Health.Dropped) were not recorded and have no row.
const RawLogHeader = "intended_ns,sent_ns,first_byte_ns,done_ns,status,error_kind,bytes_in,warmup\n"

// RawLogStatus says whether a raw log holds every recorded request.
type RawLogStatus struct {
	Rows  int64  `json:"rows"`            // rows written, warm-up included
	Lost  int64  `json:"lost,omitempty"`  // recorded requests that have no row
	Error string `json:"error,omitempty"` // why rows were lost
}

// Complete reports whether every recorded request has its row.
func (s *RawLogStatus) Complete() bool { return s.Lost == 0 && s.Error == "" }

const (
	rawBufSize = 256 << 10
	// rawBufs is the slack for a writer that stalls: 2 MiB, about 30 000 rows, a third
	// of a second at 100 000 requests per second.
	rawBufs   = 8
	rawRowMax = 192 // 4 offsets, status and bytes of 20 digits at most, and the rest
)

// rawLog turns recorded requests into rows. Recording is on the requests' path: a
// row is formatted on the recording goroutine's stack, outside any lock, and only
// copied into the shared buffer under the recorder's lock, which recording takes
// anyway. Full buffers go to one writer goroutine, so the disk is never written on the
// request path. When the writer falls behind by every buffer, rows are dropped (and
// counted) rather than waited for: waiting would put the disk's stalls into the
// latencies being measured.
type rawLog struct {
	w     io.Writer
	start time.Time

	// under recorder.mu
	cur      *rawBuf
	recorded int64
	closed   bool

	// Capacity rawBufs each, so that sends never block. Buffers may reach the writer out
	// of the order they were filled in (their hand-over is outside the lock), which only
	// adds to the rows' being in about, not exactly, completion order.
	free, full chan *rawBuf
	failed     atomic.Bool // the writer gave up: recording skips formatting
	done       chan struct{}

	// the writer goroutine's until done is closed
	written int64
	err     error
}

type rawBuf struct {
	b    []byte
	rows int64
}

// newRawLog writes the header at once, so that a writer that cannot be written to
// fails the run before it starts.
func newRawLog(w io.Writer) (*rawLog, error) {
	if _, err := io.WriteString(w, RawLogHeader); err != nil {
		return nil, fmt.Errorf("raw log: %w", err)
	}
	l := &rawLog{w: w, free: make(chan *rawBuf, rawBufs), full: make(chan *rawBuf, rawBufs), done: make(chan struct{})}
	l.cur = &rawBuf{b: make([]byte, 0, rawBufSize)}
	for range rawBufs - 1 {
		l.free <- &rawBuf{b: make([]byte, 0, rawBufSize)}
	}
	return l, nil
}

// run starts the writer; offsets are from start.
func (l *rawLog) run(start time.Time) {
	l.start = start
	go l.write()
}

func (l *rawLog) format(b []byte, t *timing, kind ErrorKind, warm bool) []byte {
	b = strconv.AppendInt(b, int64(t.intended.Sub(l.start)), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(t.sent.Sub(l.start)), 10)
	b = append(b, ',')
	if !t.firstByte.IsZero() {
		b = strconv.AppendInt(b, int64(t.firstByte.Sub(l.start)), 10)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(t.done.Sub(l.start)), 10)
	b = append(b, ',')
	if t.status != 0 {
		b = strconv.AppendInt(b, int64(t.status), 10)
	}
	b = append(b, ',')
	b = append(b, kind.String()...)
	b = append(b, ',')
	b = strconv.AppendInt(b, t.bytesIn, 10)
	if warm {
		return append(b, ",true\n"...)
	}
	return append(b, ",false\n"...)
}

// add appends a formatted row (nil after the writer failed); under recorder.mu. It
// returns a full buffer for the caller to hand to the writer once the lock is released,
// since waking the writer can take a system call.
func (l *rawLog) add(row []byte) (full *rawBuf) {
	if l.closed {
		return nil
	}
	l.recorded++
	if row == nil {
		return nil
	}
	if len(l.cur.b)+len(row) > cap(l.cur.b) {
		select {
		case next := <-l.free:
			full, l.cur = l.cur, next
		default:
			return nil // lost: counted as recorded but never written
		}
	}
	l.cur.b = append(l.cur.b, row...)
	l.cur.rows++
	return full
}

func (l *rawLog) write() {
	defer close(l.done)
	for b := range l.full {
		if l.err == nil {
			n, err := l.w.Write(b.b)
			if err == nil && n < len(b.b) {
				err = io.ErrShortWrite
			}
			if err != nil {
				l.err = err
				l.failed.Store(true)
				l.written += int64(bytes.Count(b.b[:n], []byte{'\n'}))
			} else {
				l.written += b.rows
			}
		}
		b.b, b.rows = b.b[:0], 0
		l.free <- b
	}
}

// close waits for the writer to finish the buffers it was given; recorded is how many
// rows there should be (see recorder.closeRaw).
func (l *rawLog) close(recorded int64) RawLogStatus {
	close(l.full)
	<-l.done
	st := RawLogStatus{Rows: l.written, Lost: recorded - l.written}
	switch {
	case l.err != nil:
		st.Error = fmt.Sprintf("writing failed after %d rows, the rest of the run was not logged: %v", l.written, l.err)
	case st.Lost > 0:
		st.Error = fmt.Sprintf("%d rows dropped: the writer fell more than %d MiB behind", st.Lost, rawBufs*rawBufSize>>20)
	}
	return st
}
