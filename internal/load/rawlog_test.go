package load

import (
	"bytes"
	"context"
	"encoding/csv"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// rawRow is one parsed raw log line; firstByte is -1 when the field is empty.
type rawRow struct {
	intended, sent, firstByte, done int64
	status                          string
	kind                            string
	bytesIn                         int64
	warmup                          bool
}

func parseRawLog(t *testing.T, data []byte) []rawRow {
	t.Helper()
	if !bytes.HasPrefix(data, []byte(RawLogHeader)) {
		t.Fatalf("raw log does not start with the header: %.100q", data)
	}
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	num := func(s string) int64 {
		if s == "" {
			return -1
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("raw log: %q is not an integer", s)
		}
		return n
	}
	var rows []rawRow
	for _, r := range recs[1:] {
		if len(r) != 8 || (r[7] != "true" && r[7] != "false") {
			t.Fatalf("raw log row %q", r)
		}
		rows = append(rows, rawRow{num(r[0]), num(r[1]), num(r[2]), num(r[3]), r[4], r[5], num(r[6]), r[7] == "true"})
	}
	return rows
}

// TestRawLogClosed: every recorded request has its row, the warm-up's flagged; the rows
// not flagged are exactly what the histograms hold; each row's times are in order. Both
// closed paths record: the epoll loop (keep-alive) and the goroutines (no keep-alive).
func TestRawLogClosed(t *testing.T) {
	url := startDelayServer(t, 500*time.Microsecond)
	const warmup = 100 * time.Millisecond
	for _, noKeepAlive := range []bool{false, true} {
		t.Run("no-keepalive="+strconv.FormatBool(noKeepAlive), func(t *testing.T) {
			var log bytes.Buffer
			res := run(t, Config{
				Request: Request{URL: url}, Closed: &ClosedModel{Connections: 3}, Count: 200,
				Warmup: warmup, DisableKeepAlive: noKeepAlive, RawLog: &log,
			})
			rows := parseRawLog(t, log.Bytes())
			measured := 0
			for _, r := range rows {
				if !(0 <= r.intended && r.intended <= r.sent && r.sent <= r.firstByte && r.firstByte <= r.done) {
					t.Fatalf("times out of order: %+v", r)
				}
				if r.status != "200" || r.kind != "none" || r.bytesIn != 2 {
					t.Fatalf("row %+v, want status 200, kind none, 2 bytes", r)
				}
				if r.warmup != (r.intended < int64(warmup)) {
					t.Fatalf("row %+v: warm-up flag wrong for a %v warm-up", r, warmup)
				}
				if !r.warmup {
					measured++
				}
			}
			if measured != 200 || int64(measured) != res.Latency.TotalCount() || res.Completed != 200 {
				t.Errorf("%d measured rows, histogram %d, completed %d; want 200 each", measured, res.Latency.TotalCount(), res.Completed)
			}
			if len(rows) == measured {
				t.Errorf("no warm-up rows in %d", len(rows))
			}
			if st := res.RawLog; st == nil || st.Rows != int64(len(rows)) || !st.Complete() {
				t.Errorf("status %+v, %d rows in the log", st, len(rows))
			}
		})
	}
}

// TestRawLogOpenSpacing: in an open run the intended times are the schedule's, 1/rate
// apart, whatever the sends did.
func TestRawLogOpenSpacing(t *testing.T) {
	url := startDelayServer(t, 0)
	var log bytes.Buffer
	const rate = 500
	res := run(t, Config{
		Request: Request{URL: url}, Open: &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: rate}},
		Duration: 400 * time.Millisecond, RawLog: &log,
	})
	rows := parseRawLog(t, log.Bytes())
	if int64(len(rows)) != res.Completed || len(rows) < 190 {
		t.Fatalf("%d rows, %d completed; want one each, about 200", len(rows), res.Completed)
	}
	intended := make([]int64, len(rows))
	for i, r := range rows {
		intended[i] = r.intended
		if r.sent < r.intended || r.done < r.sent {
			t.Fatalf("times out of order: %+v", r)
		}
	}
	slices.Sort(intended)
	const gap = int64(time.Second / rate)
	for i := 1; i < len(intended); i++ {
		if d := intended[i] - intended[i-1]; d < gap-1 || d > gap+1 {
			t.Fatalf("intended times %d and %d ns are %d ns apart, want %d", intended[i-1], intended[i], d, gap)
		}
	}
}

func TestRawLogRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var log bytes.Buffer
	res := run(t, Config{Request: Request{URL: "http://" + addr + "/"}, Closed: &ClosedModel{Connections: 1}, Count: 3, RawLog: &log})
	rows := parseRawLog(t, log.Bytes())
	if len(rows) != 3 || res.Errors.Refused != 3 {
		t.Fatalf("%d rows, errors %+v; want 3 refused", len(rows), res.Errors)
	}
	for _, r := range rows {
		if r.kind != "refused" || r.firstByte != -1 || r.status != "" || r.bytesIn != 0 || r.done < r.sent {
			t.Errorf("row %+v: want kind refused, no first byte, no status", r)
		}
	}
}

