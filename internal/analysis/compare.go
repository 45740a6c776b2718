package analysis

import (
	"fmt"
	"slices"

	"github.com/meshmark/meshmark/internal/results"
)

// CompareRuns compares the same mesh, experiment and step across two runs: run A is
// the reference, run B the candidate (old → new). meshes restricts the meshes
// compared (nil: every mesh present in both). The noise floor comes from run A (its
// A/A pair, or its baseline's spread).
func CompareRuns(a, b *results.Run, meshes []string, opts Options) ([]Comparison, error) {
	opts = opts.withDefaults()
	want := map[string]bool{}
	for _, m := range meshes {
		want[m] = true
	}
	ga, gb := Groups(a), Groups(b)
	for m := range want {
		if a.Mesh(m) == nil || b.Mesh(m) == nil {
			return nil, fmt.Errorf("mesh %q is not in both runs (run %s has %v, run %s has %v)", m, a.ID, labels(a), b.ID, labels(b))
		}
	}
	byKey := map[Key]*Group{}
	for _, g := range ga {
		byKey[g.Key] = g
	}
	floors := map[Point]map[Metric]Floor{}
	var out []Comparison
	for _, g := range gb {
		if len(want) > 0 && !want[g.Mesh] {
			continue
		}
		ref := byKey[g.Key]
		if ref == nil {
			continue
		}
		pt := Point{g.Experiment, g.Step}
		if floors[pt] == nil {
			floors[pt] = NoiseFloor(a, ga, pt, opts)
		}
		for _, c := range compareGroups(ref, g, opts, floors[pt]) {
			c.Reference = a.ID + "/" + ref.Mesh
			out = append(out, c)
		}
	}
	if len(out) == 0 && !slices.ContainsFunc(CompareSecurity(a, b, meshes), func(c SecurityChange) bool { return c.Before != "" }) {
		return nil, fmt.Errorf("runs %s and %s share no mesh × experiment × step with trials to compare", a.ID, b.ID)
	}
	return out, nil
}

func labels(r *results.Run) []string {
	var out []string
	for _, m := range r.Meshes {
		out = append(out, m.Label)
	}
	return out
}

// GateResult is the outcome of one gate on one comparison.
type GateResult struct {
	Gate   Gate       `json:"gate"`
	Failed bool       `json:"failed"`
	Why    string     `json:"why"`
	On     Comparison `json:"on,omitzero"`
	// Security is the probe a `security` gate judged.
	Security *SecurityChange `json:"security,omitempty"`
}

// CheckGates applies every gate to every comparison of its metric.
func CheckGates(gates []Gate, cs []Comparison) (results []GateResult, failed bool) {
	for _, g := range gates {
		if g.Security {
			continue // CheckSecurityGate judges it, on the probes rather than the comparisons
		}
		for _, c := range cs {
			if c.Metric != g.Metric {
				continue
			}
			f, why := g.Check(c)
			results = append(results, GateResult{Gate: g, Failed: f, Why: why, On: c})
			failed = failed || f
		}
	}
	return results, failed
}
