package load

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Merge combines the results of generators that ran side by side against one target
// (several processes, or pods on several nodes) into the result of one generator that
// sent all their requests. Counts add up; histograms merge bucket by bucket, so every
// percentile of the merge is exactly that of all the requests together, not an average
// of percentiles; rates add up, since the generators ran at the same time. Interval i
// of the merge combines interval i of each generator.
func Merge(results []*Result) (*Result, error) {
	if len(results) == 0 {
		return nil, errors.New("merge: no results")
	}
	out := &Result{
		Model:       results[0].Model,
		Start:       results[0].Start,
		StatusCodes: map[int]int64{},
		Latency:     Histogram{NewHistogram()},
		Service:     Histogram{NewHistogram()},
		Answered:    Histogram{NewHistogram()},
		Failed:      Histogram{NewHistogram()},
		FirstByte:   Histogram{NewHistogram()},
		Health:      Health{SendLag: Histogram{NewHistogram()}},
	}
	var targets []string
	for i, r := range results {
		if r.Model != out.Model {
			return nil, fmt.Errorf("merge: result %d ran %s, result 1 ran %s: only runs of one load model add up", i+1, r.Model, out.Model)
		}
		if !slices.Contains(targets, r.Target) {
			targets = append(targets, r.Target)
		}
		if r.Start.Before(out.Start) {
			out.Start = r.Start
		}
		out.Elapsed = max(out.Elapsed, r.Elapsed)
		out.Warmup = max(out.Warmup, r.Warmup)
		out.Sent += r.Sent
		out.Completed += r.Completed
		out.Succeeded += r.Succeeded
		out.CompletedInWindow += r.CompletedInWindow
		out.SucceededInWindow += r.SucceededInWindow
		out.CompletedAfterWindow += r.CompletedAfterWindow
		out.Errors = out.Errors.plus(r.Errors)
		for _, s := range r.ErrorSamples {
			if len(out.ErrorSamples) < maxErrorSamples && !slices.Contains(out.ErrorSamples, s) {
				out.ErrorSamples = append(out.ErrorSamples, s)
			}
		}
		for code, n := range r.StatusCodes {
			out.StatusCodes[code] += n
		}
		out.BytesIn += r.BytesIn
		out.RequestedRate += r.RequestedRate
		out.AchievedRate += r.AchievedRate
		out.Clamped += r.Clamped
		for _, m := range []struct {
			name     string
			into, of Histogram
		}{{"latency", out.Latency, r.Latency}, {"service", out.Service, r.Service},
			{"answered latency", out.Answered, r.Answered}, {"failed latency", out.Failed, r.Failed},
			{"first byte", out.FirstByte, r.FirstByte}, {"send lag", out.Health.SendLag, r.Health.SendLag}} {
			if err := mergeInto(m.into.Histogram, m.of.Histogram); err != nil {
				return nil, fmt.Errorf("merge: result %d: %s histogram: %w", i+1, m.name, err)
			}
		}
		h := &out.Health
		h.PeakInFlight += r.Health.PeakInFlight
		h.Connections += r.Health.Connections
		h.Late += r.Health.Late
		h.Dropped += r.Health.Dropped
		h.Aborted += r.Health.Aborted
		h.CPUUser += r.Health.CPUUser
		h.CPUSystem += r.Health.CPUSystem
		h.SpinWait += r.Health.SpinWait
		h.SpinWindow = max(h.SpinWindow, r.Health.SpinWindow)
		h.DialWait = max(h.DialWait, r.Health.DialWait)
		h.DialLongest = max(h.DialLongest, r.Health.DialLongest)
		h.Bottleneck = h.Bottleneck || r.Health.Bottleneck
		for _, w := range r.Health.Why {
			h.Why = append(h.Why, fmt.Sprintf("generator %d: %s", i+1, w))
		}
		for _, w := range r.Warnings {
			out.Warnings = append(out.Warnings, fmt.Sprintf("generator %d: %s", i+1, w))
		}
		out.Incomplete = out.Incomplete || r.Incomplete
	}
	out.Target = strings.Join(targets, ", ")
	if out.Completed > 0 {
		out.Health.CPUPerRequest = (out.Health.CPUUser + out.Health.CPUSystem - out.Health.SpinWait) / time.Duration(out.Completed)
	}
	ivs, err := mergeIntervals(results)
	if err != nil {
		return nil, err
	}
	out.Intervals = ivs
	// The target's backlog is the sum of every generator's; judged again on the sum,
	// since each generator saw only its share of it.
	// A generator's connect stall is its own loop's, and stays as it judged it.
	var stall *Saturation
	for _, r := range results {
		if s := r.Saturation; s != nil && s.ConnectStall > 0 && (stall == nil || s.ConnectStall > stall.ConnectStall) {
			stall = s
		}
	}
	if results[0].Saturation != nil || stall != nil {
		out.Saturation = DetectSaturation(out, out.Warmup+out.Elapsed)
	}
	if stall != nil {
		out.markConnectStall(stall.ConnectStall, stall.ConnectLongest)
	}
	return out, nil
}

