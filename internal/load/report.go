package load

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"
)

// Spectrum is the percentile list of the human table.
var Spectrum = []float64{50, 75, 90, 99, 99.9, 99.99, 100}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
}

func pctName(q float64) string {
	if q == 100 {
		return "max"
	}
	return "p" + strconv.FormatFloat(q, 'f', -1, 64)
}

// WriteTable writes the human summary: rates, the percentile spectrum of latency and
// service time, errors, status codes, generator health and warnings.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s %s  elapsed %s  sent %d  completed %d  ok %d\n", r.Model, r.Target,
		r.Elapsed.Round(time.Millisecond), r.Sent, r.Completed, r.Succeeded)
	after := ""
	if r.CompletedAfterWindow > 0 {
		after = fmt.Sprintf("; %d more of its requests completed after it", r.CompletedAfterWindow)
	}
	if r.RequestedRate > 0 {
		fmt.Fprintf(w, "rate: requested %.1f/s  achieved %.1f/s (completed within the measured window%s)\n", r.RequestedRate, r.AchievedRate, after)
	} else {
		fmt.Fprintf(w, "rate: achieved %.1f/s (completed within the measured window%s)\n", r.AchievedRate, after)
	}
	if r.TargetSaturated() {
		fmt.Fprintf(w, "TARGET SATURATED: %s. The latency below is that of a backlog the target could not work off, not its latency at this rate.\n", r.Saturation.Evidence())
	}
	fmt.Fprint(tw, "\t")
	for _, q := range Spectrum {
		fmt.Fprintf(tw, "%s\t", pctName(q))
	}
	fmt.Fprintln(tw, "mean\t")
	type row struct {
		name string
		h    Histogram
	}
	rows := []row{{"latency (from intended)", r.Latency}}
	if r.Failures() > 0 {
		// every request, and the two kinds apart, so that neither hides the other
		rows[0].name = "latency, all requests"
		rows = append(rows, row{"  answered", r.Answered}, row{"  failed (to failure)", r.Failed})
	}
	rows = append(rows, row{"service (from send)", r.Service}, row{"send lag", r.Health.SendLag})
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t", row.name)
		for _, q := range Spectrum {
			fmt.Fprintf(tw, "%s\t", fmtDur(row.h.Quantile(q)))
		}
		mean := time.Duration(0)
		if row.h.Histogram != nil {
			mean = time.Duration(row.h.Mean() * 1e3)
		}
		fmt.Fprintf(tw, "%s\t\n", fmtDur(mean))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	e := r.Errors
	failures := ""
	if f := r.Failures(); f > 0 {
		failures = fmt.Sprintf("; %d without a response, in the latency at their time to failure", f)
	}
	fmt.Fprintf(w, "errors: %d (refused %d, reset %d, timeout %d, non-2xx %d, other %d, lookup %d)%s\n",
		e.Total(), e.Refused, e.Reset, e.Timeout, e.Non2xx, e.Other, e.Lookup, failures)
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(w, "  e.g. %s\n", s)
	}
	codes := make([]int, 0, len(r.StatusCodes))
	for c := range r.StatusCodes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	fmt.Fprint(w, "status:")
	for _, c := range codes {
		fmt.Fprintf(w, " %d×%d", c, r.StatusCodes[c])
	}
	fmt.Fprintln(w)
	h := r.Health
	if r.Saturation != nil && !r.Saturation.Saturated {
		fmt.Fprintf(w, "target: kept up (backlog %d at the window's start, %d at its end)\n", r.Saturation.BacklogFrom, r.Saturation.BacklogTo)
	}
	fmt.Fprintf(w, "generator: peak in-flight %d, connections %d, late %d, dropped %d, aborted %d, cpu %s user + %s sys (%s/request)\n",
		h.PeakInFlight, h.Connections, h.Late, h.Dropped, h.Aborted,
		h.CPUUser.Round(time.Millisecond), h.CPUSystem.Round(time.Millisecond), fmtDur(h.CPUPerRequest))
	if h.SpinWait > 0 {
		fmt.Fprintf(w, "generator: spun %s waiting for send times (window %s before each send; not counted per request)\n",
			h.SpinWait.Round(time.Millisecond), fmtDur(h.SpinWindow))
	}
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", s)
	}
	if r.Incomplete {
		fmt.Fprintln(w, "WARNING: run was interrupted; results are partial")
	}
	return nil
}

// WriteJSON writes r with its full histograms (V2 compressed, base64) and intervals.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads what WriteJSON wrote.
func ReadJSON(rd io.Reader) (*Result, error) {
	var r Result
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("load result: %w", err)
	}
	return &r, nil
}

// WriteCSV writes the interval series, one row per interval, times in microseconds.
func WriteCSV(w io.Writer, r *Result) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"start_s", "length_s", "requested_rps", "achieved_rps", "completed",
		"errors", "refused", "reset", "timeout", "non2xx", "other", "lookup",
		"latency_p50_us", "latency_p90_us", "latency_p99_us", "latency_max_us", "service_p99_us", "send_lag_max_us", "in_flight", "waiting"})
	us := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, iv := range r.Intervals {
		e := iv.Errors
		_ = cw.Write([]string{f(iv.Start.Seconds()), f(iv.Length.Seconds()), f(iv.RequestedRate), f(iv.AchievedRate),
			n(iv.Completed), n(e.Total()), n(e.Refused), n(e.Reset), n(e.Timeout), n(e.Non2xx), n(e.Other), n(e.Lookup),
			us(iv.LatencyP50), us(iv.LatencyP90), us(iv.LatencyP99), us(iv.LatencyMax), us(iv.ServiceP99), us(iv.SendLagMax), n(iv.InFlight), n(iv.Waiting)})
	}
	cw.Flush()
	return cw.Error()
}

// ProgressLine renders p as one short status line.
func ProgressLine(p Progress) string {
	iv := p.Interval
	total := ""
	if p.Total > 0 {
		total = "/" + p.Total.Round(time.Second).String()
	}
	return fmt.Sprintf("%s%s  %.0f req/s  p99 %s  errors %d  in-flight %d",
		p.Elapsed.Round(time.Second), total, iv.AchievedRate, fmtDur(iv.LatencyP99), iv.Errors.Total(), p.InFlight)
}
