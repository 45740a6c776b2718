package runner

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
)

// maxFaultRetries is how often one planned trial is measured again after a fault,
// each time on a fresh bring-up. A deployment that faults again is not one the study
// can measure, and the run stops rather than loop.
const maxFaultRetries = 1

// logTailBytes is how much of a faulted process's log is kept with the trial.
const logTailBytes = 4000

// faultError ends a trial during which a process of the system under test exited. The
// trial is stored (flagged results.FlagFault) before this is returned.
type faultError struct {
	label  string
	mesh   string
	faults []results.Fault
}

func (e *faultError) Error() string {
	parts := make([]string, len(e.faults))
	for i, f := range e.faults {
		parts[i] = f.String()
	}
	return fmt.Sprintf("%s on %s: a process of the system under test exited during the trial: %s", e.label, e.mesh, strings.Join(parts, "; "))
}

// liveProcesses is the system under test as brought up: every process of the
// substrate still running. Processes that already ended (a one-shot helper) are not
// part of it.
func liveProcesses(s substrate.Substrate) []substrate.Process {
	var out []substrate.Process
	for _, p := range s.Processes() {
		if e, ok := p.(substrate.Exiting); ok {
			select {
			case <-e.Done():
				continue
			default:
			}
		}
		out = append(out, p)
	}
	return out
}

// processWatch sees processes exit while a trial runs, each with the moment it was
// seen. One goroutine per process waits on its exit, so nothing polls and the load
// generator's cores are left alone.
type processWatch struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	faults []results.Fault
}

// watchProcesses starts watching; a process that has already exited is a fault at
// once (it died between trials).
func watchProcesses(procs []substrate.Process) *processWatch {
	w := &processWatch{stop: make(chan struct{})}
	now := time.Now()
	for _, p := range procs {
		e, ok := p.(substrate.Exiting)
		if !ok {
			continue
		}
		select {
		case <-e.Done():
			w.add(p, e, now, true)
			continue
		default:
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			select {
			case <-e.Done():
				w.add(p, e, time.Now(), false)
			case <-w.stop:
			}
		}()
	}
	return w
}

func (w *processWatch) add(p substrate.Process, e substrate.Exiting, at time.Time, before bool) {
	f := results.Fault{Pod: p.Pod(), Process: p.Spec().Name, Role: string(p.Spec().Role), PID: p.PID(), At: at, Before: before,
		LogPath: p.LogPath(), LogTail: tailOf(p.LogPath(), logTailBytes)}
	if err := e.Err(); err != nil {
		f.Exit = err.Error()
	} else {
		f.Exit = "exit status 0"
	}
	w.mu.Lock()
	w.faults = append(w.faults, f)
	w.mu.Unlock()
}

// finish stops watching and returns the faults seen, earliest first.
func (w *processWatch) finish() []results.Fault {
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	sort.SliceStable(w.faults, func(i, j int) bool { return w.faults[i].At.Before(w.faults[j].At) })
	return w.faults
}

// tailOf returns the last n bytes of a file, from the start of a line.
func tailOf(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(f, n))
	if err != nil {
		return ""
	}
	s := string(b)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}
