package load

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestWakeEstimateLearnsHighQuantile(t *testing.T) {
	w := newWakeEstimate(0)
	if w.Window() != spinStart {
		t.Fatalf("before any wake-up: window %v, want %v", w.Window(), spinStart)
	}
	// 99 % of wake-ups within 40 µs, 1 % at 5 ms: the window follows the 99th
	// percentile, not the outliers, and the outliers do not drag it to spinMax.
	for i := range 1000 {
		late := 40 * time.Microsecond
		if i%100 == 99 {
			late = 5 * time.Millisecond
		}
		w.observe(late)
	}
	if got, want := w.Window(), 50*time.Microsecond; got != want {
		t.Errorf("window %v, want %v (p99 40µs plus a quarter)", got, want)
	}
	// a machine that got slower: the window follows within wakeSamples wake-ups
	for range wakeSamples {
		w.observe(300 * time.Microsecond)
	}
	if got, want := w.Window(), 375*time.Microsecond; got != want {
		t.Errorf("after slow wake-ups: window %v, want %v", got, want)
	}
	for range wakeSamples {
		w.observe(10 * time.Second)
	}
	if w.Window() != spinMax {
		t.Errorf("window %v, want it capped at %v", w.Window(), spinMax)
	}
	for range 2 * wakeSamples {
		w.observe(-time.Microsecond) // a clock step backwards counts as on time
	}
	if w.Window() != spinMin {
		t.Errorf("window %v, want the floor %v", w.Window(), spinMin)
	}
}

func TestWakeEstimateFixed(t *testing.T) {
	for spin, want := range map[time.Duration]time.Duration{-1: 0, 70 * time.Microsecond: 70 * time.Microsecond} {
		w := newWakeEstimate(spin)
		for range 2 * wakeSamples {
			w.observe(time.Millisecond)
		}
		if w.Window() != want {
			t.Errorf("SpinWindow %v: window %v, want %v", spin, w.Window(), want)
		}
	}
}

// TestOpenLoopSpinsOnlyWhenAllowed: with the learnt window the open loop spins before
// sends and reports it apart from the CPU per request; with spinning off it never does.
func TestOpenLoopSpinsOnlyWhenAllowed(t *testing.T) {
	url := startShapeServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false)
	for _, spin := range []time.Duration{0, -1} {
		before := openEpollRuns.Load()
		res := run(t, Config{Request: Request{URL: url}, Duration: 500 * time.Millisecond,
			Open: &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 2000}, SpinWindow: spin}})
		if openEpollRuns.Load() == before {
			t.Fatalf("spin %v: the open model's event loop did not run", spin)
		}
		h := res.Health
		if res.Succeeded < 900 {
			t.Errorf("spin %v: %d succeeded, want about 1000", spin, res.Succeeded)
		}
		if spin < 0 && (h.SpinWait != 0 || h.SpinWindow != 0) {
			t.Errorf("spinning off: spun %v with window %v", h.SpinWait, h.SpinWindow)
		}
		if spin == 0 {
			if h.SpinWait <= 0 || h.SpinWindow < spinMin || h.SpinWindow > spinMax {
				t.Errorf("spinning learnt: spun %v with window %v", h.SpinWait, h.SpinWindow)
			}
			if cpu := h.CPUUser + h.CPUSystem; h.CPUPerRequest*time.Duration(res.Completed) > cpu-h.SpinWait+time.Millisecond {
				t.Errorf("CPU per request %v × %d includes the %v spent spinning (cpu %v)", h.CPUPerRequest, res.Completed, h.SpinWait, cpu)
			}
		}
	}
}

// TestIdleAfterTheRunEndedStillWakesAwait: the open model's warm worker looks whether
// the run is over, then calls Idle and waits in Await. A run that ends in between has
// already fired the connection's watcher, whose past deadline Idle clears; Await must
// still return at once, or the run waits for ever on an idle connection (seen once in
// CI: TestOpenPathsAgreeAtTheCap waited 31 minutes, its worker in Await and the server
// waiting for a request).
func TestIdleAfterTheRunEndedStillWakesAwait(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }))
	defer srv.Close()
	c := NewHTTP1Client(ClientOptions{})
	p, err := c.Prepare(Request{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSession()
	defer s.Close() // unblocks an Await that did not return
	ss := s.(SplitSession)
	var out Outcome
	if err := s.Do(t.Context(), p, time.Now().Add(5*time.Second), &out); err != nil || out.Status != 200 {
		t.Fatalf("first request: %+v, %v", out, err)
	}
	run, end := context.WithCancel(t.Context())
	ss.Idle(run) // the watcher of this run
	end()
	time.Sleep(50 * time.Millisecond) // the watcher fires, in a goroutine of its own
	ss.Idle(run)                      // the same run: no new watcher
	done := make(chan error, 1)
	go func() { done <- ss.Await(p, &out) }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("Await returned a response nobody asked for: %+v", out)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Await still waiting 5 s after the run ended")
	}
}
