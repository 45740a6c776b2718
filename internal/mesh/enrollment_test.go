package mesh

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
)

// TestJudgePlaintext pins the one judgment both platforms make of a mesh that promises
// to refuse plaintext: refusal counts only with every control answered.
func TestJudgePlaintext(t *testing.T) {
	refused := meshprobe.PlaintextProbe{Service: "reviews", Target: "pod reviews-v1 at 198.18.0.5:9080 (http)", Refused: true, Observed: "refused: connection reset"}
	served := meshprobe.PlaintextProbe{Service: "ratings", Target: "pod ratings-v1 at 198.18.0.6:9080 (http)", Observed: "served: HTTP 200"}
	answered := meshprobe.PlaintextProbe{Service: "reviews", Target: "pod reviews-v1 (https with a mesh certificate)", Observed: "answered: HTTP 200"}
	unanswered := meshprobe.PlaintextProbe{Service: "reviews", Target: "pod reviews-v1 (https with a mesh certificate)", Refused: true, Observed: "not answered: no route to host"}
	for _, c := range []struct {
		name            string
		probes, control []meshprobe.PlaintextProbe
		refused         bool
		failure         string // a substring of the one failure, or "" for none
	}{
		{"refused and controlled", []meshprobe.PlaintextProbe{refused, refused}, []meshprobe.PlaintextProbe{answered}, true, ""},
		{"one served", []meshprobe.PlaintextProbe{refused, served}, []meshprobe.PlaintextProbe{answered}, false,
			"service ratings served a plaintext request from outside the mesh (pod ratings-v1 at 198.18.0.6:9080 (http)): served: HTTP 200"},
		// A caller that reaches nothing sees every service "refuse".
		{"control not answered", []meshprobe.PlaintextProbe{refused}, []meshprobe.PlaintextProbe{unanswered}, false,
			"refusal of plaintext unproven: the positive control reviews"},
		{"no control", []meshprobe.PlaintextProbe{refused}, nil, false, "no positive control was answered"},
		{"nothing called", nil, []meshprobe.PlaintextProbe{answered}, false, "no service was called in plaintext"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := Enrollment{Pass: true}
			e.JudgePlaintext(c.probes, c.control)
			if e.PlaintextRefused == nil || *e.PlaintextRefused != c.refused {
				t.Errorf("plaintext refused %v, want %v", e.PlaintextRefused, c.refused)
			}
			if c.failure == "" && (!e.Pass || len(e.Failures) != 0) || c.failure != "" && (e.Pass || len(e.Failures) != 1 || !strings.Contains(e.Failures[0], c.failure)) {
				t.Errorf("pass %v, failures %q; want one failure containing %q (none if empty)", e.Pass, e.Failures, c.failure)
			}
			if !slices.Equal(e.Plaintext, c.probes) || !slices.Equal(e.PlaintextControl, c.control) {
				t.Errorf("kept %+v and %+v, want what was judged", e.Plaintext, e.PlaintextControl)
			}
		})
	}
}
