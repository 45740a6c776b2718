package published

import (
	"slices"
	"strings"
	"testing"
)

// TestClaimsAreWellFormed checks the table of claims itself: unique ids, roles that
// exist, bands that contain the published figures, and a where and a figure to cite.
func TestClaimsAreWellFormed(t *testing.T) {
	ids := map[string]bool{}
	kinds := []string{"capacity", "fixed-rate", "steps", "soak", "users", "connections"}
	for _, s := range Studies() {
		if s.Title == "" || s.Source == "" || !strings.HasPrefix(s.Citation(), s.ID+", ") {
			t.Errorf("%s: citation %q", s.ID, s.Citation())
		}
		for _, c := range s.Claims {
			if ids[c.ID] || !strings.HasPrefix(c.ID, s.ID+"/") {
				t.Errorf("claim id %q repeated or not under %s", c.ID, s.ID)
			}
			ids[c.ID] = true
			if s.Role(c.A) == nil || s.Role(c.B) == nil {
				t.Errorf("%s: roles %q, %q not both in %s", c.ID, c.A, c.B, s.ID)
			}
			if c.A == c.B && c.BPath == "" {
				t.Errorf("%s compares %s with itself at one point", c.ID, c.A)
			}
			if !slices.Contains(kinds, c.At.Kind) || c.At.Published == "" || c.Figure == "" {
				t.Errorf("%s: kind %q, where %q, figure %q", c.ID, c.At.Kind, c.At.Published, c.Figure)
			}
			switch c.Kind {
			case Order:
				if c.Lo != 0 || c.Hi != 0 {
					t.Errorf("%s: an ordering with a band", c.ID)
				}
			case Ratio:
				lo, hi := c.Range()
				if c.Lo <= 0 || c.Lo > c.Hi || lo > c.Lo || hi < c.Hi || (c.Lo == c.Hi && lo == hi) || c.Band.Why == "" && c.Lo == c.Hi {
					t.Errorf("%s: published %g–%g, band %g–%g (%q)", c.ID, c.Lo, c.Hi, lo, hi, c.Band.Why)
				}
			default:
				t.Errorf("%s: kind %q", c.ID, c.Kind)
			}
		}
	}
}

func TestLookupAndIDs(t *testing.T) {
	if got := IDs(); !slices.Equal(got, []string{"S1", "S2", "S3", "S4", "S5"}) {
		t.Errorf("IDs %v", got)
	}
	if Lookup("s4") == nil || Lookup("S4").ID != "S4" || Lookup("S6") != nil {
		t.Error("Lookup")
	}
}

// TestAssign gives roles by stand and mTLS, each mesh once, the baseline to the
// baseline: S1's two Envoy sidecars split by mTLS, a faithful stand preferred to one
// that is unlike the study's mesh (and the reason carried), a mesh the study did not
// have takes no role. The stands are the test's own; the profiles' real ones are
// checked where they are all linked in (mesh/meshes).
func TestAssign(t *testing.T) {
	sidecar := []Stand{{For: "istio"}, {For: "appmesh", MTLS: "off", Unlike: "not App Mesh"}}
	s1 := Lookup("S1").Assign([]Mesh{
		{Label: "baseline"},
		{Label: "appmesh-like", Stands: sidecar, Options: map[string]string{"mtls": "disabled"}},
		{Label: "istio-like", Stands: sidecar, Options: map[string]string{"mtls": "strict"}},
	}, "baseline")
	if s1[0].Mesh != "istio-like" || s1[1].Mesh != "appmesh-like" || s1[1].Unlike != "not App Mesh" || s1[0].Unlike != "" {
		t.Errorf("S1: %+v", s1)
	}
	nodeProxy := []Stand{{For: "cilium", Unlike: "no eBPF"}}
	s5 := Lookup("S5").Assign([]Mesh{
		{Label: "base"}, {Label: "cilium-like", Stands: nodeProxy}, {Label: "ambient"},
		{Label: "istio-like", Stands: sidecar}, {Label: "real-cilium", Stands: []Stand{{For: "cilium"}}},
	}, "base")
	got := map[string]Assignment{}
	for _, a := range s5 {
		got[a.Role] = a
	}
	if got["baseline"].Mesh != "base" || got["linkerd"].Mesh != "" || got["istio"].Mesh != "istio-like" ||
		got["cilium"].Mesh != "real-cilium" || got["cilium"].Unlike != "" {
		t.Errorf("S5 with a faithful Cilium: %+v", s5)
	}
	s5 = Lookup("S5").Assign([]Mesh{{Label: "base"}, {Label: "cilium-like", Stands: nodeProxy}}, "base")
	if s5[3].Role != "cilium" || s5[3].Mesh != "cilium-like" || s5[3].Unlike != "no eBPF" {
		t.Errorf("S5 with the node proxy alone: %+v", s5)
	}
}
