package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrival names an open-model arrival process.
type Arrival string

// Arrival processes.
const (
	Constant Arrival = "constant" // evenly spaced at Rate
	Poisson  Arrival = "poisson"  // exponential gaps with mean 1/Rate
	Steps    Arrival = "steps"    // From, From+Step, ... To, each held for Each
	Ramp     Arrival = "ramp"     // rate rises linearly from From to To over the run
)

// ScheduleSpec describes when an open model sends. Rates are requests per second.
type ScheduleSpec struct {
	Arrival Arrival       `json:"arrival"`
	Rate    float64       `json:"rate,omitempty"`
	From    float64       `json:"from,omitempty"`
	To      float64       `json:"to,omitempty"`
	Step    float64       `json:"step,omitempty"`
	Each    time.Duration `json:"each,omitempty"`
	Seed    uint64        `json:"seed,omitempty"` // Poisson: same seed, same intended times
	// Phase shifts a constant schedule's sends later by this much, so that N
	// generators at rate/N with phases i/rate send together the one schedule at rate.
	Phase time.Duration `json:"phase,omitempty"`
}

// Schedule yields intended send times as offsets from the start of a run.
type Schedule interface {
	// Next returns the next intended offset; ok is false when the schedule has ended.
	Next() (offset time.Duration, ok bool)
	// RateAt is the requested rate at offset t.
	RateAt(t time.Duration) float64
}

// Validate checks the spec; length is the run's duration (0 = unbounded, allowed only
// where the schedule has its own end).
func (s ScheduleSpec) Validate(length time.Duration) error {
	pos := func(name string, v float64) error {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("schedule %s: %s must be a positive number of requests per second, got %v", s.Arrival, name, v)
		}
		return nil
	}
	switch s.Arrival {
	case Constant, Poisson:
		return pos("rate", s.Rate)
	case Steps:
		if err := pos("from", s.From); err != nil {
			return err
		}
		if err := pos("to", s.To); err != nil {
			return err
		}
		if err := pos("step", s.Step); err != nil {
			return err
		}
		if s.To < s.From {
			return fmt.Errorf("schedule steps: to (%v) is below from (%v)", s.To, s.From)
		}
		if s.Each <= 0 {
			return fmt.Errorf("schedule steps: each must be a positive duration, got %v", s.Each)
		}
		return nil
	case Ramp:
		if !(s.From >= 0) || !(s.To >= 0) || math.IsInf(s.From, 0) || math.IsInf(s.To, 0) || s.From+s.To == 0 {
			return fmt.Errorf("schedule ramp: from and to must be non-negative rates, not both 0; got %v and %v", s.From, s.To)
		}
		if length <= 0 {
			return fmt.Errorf("schedule ramp: needs a run duration to ramp over")
		}
		return nil
	}
	return fmt.Errorf("schedule: unknown arrival %q (want constant, poisson, steps or ramp)", s.Arrival)
}

// StepsLength is how long a steps schedule takes to reach To and hold it once.
func (s ScheduleSpec) StepsLength() time.Duration {
	if s.Arrival != Steps || s.Step <= 0 || s.To < s.From {
		return 0
	}
	n := math.Floor((s.To-s.From)/s.Step+1e-9) + 1
	if s.From+(n-1)*s.Step < s.To-1e-9 {
		n++ // the last step is clipped to To
	}
	return time.Duration(n) * s.Each
}

// NewSchedule builds the schedule for spec over a run of the given length.
func NewSchedule(spec ScheduleSpec, length time.Duration) (Schedule, error) {
	if err := spec.Validate(length); err != nil {
		return nil, err
	}
	switch spec.Arrival {
	case Constant:
		return &constantSchedule{gap: 1 / spec.Rate, rate: spec.Rate, phase: spec.Phase}, nil
	case Poisson:
		return &poissonSchedule{rate: spec.Rate, rng: rand.New(rand.NewPCG(spec.Seed, 0x6d6573686d61726b))}, nil
	case Steps:
		return &stepsSchedule{spec: spec}, nil
	default:
		return &rampSchedule{a: spec.From, b: spec.To, d: length.Seconds()}, nil
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * 1e9) }

type constantSchedule struct {
	gap, rate float64
	phase     time.Duration
	k         int64
}

// Next computes k/rate rather than accumulating gaps, so rounding never drifts.
func (c *constantSchedule) Next() (time.Duration, bool) {
	t := c.phase + seconds(float64(c.k)*c.gap)
	c.k++
	return t, true
}
func (c *constantSchedule) RateAt(time.Duration) float64 { return c.rate }

type poissonSchedule struct {
	rate float64
	t    float64
	rng  *rand.Rand
}

func (p *poissonSchedule) Next() (time.Duration, bool) {
	p.t += p.rng.ExpFloat64() / p.rate
	return seconds(p.t), true
}
func (p *poissonSchedule) RateAt(time.Duration) float64 { return p.rate }

type stepsSchedule struct {
	spec ScheduleSpec
	step int64 // index of the current step
	k    int64 // requests sent in the current step
}

func (s *stepsSchedule) rateOf(step int64) float64 {
	return math.Min(s.spec.From+float64(step)*s.spec.Step, s.spec.To)
}

// Next holds To once it is reached; the run's duration ends the schedule.
func (s *stepsSchedule) Next() (time.Duration, bool) {
	each := s.spec.Each.Seconds()
	for {
		rate := s.rateOf(s.step)
		t := float64(s.k) / rate
		if t < each {
			s.k++
			return seconds(float64(s.step)*each + t), true
		}
		s.step, s.k = s.step+1, 0
	}
}
func (s *stepsSchedule) RateAt(t time.Duration) float64 {
	return s.rateOf(int64(t / s.spec.Each))
}

// rampSchedule: rate(t) = a + (b-a)t/d, so the count by t is N(t) = a t + (b-a)t²/2d and
// the k-th request is intended at the root of N(t) = k.
type rampSchedule struct {
	a, b, d float64
	k       int64
}

func (r *rampSchedule) Next() (time.Duration, bool) {
	k := float64(r.k)
	r.k++
	slope := (r.b - r.a) / r.d
	var t float64
	if k == 0 {
		t = 0
	} else if math.Abs(slope) < 1e-12 {
		t = k / r.a
	} else {
		disc := r.a*r.a + 2*slope*k
		if disc < 0 {
			return 0, false // a falling ramp that reaches 0 before the run ends
		}
		// this form avoids cancellation when slope is small
		t = 2 * k / (r.a + math.Sqrt(disc))
	}
	if t > r.d {
		return 0, false
	}
	return seconds(t), true
}
func (r *rampSchedule) RateAt(t time.Duration) float64 {
	return r.a + (r.b-r.a)*t.Seconds()/r.d
}
