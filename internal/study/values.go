package study

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// nodeDecoder is implemented by value types whose YAML form is not a plain mapping,
// sequence or scalar of a Go kind. The returned error is the message only; the
// decoder adds file, line, column and field path.
type nodeDecoder interface {
	decodeNode(n *yaml.Node) error
}

// Duration is a time.Duration written as a Go duration string ("30s", "5m").
type Duration time.Duration

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// IsZero lets omitempty drop unset durations.
func (d Duration) IsZero() bool { return d == 0 }

func (d Duration) String() string {
	s := time.Duration(d).String()
	// "5m0s" reads better as "5m", "1h0m0s" as "1h"; both parse back the same.
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// MarshalYAML prints the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func (d *Duration) decodeNode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return fmt.Errorf("%s: expected a duration with a unit, like \"30s\" or \"5m\"", quote(n))
	}
	v, err := parseDuration(n.Value)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || strings.HasPrefix(strings.TrimSpace(s), "+") {
		return 0, fmt.Errorf("%q: expected a duration with a unit, like \"30s\" or \"5m\"", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("%q: must not be negative", s)
	}
	return v, nil
}

// DurationRange is a closed interval of durations written "1s-10s", or a single
// duration for a fixed value.
type DurationRange struct {
	Min, Max time.Duration
}

// IsZero lets omitempty drop unset ranges.
func (r DurationRange) IsZero() bool { return r.Min == 0 && r.Max == 0 }

func (r DurationRange) String() string {
	if r.Min == r.Max {
		return Duration(r.Min).String()
	}
	return Duration(r.Min).String() + "-" + Duration(r.Max).String()
}

// MarshalYAML prints the range as a string.
func (r DurationRange) MarshalYAML() (any, error) { return r.String(), nil }

func (r *DurationRange) decodeNode(n *yaml.Node) error {
	msg := fmt.Errorf("%s: expected a duration range like \"1s-10s\" or a duration like \"2s\"", quote(n))
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return msg
	}
	lo, hi, isRange := strings.Cut(n.Value, "-")
	if !isRange {
		hi = lo
	}
	min, err1 := parseDuration(lo)
	max, err2 := parseDuration(hi)
	if err1 != nil || err2 != nil {
		return msg
	}
	if min > max {
		return fmt.Errorf("%q: the lower bound is above the upper bound", n.Value)
	}
	*r = DurationRange{Min: min, Max: max}
	return nil
}

// Percent is a percentage written as a string ("0.1%", "75%"); the value is in
// percent, so "0.1%" is 0.1.
type Percent float64

// Fraction returns the percentage as a fraction of one (0.1% is 0.001).
func (p Percent) Fraction() float64 { return float64(p) / 100 }

// IsZero lets omitempty drop unset percentages.
func (p Percent) IsZero() bool { return p == 0 }

func (p Percent) String() string { return strconv.FormatFloat(float64(p), 'f', -1, 64) + "%" }

// MarshalYAML prints the percentage as a string.
func (p Percent) MarshalYAML() (any, error) { return p.String(), nil }

func (p *Percent) decodeNode(n *yaml.Node) error {
	v, ok := parsePercent(n)
	if !ok {
		return fmt.Errorf("%s: expected a percentage like \"0.1%%\"", quote(n))
	}
	if v > 100 {
		return fmt.Errorf("%q: must be at most 100%%", n.Value)
	}
	*p = Percent(v)
	return nil
}

func parsePercent(n *yaml.Node) (float64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return 0, false
	}
	num, ok := strings.CutSuffix(strings.TrimSpace(n.Value), "%")
	if !ok || !decimal.MatchString(num) {
		return 0, false
	}
	v, err := strconv.ParseFloat(num, 64)
	return v, err == nil && !math.IsInf(v, 0)
}

var decimal = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// Capacity names which mesh's capacity a relative rate is a share of.
type Capacity string

const (
	LowestCapacity  Capacity = "lowest"
	HighestCapacity Capacity = "highest"
)

// Rate is a request rate: absolute (PerSecond, written as a number) or a share of
// the capacity measured by an earlier capacity experiment (written
// "75% of lowest capacity").
type Rate struct {
	PerSecond float64
	Percent   float64
	Of        Capacity
}

// IsZero lets omitempty drop unset rates.
func (r Rate) IsZero() bool { return r == Rate{} }

