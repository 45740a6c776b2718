// Package reproduce owns what a run of a study file that declares spec.reproduces
// says about the published study it reproduces (internal/published): that study's own
// tables and figures in its layout, built from the analysed run, and each of its
// published claims evaluated against the run and marked agrees, disagrees, not
// resolved, not comparable or not measured. The marks are computed, never written:
//
//   - an ordering ("A is lower than B") agrees only when the run's interval for B
//     against A resolves B higher (the comparison's verdict is worse, or better for a
//     higher-is-better metric, beyond the noise floor and the metric's margin); it
//     disagrees when the run resolves the other way, or resolves the two equal within
//     the margin (the study saw a difference); anything else is not resolved.
//   - a ratio agrees when the run's whole interval of B over A lies within the claim's
//     band (the published range, widened as the claim says), disagrees when the whole
//     interval lies outside it, and is not resolved when the interval straddles an edge.
//   - not resolved is a mark of its own, never counted as agreement: the run could not
//     tell, and says by how much it could not.
//   - not comparable: the claim is about something no run here reproduces (App Mesh,
//     Cilium's eBPF datapath), or about totals that scale with the original cluster;
//     the run's figure is shown beside it anyway, with the reason.
//   - not measured: the run has no mesh standing for a role the claim names, or no
//     experiment where the claim was measured.
package reproduce

import (
	"fmt"
	"math"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/results"
)

// Mark is how a run stands to one published claim.
type Mark string

const (
	Agrees        Mark = "agrees"
	Disagrees     Mark = "disagrees"
	NotResolved   Mark = "not resolved"
	NotComparable Mark = "not comparable"
	NotMeasured   Mark = "not measured"
)

// Marks lists the marks in the order a tally gives them.
var Marks = []Mark{Agrees, Disagrees, NotResolved, NotComparable, NotMeasured}

// Reproduction is what a run says about the published study it reproduces.
type Reproduction struct {
	Study    string `json:"study"` // "S4"
	Title    string `json:"title"`
	Citation string `json:"citation"`
	// Meshes says which of the run's meshes stands for each of the study's.
	Meshes []RoleMesh `json:"meshes"`
	// Extra are the run's meshes the study did not have.
	Extra []string `json:"extra,omitempty"`
	// Tables are the study's own tables and figures, in its layout, from this run.
	Tables []Table `json:"tables"`
	// Claims are its published figures beside the run's, each marked.
	Claims []Evaluation `json:"claims"`
}

// RoleMesh is the mesh of the run standing for one of the study's meshes.
type RoleMesh struct {
	Role  string `json:"role"`
	Title string `json:"title"`
	Mesh  string `json:"mesh,omitempty"` // "" when none does
	// Unlike says how it differs from the study's mesh, when so much that no claim
	// about it can be tested.
	Unlike string `json:"unlike,omitempty"`
}

// Table is one of the study's tables (or a figure given as one).
type Table struct {
	Title  string     `json:"title"`
	Note   string     `json:"note,omitempty"`
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
	// Heat, when set, is a heatmap's share (0–100 %) per cell of Rows (NaN-free: a cell
	// not in the map has 0), for shading.
	Heat [][]float64 `json:"heat,omitempty"`
	// Bars, when set, is the table's figure: grouped bars.
	Bars *Bars `json:"bars,omitempty"`
}

// Bars is a grouped bar chart: one group per category, one bar per series.
type Bars struct {
	Title      string      `json:"title"`
	Unit       string      `json:"unit"`
	Categories []string    `json:"categories"`
	Series     []BarSeries `json:"series"`
}

// BarSeries is one mesh's bars; a nil value is a bar not measured.
type BarSeries struct {
	Name   string     `json:"name"`
	Values []*float64 `json:"values"`
}

// Evaluation is one published claim tested at one load point of the run.
type Evaluation struct {
	Claim  string `json:"claim"` // the claim's id
	Kind   string `json:"kind"`  // order or ratio
	Metric string `json:"metric"`
	// Point is where the run tested it; Where where the study measured it.
	Point string `json:"point"`
	Where string `json:"where"`
	// Published is the study's figure; Expect what the run must show to agree.
	Published string `json:"published"`
	Expect    string `json:"expect"`
	// Ours is the run's figure with its interval ("" when not measured).
	Ours   string `json:"ours"`
	Mark   Mark   `json:"mark"`
	Reason string `json:"reason,omitempty"`
	// Ratio is B over A with its interval (NaN when not measured).
	Ratio analysis.Estimate `json:"ratio"`
}

