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

// TestObserveInboundLeavesOutTheChecksOwnPlaintext: what a pod's mesh traffic used is
// judged without the check's own plaintext from outside the mesh, which a permissive
// pod accepts by design; any other plaintext still shows.
func TestObserveInboundLeavesOutTheChecksOwnPlaintext(t *testing.T) {
	for _, c := range []struct {
		mtls, plaintext, outside uint64
		want                     string
		outsideKept              uint64
	}{
		{6, 1, 1, "mtls", 1},  // permissive: the mesh's pods used mTLS, the outsider plaintext
		{6, 2, 1, "mixed", 1}, // a mesh pod's request came in plaintext as well
		{6, 1, 0, "mixed", 0}, // strict passes 0: a plaintext request served is seen
		{0, 1, 1, "none", 1},  // only the outsider reached it
		{6, 0, 3, "mtls", 0},  // never more of them than the proxy counted in plaintext
		{0, 0, 0, "none", 0},
	} {
		var r PodEnrollment
		r.ObserveInbound(c.mtls, c.plaintext, c.outside)
		if r.MTLSObserved != c.want || r.OutsidePlaintext != c.outsideKept || r.InboundRequests != c.mtls+c.plaintext ||
			r.InboundMTLS != c.mtls || r.InboundPlaintext != c.plaintext {
			t.Errorf("ObserveInbound(%d, %d, %d) = %+v; want %q with %d from outside, the proxy's counts kept",
				c.mtls, c.plaintext, c.outside, r, c.want, c.outsideKept)
		}
		if noted := slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "from outside the mesh (the check's own) accepted") }); noted != (c.outsideKept > 0) {
			t.Errorf("ObserveInbound(%d, %d, %d) notes %q", c.mtls, c.plaintext, c.outside, r.Notes)
		}
	}
}