// mergeInto adds h's counts to into. Both have meshmark's range, so no value can fall
// outside; a histogram of another range is refused rather than merged with loss.
func mergeInto(into, h *hdrhistogram.Histogram) error {
	if h == nil {
		return nil
	}
	if h.LowestTrackableValue() != HistLowest || h.HighestTrackableValue() != HistHighest || h.SignificantFigures() != HistDigits {
		return fmt.Errorf("range %d..%d at %d digits, want meshmark's %d..%d at %d",
			h.LowestTrackableValue(), h.HighestTrackableValue(), h.SignificantFigures(), HistLowest, HistHighest, HistDigits)
	}
	if dropped := into.Merge(h); dropped != 0 {
		return fmt.Errorf("%d values did not fit", dropped)
	}
	return nil
}

func mergeIntervals(results []*Result) ([]Interval, error) {
	sets := make([][]Interval, len(results))
	for i, r := range results {
		sets[i] = r.Intervals
	}
	return MergeIntervals(sets)
}

// MergeIntervals merges generators' interval series by index: interval i of the result
// holds every request of interval i of each series, histograms merged bucket by bucket.
// The generators are assumed to have started together, as Merge assumes.
func MergeIntervals(sets [][]Interval) ([]Interval, error) {
	n := 0
	for _, s := range sets {
		n = max(n, len(s))
	}
	out := make([]Interval, n)
	for i := range out {
		lat, svc := NewHistogram(), NewHistogram()
		iv := &out[i]
		first := true
		for g, set := range sets {
			if i >= len(set) {
				continue
			}
			x := set[i]
			if first || x.Start < iv.Start {
				iv.Start = x.Start
			}
			first = false
			iv.Length = max(iv.Length, x.Length)
			iv.Completed += x.Completed
			iv.Errors = iv.Errors.plus(x.Errors)
			iv.RequestedRate += x.RequestedRate
			iv.AchievedRate += x.AchievedRate
			iv.SendLagMax = max(iv.SendLagMax, x.SendLagMax)
			iv.InFlight += x.InFlight
			iv.Waiting += x.Waiting
			for _, m := range []struct {
				into *hdrhistogram.Histogram
				enc  string
			}{{lat, x.Latency}, {svc, x.Service}} {
				if m.enc == "" {
					continue
				}
				h, err := DecodeHistogram(m.enc)
				if err != nil {
					return nil, fmt.Errorf("merge: result %d: interval %d: %w", g+1, i+1, err)
				}
				if err := mergeInto(m.into, h); err != nil {
					return nil, fmt.Errorf("merge: result %d: interval %d: %w", g+1, i+1, err)
				}
			}
		}
		iv.LatencyP50 = Histogram{lat}.Quantile(50)
		iv.LatencyP90 = Histogram{lat}.Quantile(90)
		iv.LatencyP99 = Histogram{lat}.Quantile(99)
		iv.LatencyMax = Histogram{lat}.Quantile(100)
		iv.ServiceP99 = Histogram{svc}.Quantile(99)
		var err error
		if iv.Latency, err = EncodeHistogram(lat); err != nil {
			return nil, err
		}
		if iv.Service, err = EncodeHistogram(svc); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (e Errors) plus(o Errors) Errors {
	return Errors{Refused: e.Refused + o.Refused, Reset: e.Reset + o.Reset, Timeout: e.Timeout + o.Timeout,
		Non2xx: e.Non2xx + o.Non2xx, Other: e.Other + o.Other, Lookup: e.Lookup + o.Lookup}
}