// failingWriter takes limit bytes, then fails like a full disk; it remembers every
// write, so that the test sees whether logging went on after the failure.
type failingWriter struct {
	mu     sync.Mutex
	limit  int
	got    bytes.Buffer
	writes int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	room := max(w.limit-w.got.Len(), 0)
	if len(p) <= room {
		return w.got.Write(p)
	}
	w.got.Write(p[:room])
	return room, &os.PathError{Op: "write", Path: "raw.csv", Err: syscall.ENOSPC}
}

// TestRawLogWriteFails: a log that cannot be written stops, says so, and leaves the
// measured result whole. The limit falls inside the second buffer written, part way
// through the run.
func TestRawLogWriteFails(t *testing.T) {
	url := startDelayServer(t, 0)
	w := &failingWriter{limit: len(RawLogHeader) + rawBufSize + 1000}
	const count = 16000 // rows of about 40 bytes: some 600 KiB
	res := run(t, Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: 2}, Count: count, RawLog: w})
	if res.Completed != count || res.Succeeded != count || res.Latency.TotalCount() != count {
		t.Fatalf("completed %d, ok %d, latencies %d: the measured result must not suffer", res.Completed, res.Succeeded, res.Latency.TotalCount())
	}
	st := res.RawLog
	if st == nil || st.Complete() || !strings.Contains(st.Error, "no space left") {
		t.Fatalf("status %+v, want the write error", st)
	}
	whole := bytes.Count(w.got.Bytes(), []byte{'\n'}) - 1 // the header's
	if st.Rows != int64(whole) || st.Lost != count-int64(whole) || whole < 1000 {
		t.Errorf("status %+v; the writer took %d whole rows of %d", st, whole, count)
	}
	if w.writes != 3 { // header, first buffer, the failing one
		t.Errorf("%d writes, want 3: logging must stop at the first failure", w.writes)
	}
	if !slices.ContainsFunc(res.Warnings, func(s string) bool { return strings.HasPrefix(s, "raw log: ") }) {
		t.Errorf("warnings %q do not mention the raw log", res.Warnings)
	}

	_, err := Run(context.Background(), Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: 1}, Count: 1, RawLog: &failingWriter{}})
	if err == nil || !strings.Contains(err.Error(), "raw log") {
		t.Errorf("a log whose header cannot be written: err %v, want the run refused", err)
	}
}

// stalledWriter takes the header, then holds every write until released, like a disk
// that stalls; it counts the rows it was given.
type stalledWriter struct {
	release chan struct{}
	writes  int
	rows    int
}

func (w *stalledWriter) Write(p []byte) (int, error) {
	if w.writes > 0 {
		<-w.release
	}
	w.writes++
	w.rows += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

// TestRawLogWriterBehind: a writer that stalls costs rows, counted, and never holds up
// the requests: all of them complete while it is stuck.
func TestRawLogWriterBehind(t *testing.T) {
	url := startDelayServer(t, 0)
	w := &stalledWriter{release: make(chan struct{})}
	const count = 80000 // rows of 40-60 bytes: more than the 2 MiB of buffers
	var completed atomic.Int64
	allDone := make(chan struct{})
	done := make(chan *Result, 1)
	go func() {
		res, _ := Run(context.Background(), Config{
			Request: Request{URL: url}, Closed: &ClosedModel{Connections: 2}, Count: count, RawLog: w,
			Interval: 20 * time.Millisecond,
			Progress: func(p Progress) {
				if completed.Add(p.Interval.Completed) == count {
					close(allDone)
				}
			},
		})
		done <- res
	}()
	select {
	case <-allDone:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%d of %d requests completed in 2 minutes: the run waits on its stalled writer", completed.Load(), count)
	}
	close(w.release)
	res := <-done
	st := res.RawLog
	if res.Completed != count || st == nil || st.Lost == 0 || st.Rows+st.Lost != count || st.Rows != int64(w.rows-1) {
		t.Fatalf("completed %d, status %+v, writer got %d rows", res.Completed, st, w.rows-1)
	}
	if !strings.Contains(st.Error, "fell more than 2 MiB behind") || !slices.Contains(res.Warnings, "raw log: "+st.Error) {
		t.Errorf("status %+v, warnings %q", st, res.Warnings)
	}
}

// TestRawLogNoAllocs: logging a request allocates nothing, buffer hand-overs and the
// writer goroutine included. (Measured here rather than over a whole run: the epoll
// loop's own waits allocate, a few objects per wait, and their number varies from run
// to run more than one allocation per request would.)
func TestRawLogNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	now := time.Now()
	l, err := newRawLog(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder(now, time.Time{}, l)
	l.run(now)
	tm := timing{intended: now.Add(time.Second), sent: now.Add(time.Second + 3*time.Microsecond), firstByte: now.Add(time.Second + 150*time.Microsecond),
		done: now.Add(time.Second + 180*time.Microsecond), status: 200, bytesIn: 612}
	const runs = 20000 // a megabyte of rows: four buffers handed to the writer
	if n := testing.AllocsPerRun(runs, func() { r.record(&tm) }); n != 0 {
		t.Errorf("%v allocations per recorded request with a raw log, want 0", n)
	}
	if st := r.closeRaw(); st.Rows != runs+1 || !st.Complete() {
		t.Errorf("status %+v, want %d rows", st, runs+1)
	}
}
