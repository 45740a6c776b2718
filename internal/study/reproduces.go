package study

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/published"
)

// reproduces checks spec.reproduces: a published study by its id, and warns of what
// the study compared that this file cannot (a mesh no profile here stands for, an
// experiment kind its figures were measured with), since those figures will be marked
// not measured rather than compared.
func (c *checker) reproduces() {
	spec := &c.s.Spec
	if !c.has("spec.reproduces") {
		return
	}
	ids := published.IDs()
	p := published.Lookup(spec.Reproduces)
	if p == nil || p.ID != spec.Reproduces {
		c.errAt("spec.reproduces", "%q: not a published study meshmark reproduces (expected one of %s)%s",
			spec.Reproduces, strings.Join(ids, ", "), suggest(spec.Reproduces, ids))
		return
	}
	var meshes []published.Mesh
	for _, m := range spec.Meshes {
		opts := map[string]string{}
		for k, v := range m.Options {
			opts[k] = fmt.Sprint(v)
		}
		meshes = append(meshes, published.Mesh{Label: m.Name, Stands: mesh.StandsOf(m.Profile), Options: opts})
	}
	for _, a := range p.Assign(meshes, spec.Baseline) {
		if a.Mesh != "" {
			continue
		}
		r := p.Role(a.Role)
		what := "no mesh is the baseline"
		if !r.Baseline {
			what = "no mesh here can stand for it (" + mesh.StandingFor(r) + ")"
		}
		c.s.Warnings = append(c.s.Warnings, fmt.Sprintf("spec.reproduces: %s compared %s, but %s: its figures about %s will be marked not measured",
			p.ID, r.Title, what, r.Title))
	}
	var kinds []string
	for _, e := range spec.Experiments {
		kinds = append(kinds, string(e.Kind))
	}
	var missing []string
	for _, cl := range p.Claims {
		if !slices.Contains(kinds, cl.At.Kind) && !slices.Contains(missing, cl.At.Kind) {
			missing = append(missing, cl.At.Kind)
		}
	}
	for _, k := range missing {
		c.s.Warnings = append(c.s.Warnings, fmt.Sprintf("spec.reproduces: %s published figures measured by a %s experiment, and this study has none: they will be marked not measured", p.ID, k))
	}
}