// Tally counts the marks: "3 agree, 1 disagrees, 2 not resolved".
func (r *Reproduction) Tally() string {
	n := map[Mark]int{}
	for _, e := range r.Claims {
		n[e.Mark]++
	}
	var parts []string
	for _, m := range Marks {
		if n[m] == 0 {
			continue
		}
		word := string(m)
		switch {
		case m == Agrees && n[m] == 1:
			word = "agrees"
		case m == Agrees:
			word = "agree"
		case m == Disagrees && n[m] > 1:
			word = "disagree"
		}
		parts = append(parts, fmt.Sprintf("%d %s", n[m], word))
	}
	if len(parts) == 0 {
		return "no published figure to compare"
	}
	return strings.Join(parts, ", ")
}

// Declared returns the published study a run's stored study file names in
// spec.reproduces, or "" when it names none. The file was validated when the run
// started; this reads the one field, so that a run whose study no longer parses in
// full (a graph file moved) still knows what it reproduced.
func Declared(run *results.Run) string {
	var doc struct {
		Spec struct {
			Reproduces string `yaml:"reproduces"`
		} `yaml:"spec"`
	}
	if len(run.StudyFile) == 0 || yaml.Unmarshal(run.StudyFile, &doc) != nil {
		return ""
	}
	return doc.Spec.Reproduces
}

// Build says what the run says about the study it reproduces: nil when its study file
// declares none (or one no longer known).
func Build(run *results.Run, rep *analysis.Report) *Reproduction {
	id := Declared(run)
	if id == "" {
		return nil
	}
	p := published.Lookup(id)
	if p == nil {
		return nil
	}
	return BuildFor(p, run, rep)
}

// BuildFor builds the reproduction of study p from a run.
func BuildFor(p *published.Study, run *results.Run, rep *analysis.Report) *Reproduction {
	r := &Reproduction{Study: p.ID, Title: p.Title, Citation: p.Citation()}
	var meshes []published.Mesh
	for _, m := range run.Meshes {
		meshes = append(meshes, published.Mesh{Label: m.Label, Stands: mesh.StandsOf(m.Profile), Options: m.Options})
	}
	assigned := map[string]bool{}
	for _, a := range p.Assign(meshes, rep.Baseline) {
		r.Meshes = append(r.Meshes, RoleMesh{Role: a.Role, Title: a.Title, Mesh: a.Mesh, Unlike: a.Unlike})
		assigned[a.Mesh] = true
	}
	for _, m := range run.Meshes {
		if !assigned[m.Label] {
			r.Extra = append(r.Extra, m.Label)
		}
	}
	c := &builder{p: p, run: run, rep: rep, r: r}
	switch p.ID {
	case "S1":
		r.Tables = c.s1Tables()
	case "S2":
		r.Tables = c.s2Tables()
	case "S3":
		r.Tables = c.s3Tables()
	case "S4":
		r.Tables = c.s4Tables()
	case "S5":
		r.Tables = c.s5Tables()
	}
	for _, cl := range p.Claims {
		r.Claims = append(r.Claims, c.evaluate(cl)...)
	}
	return r
}

// builder is one reproduction being built.
type builder struct {
	p   *published.Study
	run *results.Run
	rep *analysis.Report
	r   *Reproduction
}

// roleMesh returns the run's mesh standing for a role.
func (c *builder) roleMesh(role string) RoleMesh {
	for _, m := range c.r.Meshes {
		if m.Role == role {
			return m
		}
	}
	return RoleMesh{Role: role, Title: role}
}

// meshName is a mesh's label with the study's name for it: "istio-like (Istio)".
func (c *builder) meshName(label string) string {
	for _, m := range c.r.Meshes {
		if m.Mesh == label {
			if m.Title == "" || strings.EqualFold(m.Title, label) {
				return label
			}
			return label + " (" + m.Title + ")"
		}
	}
	return label + " (not in " + c.p.ID + ")"
}

// meshes are the run's meshes, the study's first in its order, then the others.
func (c *builder) meshes() []string {
	var out []string
	for _, m := range c.r.Meshes {
		if m.Mesh != "" {
			out = append(out, m.Mesh)
		}
	}
	return append(out, c.r.Extra...)
}

func nan() analysis.Estimate {
	return analysis.Estimate{Value: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
}
