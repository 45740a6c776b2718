// Package cost owns the money side of a study: a price table of cloud instance types
// (an embedded default of approximate on-demand list prices, replaceable with
// --prices FILE) and the model that turns a mesh's extra vCPU and memory over the
// baseline, at the measured request rate, into instance-equivalents, dollars per month
// and dollars per million requests.
package cost

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/substrate"
)

//go:embed prices.yaml
var defaultPrices []byte

// DefaultHoursPerMonth is the usual cloud billing month (365 × 24 / 12).
const DefaultHoursPerMonth = 730

// Instance is one priced instance type.
type Instance struct {
	Name         string // "<provider>/<type>", e.g. "aws/m6i.large"
	VCPU         float64
	MemoryGiB    float64
	PricePerHour float64 // in the table's Currency
	Region       string
	Source       string // where the price came from
	AsOf         string // YYYY-MM-DD
	Note         string
}

// Table is a price table.
type Table struct {
	Currency      string
	HoursPerMonth float64
	Instances     []Instance
	// Origin names where the table came from ("embedded default" or a file path).
	Origin string
}

// Instance returns the named instance, or nil.
func (t *Table) Instance(name string) *Instance {
	for i := range t.Instances {
		if t.Instances[i].Name == name {
			return &t.Instances[i]
		}
	}
	return nil
}

// Default returns the embedded price table.
func Default() *Table {
	t, err := Parse("prices.yaml (embedded)", defaultPrices)
	if err != nil {
		panic(err) // the embedded table is tested
	}
	t.Origin = "embedded default"
	return t
}

// Load returns the default table with the user's file applied on top: its instances
// replace default ones of the same name and add new ones; its currency and
// hoursPerMonth, when set, replace the default's. An empty path returns the default.
func Load(path string) (*Table, error) {
	t := Default()
	if path == "" {
		return t, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	user, err := Parse(path, b)
	if err != nil {
		return nil, err
	}
	if user.Currency != "" && user.Currency != t.Currency {
		// Mixing currencies would make the merged table meaningless: use only the user's.
		user.Origin = path
		return user, nil
	}
	if user.HoursPerMonth > 0 {
		t.HoursPerMonth = user.HoursPerMonth
	}
	for _, in := range user.Instances {
		if old := t.Instance(in.Name); old != nil {
			*old = in
		} else {
			t.Instances = append(t.Instances, in)
		}
	}
	t.Origin = "embedded default + " + path
	return t, nil
}

// posError is a parse error at file:line naming the field.
type posError struct {
	file  string
	line  int
	field string
	msg   string
}

func (e *posError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.file, e.line, e.field, e.msg)
}

// Parse reads a price table. Errors name the file, line and field.
func Parse(file string, data []byte) (*Table, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %s", file, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	t := &Table{HoursPerMonth: 0, Origin: file}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &posError{file, 1, "instances", "empty price table"}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, &posError{file, root.Line, "(top level)", "want a mapping with currency, hoursPerMonth and instances"}
	}
	var sawInstances bool
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "currency":
			if v.Kind != yaml.ScalarNode || v.Value == "" {
				return nil, &posError{file, v.Line, "currency", "want a currency code such as USD"}
			}
			t.Currency = v.Value
		case "hoursPerMonth":
			f, err := positive(file, "hoursPerMonth", v)
			if err != nil {
				return nil, err
			}
			t.HoursPerMonth = f
		case "instances":
			sawInstances = true
			if v.Kind != yaml.SequenceNode {
				return nil, &posError{file, v.Line, "instances", "want a list of instance types"}
			}
			seen := map[string]int{}
			for j, n := range v.Content {
				in, err := parseInstance(file, j, n)
				if err != nil {
					return nil, err
				}
				if line, dup := seen[in.Name]; dup {
					return nil, &posError{file, n.Line, fmt.Sprintf("instances[%d].name", j),
						fmt.Sprintf("%q already defined on line %d", in.Name, line)}
				}
				seen[in.Name] = n.Line
				t.Instances = append(t.Instances, in)
			}
		default:
			return nil, &posError{file, k.Line, k.Value, "unknown field (want currency, hoursPerMonth, instances)"}
		}
	}
	if !sawInstances || len(t.Instances) == 0 {
		return nil, &posError{file, root.Line, "instances", "no instance types defined"}
	}
	if t.Currency == "" {
		t.Currency = "USD"
	}
	if t.HoursPerMonth == 0 {
		t.HoursPerMonth = DefaultHoursPerMonth
	}
	return t, nil
}

