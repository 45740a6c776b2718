package analysis

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

func securityRun(id string, outcomes map[string]map[string]results.SecurityOutcome) *results.Run {
	run := &results.Run{ID: id}
	for _, mesh := range []string{"none", "strict", "permissive"} {
		run.Meshes = append(run.Meshes, results.Mesh{Label: mesh})
		probes, ok := outcomes[mesh]
		if !ok {
			continue
		}
		var ps []results.SecurityProbe
		// stored out of order: the matrix puts them in results.SecurityProbes order
		for i := len(results.SecurityProbes) - 1; i >= 0; i-- {
			p := results.SecurityProbes[i]
			if o, ok := probes[p]; ok {
				ps = append(ps, results.SecurityProbe{Probe: p, Outcome: o, Summary: p + " " + string(o)})
			}
		}
		run.Trials = append(run.Trials, results.Trial{Mesh: mesh, Experiment: "sec", Kind: results.KindSecurity, Result: results.TrialResult{Security: ps}})
	}
	return run
}

func TestSecurityMatrixOrderAndText(t *testing.T) {
	run := securityRun("a", map[string]map[string]results.SecurityOutcome{
		"strict":     {results.ProbeEncryption: results.SecurityPass, results.ProbePlaintext: results.SecurityFail},
		"permissive": {results.ProbeEncryption: results.SecurityPass, results.ProbePlaintext: results.SecurityExpected},
	})
	cells := SecurityMatrix(run)
	var got []string
	for _, c := range cells {
		got = append(got, c.Mesh+"/"+c.Probe)
	}
	want := "strict/encryption strict/plaintext-refused permissive/encryption permissive/plaintext-refused"
	if strings.Join(got, " ") != want {
		t.Errorf("matrix order %v, want %s", got, want)
	}
	var b bytes.Buffer
	if err := WriteSecurityMatrix(&b, cells); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{"ENCRYPTION", "PLAINTEXT-REFUSED", "FAIL strict plaintext-refused"} {
		if !strings.Contains(out, s) {
			t.Errorf("matrix text lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "FAIL permissive") {
		t.Errorf("an expected outcome printed as a failure:\n%s", out)
	}
}

// A gate fails on a probe that fails now and did not before, and on a failing probe
// the old run did not have; a probe that failed in both runs is no regression, and
// an expected outcome is never one.
func TestSecurityGate(t *testing.T) {
	g, err := ParseGate(" Security ")
	if err != nil || !g.Security || g.String() != "security" {
		t.Fatalf("ParseGate(security) = %+v, %v", g, err)
	}
	if _, err := ParseGate("securty"); err == nil || !strings.Contains(err.Error(), "the gate security") {
		t.Errorf("misspelt gate: %v", err)
	}
	a := securityRun("a", map[string]map[string]results.SecurityOutcome{
		"strict":     {results.ProbeEncryption: results.SecurityPass, results.ProbeBypass: results.SecurityFail},
		"permissive": {results.ProbePlaintext: results.SecurityExpected},
	})
	b := securityRun("b", map[string]map[string]results.SecurityOutcome{
		"strict":     {results.ProbeEncryption: results.SecurityFail, results.ProbeBypass: results.SecurityFail, results.ProbeIdentity: results.SecurityFail},
		"permissive": {results.ProbePlaintext: results.SecurityExpected},
	})
	rs, failed := CheckSecurityGate(g, CompareSecurity(a, b, nil))
	if !failed {
		t.Fatal("gate passed with a new failure")
	}
	regressed := map[string]bool{}
	for _, r := range rs {
		if r.Failed {
			regressed[r.Security.Mesh+"/"+r.Security.Probe] = true
		}
	}
	if len(regressed) != 2 || !regressed["strict/encryption"] || !regressed["strict/identity"] {
		t.Errorf("regressions %v, want strict/encryption (pass → fail) and strict/identity (not run → fail)", regressed)
	}
	if _, failed := CheckSecurityGate(g, CompareSecurity(b, b, nil)); failed {
		t.Error("a run compared with itself failed the gate")
	}
	if rs, _ := CheckSecurityGate(g, CompareSecurity(a, b, []string{"permissive"})); len(rs) != 1 || rs[0].Failed {
		t.Errorf("--mesh permissive: %+v", rs)
	}
	if _, err := CompareRuns(a, b, nil, Options{Seed: 1}); err != nil {
		t.Errorf("runs with only security trials in common: %v", err)
	}
}

// TestPostureOfAPermissiveMesh: the security column of a permissive mesh counts the
// service pods whose mesh traffic was mTLS only (the check's own plaintext from outside
// the mesh left out of it) and says that plaintext from outside was accepted, as the
// mode promises; a strict mesh's proof of refusal is said as before.
func TestPostureOfAPermissiveMesh(t *testing.T) {
	run := &results.Run{Meshes: []results.Mesh{
		{Label: "permissive", Profile: "linkerd", Enrollment: []byte(`{"mtls":"permissive","pass":true,"pods":[
			{"service":"a","meshed":true,"mtls_observed":"mtls","outside_plaintext_requests":1},
			{"service":"b","meshed":true,"mtls_observed":"mtls","outside_plaintext_requests":1}]}`)},
		{Label: "strict", Profile: "linkerd", Enrollment: []byte(`{"mtls":"strict","pass":true,"plaintext_refused":true,"pods":[
			{"service":"a","meshed":true,"mtls_observed":"mtls"}]}`)},
	}}
	for mesh, want := range map[string]string{
		"permissive": "permissive mTLS seen 2/2, plaintext accepted",
		"strict":     "strict mTLS seen 1/1, plaintext refused",
	} {
		if got, flags := securityPosture(run, mesh); got != want || len(flags) != 0 {
			t.Errorf("%s: posture %q, flags %v; want %q", mesh, got, flags, want)
		}
	}
}
