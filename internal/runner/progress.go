package runner

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/study"
)

// progress is the live display: which phase, mesh, repeat and experiment is running,
// the current rate and p99, and an estimate of the time left.
type progress struct {
	w           io.Writer
	interactive bool
	mu          sync.Mutex
	start       time.Time
	planned     time.Duration // estimated total
	spent       time.Duration // planned load time of finished load runs
	current     time.Duration // planned load time of the running one
	head        string
	lastPrint   time.Time
}

func newProgress(w io.Writer, interactive bool, planned time.Duration) *progress {
	return &progress{w: w, interactive: interactive, start: time.Now(), planned: planned}
}

func (p *progress) printf(format string, args ...any) {
	if p.w == nil {
		return
	}
	if p.interactive {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, format, args...)
}

func (p *progress) phase(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.printf("[%s] %s\n", p.clock(), s)
}

func (p *progress) note(s string) { p.phase(s) }

func (p *progress) begin(t *study.Trial, label string, length time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = length
	p.head = fmt.Sprintf("%s · repeat %d · %s", t.Mesh.Name, t.Repeat+1, label)
	p.printf("[%s] run  %s\n", p.clock(), p.head)
}

func (p *progress) update(pr load.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.interactive && time.Since(p.lastPrint) < 5*time.Second {
		return
	}
	p.lastPrint = time.Now()
	iv := pr.Interval
	line := fmt.Sprintf("[%s]      %s · %4.0fs · %7.0f req/s · p99 %8s · errors %d · in flight %d · ETA %s",
		p.clock(), p.head, pr.Elapsed.Seconds(), iv.AchievedRate, iv.LatencyP99.Round(time.Microsecond),
		iv.Errors.Total(), pr.InFlight, p.eta(pr.Elapsed))
	if p.interactive {
		p.printf("%s", line)
	} else {
		p.printf("%s\n", line)
	}
}

func (p *progress) end(res *load.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spent += p.current
	p.current = 0
	sat := ""
	if res.TargetSaturated() {
		sat = " · TARGET SATURATED"
	}
	p.printf("[%s]      done: %.0f req/s achieved, p50 %s, p99 %s, errors %d%s\n", p.clock(),
		res.AchievedRate, res.Latency.Quantile(50).Round(time.Microsecond),
		res.Latency.Quantile(99).Round(time.Microsecond), res.Errors.Total(), sat)
}

func (p *progress) done() {
	p.phase(fmt.Sprintf("all trials finished in %s", time.Since(p.start).Round(time.Second)))
}

func (p *progress) clock() string {
	d := time.Since(p.start).Round(time.Second)
	return fmt.Sprintf("%02d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

// eta scales the load time left in the plan by the run's pace so far: wall time per
// second of planned load, which also pays for bring-ups, checks and searches that the
// plan's arithmetic leaves out. Early on, that pace is a second of bring-up over a
// fraction of a second of load, and taken alone it promised hours for a ten-minute run;
// so the pace starts from the plan's own (one) as if a tenth of the plan had run at it,
// and the run's measured pace takes over as its load time grows.
func (p *progress) eta(inTrial time.Duration) string {
	if p.planned <= 0 {
		return "?"
	}
	done := p.spent + min(inTrial, p.current)
	prior := float64(p.planned) / 10
	pace := (float64(time.Since(p.start)) + prior) / (float64(done) + prior)
	left := time.Duration(pace * float64(max(p.planned-done, 0)))
	return strings.TrimSuffix(left.Round(time.Second).String(), "0s")
}

// estimate is the planned load time of the whole study.
func (r *runner) estimate() time.Duration { return loadTime(r.plan) }

// PlannedLoadTime is the time a study's plan spends under load, warm-ups included, by
// the arithmetic the progress display plans with: bring-ups, equivalence checks and
// the trials of a capacity search beyond the ones it plans are not in it. `run --plan`
// scales it by what stored runs of the same study took.
func PlannedLoadTime(st *study.Study) time.Duration { return loadTime(st.Plan()) }

func loadTime(plan []study.Trial) time.Duration {
	var total time.Duration
	for _, t := range plan {
		e := t.Experiment
		per := e.Duration.D() + e.Warmup.D()
		switch e.Kind {
		case study.KindSecurity:
			per = 10 * time.Second // probes, a short capture, a policy round trip
		case study.KindSteps:
			per = time.Duration(len(e.StepRates()))*e.Each.D() + e.Warmup.D()
		case study.KindCapacity:
			n := len(e.Connections)
			if e.Search != nil {
				n += 6
			} else if e.CapacityBy != study.CapacityClosedLoop {
				n += 3 // derived search below the closed-loop best
			}
			per *= time.Duration(n)
		case study.KindConnections:
			per *= time.Duration(len(e.Connections))
		}
		total += per
	}
	return total
}