func parseInstance(file string, idx int, n *yaml.Node) (Instance, error) {
	var in Instance
	at := func(f string) string { return fmt.Sprintf("instances[%d].%s", idx, f) }
	if n.Kind != yaml.MappingNode {
		return in, &posError{file, n.Line, fmt.Sprintf("instances[%d]", idx), "want a mapping (name, vcpu, memoryGiB, usdPerHour, source, asOf)"}
	}
	have := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if have[k.Value] {
			return in, &posError{file, k.Line, at(k.Value), "given twice"}
		}
		have[k.Value] = true
		var err error
		switch k.Value {
		case "name":
			in.Name, err = text(file, at("name"), v)
			if err == nil && !strings.Contains(in.Name, "/") {
				err = &posError{file, v.Line, at("name"), fmt.Sprintf("%q: want provider/type, e.g. aws/m6i.large", in.Name)}
			}
		case "vcpu":
			in.VCPU, err = positive(file, at("vcpu"), v)
		case "memoryGiB":
			in.MemoryGiB, err = positive(file, at("memoryGiB"), v)
		case "usdPerHour", "pricePerHour":
			in.PricePerHour, err = positive(file, at(k.Value), v)
		case "region":
			in.Region, err = text(file, at("region"), v)
		case "source":
			in.Source, err = text(file, at("source"), v)
		case "asOf":
			in.AsOf, err = text(file, at("asOf"), v)
			if err == nil {
				if _, perr := time.Parse("2006-01-02", in.AsOf); perr != nil {
					err = &posError{file, v.Line, at("asOf"), fmt.Sprintf("%q: want a date YYYY-MM-DD", in.AsOf)}
				}
			}
		case "note":
			in.Note, err = text(file, at("note"), v)
		default:
			err = &posError{file, k.Line, at(k.Value), "unknown field (want name, vcpu, memoryGiB, usdPerHour, region, source, asOf, note)"}
		}
		if err != nil {
			return in, err
		}
	}
	for _, req := range []string{"name", "vcpu", "memoryGiB", "source", "asOf"} {
		if !have[req] {
			return in, &posError{file, n.Line, at(req), "missing (every price needs its source and date)"}
		}
	}
	if !have["usdPerHour"] && !have["pricePerHour"] {
		return in, &posError{file, n.Line, at("usdPerHour"), "missing"}
	}
	return in, nil
}

func text(file, field string, v *yaml.Node) (string, error) {
	if v.Kind != yaml.ScalarNode || strings.TrimSpace(v.Value) == "" {
		return "", &posError{file, v.Line, field, "want a non-empty string"}
	}
	return v.Value, nil
}

func positive(file, field string, v *yaml.Node) (float64, error) {
	if v.Kind != yaml.ScalarNode {
		return 0, &posError{file, v.Line, field, "want a number"}
	}
	f, err := strconv.ParseFloat(v.Value, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		return 0, &posError{file, v.Line, field, fmt.Sprintf("%q: want a positive number", v.Value)}
	}
	return f, nil
}

// Usage is the average resources a configuration used at a given request rate.
type Usage struct {
	VCPU      float64
	MemoryMiB float64
}

// UsageFromSummary totals a run's resources for cost: every role except the load
// generator (which is the same in baseline and mesh runs and not part of the bill),
// with memory as PSS where the kernel provides it (so shared pages are not counted
// twice) and RSS otherwise.
func UsageFromSummary(s sampler.Summary) Usage {
	var u Usage
	for _, g := range s.Groups {
		if g.By != sampler.ByRole || g.Key == string(substrate.RoleLoadGen) {
			continue
		}
		u.VCPU += g.AvgVCPU
		if g.AvgPSSMiB > 0 {
			u.MemoryMiB += g.AvgPSSMiB
		} else {
			u.MemoryMiB += g.AvgRSSMiB
		}
	}
	return u
}

// Estimate is what a mesh's overhead costs, priced on one instance type.
type Estimate struct {
	Instance       Instance
	ExtraVCPU      float64 // mesh minus baseline; may be negative within noise
	ExtraMemoryGiB float64
	// InstanceEquivalents is the fraction of instances the extra resources fill: the
	// larger of the CPU and memory shares (0 when neither is positive). BoundBy says
	// which one ("cpu" or "memory").
	InstanceEquivalents float64
	BoundBy             string
	PerHour, PerMonth   float64
	// PerMillionRequests is PerHour spread over the requests served in an hour at the
	// measured rate; 0 when the rate is unknown.
	PerMillionRequests float64
	Currency           string
}

// Estimate prices the mesh's extra resources over the baseline, both measured at rps,
// on instance type name.
func (t *Table) Estimate(name string, baseline, mesh Usage, rps float64) (Estimate, error) {
	in := t.Instance(name)
	if in == nil {
		names := make([]string, 0, len(t.Instances))
		for _, i := range t.Instances {
			names = append(names, i.Name)
		}
		sort.Strings(names)
		return Estimate{}, fmt.Errorf("no price for instance type %q in %s (have %s)", name, t.Origin, strings.Join(names, ", "))
	}
	return t.estimate(*in, baseline, mesh, rps), nil
}

// EstimateAll prices the overhead on every instance type of the table.
func (t *Table) EstimateAll(baseline, mesh Usage, rps float64) []Estimate {
	out := make([]Estimate, 0, len(t.Instances))
	for _, in := range t.Instances {
		out = append(out, t.estimate(in, baseline, mesh, rps))
	}
	return out
}

func (t *Table) estimate(in Instance, baseline, mesh Usage, rps float64) Estimate {
	e := Estimate{Instance: in, Currency: t.Currency,
		ExtraVCPU:      mesh.VCPU - baseline.VCPU,
		ExtraMemoryGiB: (mesh.MemoryMiB - baseline.MemoryMiB) / 1024}
	cpuShare := e.ExtraVCPU / in.VCPU
	memShare := e.ExtraMemoryGiB / in.MemoryGiB
	e.BoundBy = "cpu"
	e.InstanceEquivalents = cpuShare
	if memShare > cpuShare {
		e.BoundBy, e.InstanceEquivalents = "memory", memShare
	}
	if e.InstanceEquivalents < 0 {
		e.InstanceEquivalents = 0
	}
	e.PerHour = e.InstanceEquivalents * in.PricePerHour
	e.PerMonth = e.PerHour * t.HoursPerMonth
	if rps > 0 {
		e.PerMillionRequests = e.PerHour / (rps * 3600) * 1e6
	}
	return e
}
