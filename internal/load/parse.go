package load

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

func parseRate(field, s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s: %q is not a rate (requests per second, e.g. 100 or 2.5)", field, s)
	}
	return v, nil
}

// ParseSteps parses "from:to:step:each", e.g. "100:1000:100:10s".
func ParseSteps(s string) (ScheduleSpec, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return ScheduleSpec{}, fmt.Errorf("--steps %q: want from:to:step:each, e.g. 100:1000:100:10s", s)
	}
	spec := ScheduleSpec{Arrival: Steps}
	var err error
	for i, dst := range []*float64{&spec.From, &spec.To, &spec.Step} {
		if *dst, err = parseRate("--steps "+[]string{"from", "to", "step"}[i], parts[i]); err != nil {
			return ScheduleSpec{}, err
		}
	}
	if spec.Each, err = time.ParseDuration(parts[3]); err != nil {
		return ScheduleSpec{}, fmt.Errorf("--steps each: %q is not a duration (e.g. 10s)", parts[3])
	}
	if err := spec.Validate(0); err != nil {
		return ScheduleSpec{}, fmt.Errorf("--steps %q: %w", s, err)
	}
	return spec, nil
}

// ParseRamp parses "from:to" (rates); the ramp spans the run's duration.
func ParseRamp(s string) (ScheduleSpec, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 2 {
		return ScheduleSpec{}, fmt.Errorf("--ramp %q: want from:to, e.g. 100:2000", s)
	}
	spec := ScheduleSpec{Arrival: Ramp}
	var err error
	if spec.From, err = parseRate("--ramp from", parts[0]); err != nil {
		return ScheduleSpec{}, err
	}
	if spec.To, err = parseRate("--ramp to", parts[1]); err != nil {
		return ScheduleSpec{}, err
	}
	if err := spec.Validate(time.Second); err != nil {
		return ScheduleSpec{}, fmt.Errorf("--ramp %q: %w", s, err)
	}
	return spec, nil
}

// ParseThink parses a think time: "2s" (fixed), "1s-10s" (uniform) or "exp:1s-10s"
// (exponential with the range's mean).
func ParseThink(s string) (Think, error) {
	var t Think
	rest := s
	if r, ok := strings.CutPrefix(s, "exp:"); ok {
		t.Exponential, rest = true, r
	}
	lo, hi, isRange := strings.Cut(rest, "-")
	var err error
	if t.Min, err = time.ParseDuration(strings.TrimSpace(lo)); err != nil {
		return Think{}, fmt.Errorf("--think %q: %q is not a duration (want 2s, 1s-10s or exp:1s-10s)", s, lo)
	}
	t.Max = t.Min
	if isRange {
		if t.Max, err = time.ParseDuration(strings.TrimSpace(hi)); err != nil {
			return Think{}, fmt.Errorf("--think %q: %q is not a duration (want 2s, 1s-10s or exp:1s-10s)", s, hi)
		}
	}
	if t.Min < 0 || t.Max < t.Min {
		return Think{}, fmt.Errorf("--think %q: want 0 <= min <= max", s)
	}
	return t, nil
}

// ParseTask parses a user model's task, "NAME:WEIGHT:/PATH" or "NAME:WEIGHT:METHOD:/PATH":
// a request like base (its headers and body) with its own method and path on base's
// scheme and host, drawn with a positive weight. NAME is URL-escaped (a colon in it is
// %3A; FormatTask writes it so).
func ParseTask(s string, base Request) (Task, error) {
	bad := func(why string) (Task, error) {
		return Task{}, fmt.Errorf("--task %q: %s (want NAME:WEIGHT:/PATH or NAME:WEIGHT:METHOD:/PATH)", s, why)
	}
	escaped, rest, ok := strings.Cut(s, ":")
	name, err := url.PathUnescape(escaped)
	if !ok || err != nil || strings.TrimSpace(name) == "" {
		return bad("no name")
	}
	weight, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return bad("no weight")
	}
	w, err := strconv.Atoi(weight)
	if err != nil || w <= 0 {
		return bad(fmt.Sprintf("weight %q is not a positive whole number", weight))
	}
	method := base.Method
	if !strings.HasPrefix(rest, "/") {
		m, path, ok := strings.Cut(rest, ":")
		if !ok || !validToken(m) {
			return bad(fmt.Sprintf("%q is neither a path nor METHOD:/PATH", rest))
		}
		method, rest = m, path
	}
	if !strings.HasPrefix(rest, "/") || strings.ContainsAny(rest, " \r\n\x00#") {
		return bad(fmt.Sprintf("path %q must start with / and hold no space, CR, LF, NUL or fragment", rest))
	}
	u, err := url.Parse(base.URL)
	if err != nil || u.Host == "" {
		return bad(fmt.Sprintf("the target %q has no host to put the path on", base.URL))
	}
	ref, err := url.Parse(rest)
	if err != nil {
		return bad(err.Error())
	}
	u.Path, u.RawPath, u.RawQuery = ref.Path, ref.RawPath, ref.RawQuery
	req := base
	req.Method, req.URL = method, u.String()
	return Task{Name: name, Weight: w, Request: req}, nil
}

// taskNameEscaper escapes what would end a task's name early, for url.PathUnescape.
var taskNameEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// FormatTask writes a task for ParseTask: its name, weight, method and the path (with
// query) of its URL.
func FormatTask(name string, weight int, method, path string) string {
	return taskNameEscaper.Replace(name) + ":" + strconv.Itoa(weight) + ":" + method + ":" + path
}

// ParseHeader parses "Name: value" into h.
func ParseHeader(h http.Header, s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return fmt.Errorf("header %q: want 'Name: value'", s)
	}
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !validToken(name) {
		return fmt.Errorf("header %q: %q is not a valid header name", s, name)
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return fmt.Errorf("header %q: value contains CR, LF or NUL", name)
	}
	h.Add(name, value)
	return nil
}
