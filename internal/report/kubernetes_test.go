package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

// clusterRun is the synthetic run as a run on Kubernetes stores it: the baseline, which
// installs nothing, stores no enrollment check, and no container has a PSS.
func clusterRun(t *testing.T) *results.Run {
	run := syntheticRun(t)
	run.Substrate = "kubernetes"
	run.Meshes[0].Enrollment = nil
	for i := range run.Trials {
		for j := range run.Trials[i].Result.Resources {
			run.Trials[i].Result.Resources[j].PSSBytes = 0
		}
	}
	return run
}

// TestClusterBaselineEnrollmentNotApplicable: a baseline on a cluster installs nothing
// and has nothing to enroll, so its enrollment is n/a, not a failure; a local run
// without a stored check still fails it.
func TestClusterBaselineEnrollmentNotApplicable(t *testing.T) {
	var md bytes.Buffer
	if err := Render(&md, Markdown, clusterRun(t), nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if want := "| baseline | enrollment | n/a | the baseline installs no mesh on the cluster: there is nothing to enroll |"; !strings.Contains(md.String(), want) {
		t.Errorf("markdown lacks %q", want)
	}
	if strings.Contains(md.String(), "| baseline | enrollment | FAIL") {
		t.Error("markdown fails the cluster baseline's enrollment")
	}
	local := syntheticRun(t)
	local.Meshes[0].Enrollment = nil
	md.Reset()
	if err := Render(&md, Markdown, local, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| baseline | enrollment | FAIL | no equivalence check stored with this run |") {
		t.Error("a local run's missing check is no longer a failure")
	}
}