// IsRelative reports whether the rate depends on a measured capacity.
func (r Rate) IsRelative() bool { return r.Of != "" }

func (r Rate) String() string {
	if r.IsRelative() {
		return fmt.Sprintf("%s%% of %s capacity", strconv.FormatFloat(r.Percent, 'f', -1, 64), r.Of)
	}
	return strconv.FormatFloat(r.PerSecond, 'f', -1, 64)
}

// MarshalYAML prints absolute rates as numbers and relative ones as strings.
func (r Rate) MarshalYAML() (any, error) {
	if r.IsRelative() {
		return r.String(), nil
	}
	return r.PerSecond, nil
}

var relativeRate = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)% of (lowest|highest) capacity$`)

func (r *Rate) decodeNode(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		var v float64
		if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%s: expected a rate in requests per second", quote(n))
		}
		if v <= 0 {
			return fmt.Errorf("%s: must be positive", quote(n))
		}
		*r = Rate{PerSecond: v}
		return nil
	}
	m := relativeRate.FindStringSubmatch(strings.Join(strings.Fields(n.Value), " "))
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || m == nil {
		return fmt.Errorf(`%s: expected "<N>%% of lowest|highest capacity" or a number`, quote(n))
	}
	pct, _ := strconv.ParseFloat(m[1], 64)
	if pct <= 0 || pct > 1000 {
		return fmt.Errorf("%s: the percentage must be above 0%% and at most 1000%%", quote(n))
	}
	*r = Rate{Percent: pct, Of: Capacity(m[2])}
	return nil
}

// Resolve turns the rate into requests per second. capacities holds the capacity
// each mesh reached in the experiment named by CapacityFrom; absolute rates ignore it.
func (r Rate) Resolve(capacities map[string]float64) (float64, error) {
	if !r.IsRelative() {
		return r.PerSecond, nil
	}
	if len(capacities) == 0 {
		return 0, fmt.Errorf("rate %q: no capacity measured yet", r)
	}
	var pick float64
	first := true
	for _, c := range capacities {
		if first || (r.Of == LowestCapacity && c < pick) || (r.Of == HighestCapacity && c > pick) {
			pick, first = c, false
		}
	}
	if pick <= 0 {
		return 0, fmt.Errorf("rate %q: the %s capacity measured is %v requests/s", r, r.Of, pick)
	}
	return pick * r.Percent / 100, nil
}

// IntList is a list of positive integers that may be written as a single number.
type IntList []int

// MarshalYAML prints a one-element list as a plain number.
func (l IntList) MarshalYAML() (any, error) {
	if len(l) == 1 {
		return l[0], nil
	}
	return []int(l), nil
}

func (l *IntList) decodeNode(n *yaml.Node) error {
	msg := fmt.Errorf("%s: expected a number or a list of numbers like [32, 64, 128]", quote(n))
	var items []*yaml.Node
	switch n.Kind {
	case yaml.ScalarNode:
		items = []*yaml.Node{n}
	case yaml.SequenceNode:
		items = n.Content
	default:
		return msg
	}
	out := make(IntList, 0, len(items))
	for _, it := range items {
		var v int
		if it.Kind != yaml.ScalarNode || it.ShortTag() != "!!int" || it.Decode(&v) != nil {
			return msg
		}
		out = append(out, v)
	}
	*l = out
	return nil
}

// CPUList is a set of CPUs in cpuset syntax: "0", "1-3", "0,2-3".
type CPUList string

// CPUs returns the CPU numbers in ascending order.
func (c CPUList) CPUs() ([]int, error) {
	seen := map[int]bool{}
	for _, part := range strings.Split(string(c), ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a || b > 4095 {
			return nil, errors.New(`expected a CPU list like "0", "1-3" or "0,2"`)
		}
		for i := a; i <= b; i++ {
			seen[i] = true
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out, nil
}

func (c *CPUList) decodeNode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!str" && n.ShortTag() != "!!int") {
		return fmt.Errorf(`%s: expected a CPU list like "0", "1-3" or "0,2"`, quote(n))
	}
	if _, err := CPUList(n.Value).CPUs(); err != nil {
		return fmt.Errorf("%q: %v", n.Value, err)
	}
	*c = CPUList(n.Value)
	return nil
}

// quote shows a node's value in an error message.
func quote(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" {
			return strconv.Quote(n.Value)
		}
		return n.Value
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "this value"
}
