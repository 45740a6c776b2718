package load

import (
	"math"
	"testing"
	"time"
)

func intended(t *testing.T, spec ScheduleSpec, length time.Duration, n int) []time.Duration {
	t.Helper()
	s, err := NewSchedule(spec, length)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	for len(out) < n {
		off, ok := s.Next()
		if !ok || (length > 0 && off >= length) {
			break
		}
		out = append(out, off)
	}
	return out
}

func TestPoissonScheduleRateAndShape(t *testing.T) {
	const rate, n = 1000.0, 20000
	for _, seed := range []uint64{1, 2, 3} {
		ts := intended(t, ScheduleSpec{Arrival: Poisson, Rate: rate, Seed: seed}, 0, n)
		if len(ts) != n {
			t.Fatalf("got %d intended times, want %d", len(ts), n)
		}
		got := float64(n) / ts[n-1].Seconds()
		if math.Abs(got-rate)/rate > 0.02 {
			t.Errorf("seed %d: mean rate %.1f, want within 2%% of %.0f", seed, got, rate)
		}
		// exponential gaps have a coefficient of variation of 1; even spacing has 0
		var sum, sumSq float64
		prev := time.Duration(0)
		for _, off := range ts {
			if off < prev {
				t.Fatalf("seed %d: intended times go backwards", seed)
			}
			g := (off - prev).Seconds()
			sum, sumSq, prev = sum+g, sumSq+g*g, off
		}
		mean := sum / n
		cv := math.Sqrt(sumSq/n-mean*mean) / mean
		if math.Abs(cv-1) > 0.05 {
			t.Errorf("seed %d: gap coefficient of variation %.3f, want about 1", seed, cv)
		}
	}
	a := intended(t, ScheduleSpec{Arrival: Poisson, Rate: rate, Seed: 7}, 0, 100)
	b := intended(t, ScheduleSpec{Arrival: Poisson, Rate: rate, Seed: 7}, 0, 100)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed gave different schedules")
		}
	}
}

func TestConstantSchedule(t *testing.T) {
	ts := intended(t, ScheduleSpec{Arrival: Constant, Rate: 3}, time.Second, 100)
	want := []time.Duration{0, 333333333, 666666666}
	if len(ts) != len(want) {
		t.Fatalf("got %v, want %v", ts, want)
	}
	for i := range ts {
		if d := ts[i] - want[i]; d < -1 || d > 1 {
			t.Fatalf("got %v, want %v", ts, want)
		}
	}
	// no drift over many requests
	ts = intended(t, ScheduleSpec{Arrival: Constant, Rate: 7}, 0, 70001)
	if ts[70000] != 10000*time.Second {
		t.Fatalf("request 70000 at 7/s intended at %v, want 10000s", ts[70000])
	}
}

func TestStepsSchedule(t *testing.T) {
	spec := ScheduleSpec{Arrival: Steps, From: 10, To: 35, Step: 10, Each: time.Second}
	if got := spec.StepsLength(); got != 4*time.Second {
		t.Fatalf("steps length %v, want 4s (10, 20, 30, 35)", got)
	}
	ts := intended(t, spec, 5*time.Second, 1000)
	perSecond := make([]int, 5)
	for _, off := range ts {
		perSecond[int(off/time.Second)]++
	}
	want := []int{10, 20, 30, 35, 35}
	for i := range want {
		if perSecond[i] != want[i] {
			t.Fatalf("requests per second %v, want %v", perSecond, want)
		}
	}
}

func TestRampSchedule(t *testing.T) {
	ts := intended(t, ScheduleSpec{Arrival: Ramp, From: 0, To: 200}, 10*time.Second, 100000)
	// N(t) = 10 t^2 over 10 s: 1000 in total, 250 in the first half
	if n := len(ts); n < 999 || n > 1001 {
		t.Fatalf("ramp 0->200/s over 10s sent %d, want 1000", n)
	}
	half := 0
	for _, off := range ts {
		if off < 5*time.Second {
			half++
		}
	}
	if half < 249 || half > 251 {
		t.Fatalf("first half of ramp sent %d, want 250", half)
	}
	down := intended(t, ScheduleSpec{Arrival: Ramp, From: 100, To: 0}, 2*time.Second, 100000)
	if n := len(down); n < 99 || n > 101 {
		t.Fatalf("ramp 100->0/s over 2s sent %d, want 100", n)
	}
}

func TestScheduleValidate(t *testing.T) {
	bad := []ScheduleSpec{
		{Arrival: Constant},
		{Arrival: Poisson, Rate: math.Inf(1)},
		{Arrival: Steps, From: 10, To: 5, Step: 1, Each: time.Second},
		{Arrival: Steps, From: 1, To: 5, Step: 1},
		{Arrival: Ramp, From: 0, To: 0},
		{Arrival: "burst", Rate: 1},
	}
	for _, s := range bad {
		if err := s.Validate(time.Second); err == nil {
			t.Errorf("%+v: accepted", s)
		}
	}
}
