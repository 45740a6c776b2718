package report

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
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

// TestClusterMemoryIsTheWorkingSet: a cluster run's memory is each container's working
// set, as its kubelet reports it, and is called so, not RSS; PSS, which no kubelet
// reports, is n/a, not 0.0 MiB. A local run keeps RSS.
func TestClusterMemoryIsTheWorkingSet(t *testing.T) {
	run := clusterRun(t)
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	if want := regexp.MustCompile(`\| CPU avg \(cores\) \| CPU peak \(cores\) \| working set avg \(MiB\) \| working set peak \(MiB\) \|`); !want.Match(md.Bytes()) || strings.Contains(md.String(), "RSS avg") {
		t.Errorf("markdown does not call the memory the working set")
	}
	var text bytes.Buffer
	if err := analysis.WriteRunSummary(&text, run, analysis.Analyze(run, analysis.Options{Seed: 1}, nil)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "WORKING SET MEAN") || !regexp.MustCompile(`(?m)MiB\s+n/a\s*$`).Match(text.Bytes()) || strings.Contains(text.String(), "RSS MEAN") {
		t.Errorf("text summary does not call memory the working set with PSS n/a:\n%s", text.String())
	}
	local := syntheticRun(t)
	md.Reset()
	if err := Render(&md, Markdown, local, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	text.Reset()
	if err := analysis.WriteRunSummary(&text, local, analysis.Analyze(local, analysis.Options{Seed: 1}, nil)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| RSS avg (MiB) |") || !strings.Contains(text.String(), "RSS MEAN") || regexp.MustCompile(`(?m)MiB\s+n/a\s*$`).Match(text.Bytes()) {
		t.Error("a local run's memory is no longer RSS, or its PSS n/a")
	}
}

// TestClusterProvenance: a cluster run's provenance names the cluster, its version,
// every node as its kubelet reports itself and the images the pods ran with their
// digests; the machine meshmark ran on is said to be that, not where it measured.
func TestClusterProvenance(t *testing.T) {
	run := clusterRun(t)
	run.Provenance.Cluster = &results.ClusterProvenance{Server: "https://198.18.0.1:6443", Context: "meshmark-local", ServerVersion: "v1.37.2",
		Nodes: []results.ClusterNode{
			{Name: "node-0", KubeletVersion: "v1.37.2", OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.1.0-28-amd64", ContainerRuntime: "containerd://1.6.20", Architecture: "amd64", CPU: "2", Memory: "23Gi"},
			{Name: "node-1", KubeletVersion: "v1.37.2", OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.1.0-28-amd64", ContainerRuntime: "containerd://1.6.20", Architecture: "amd64", CPU: "2", Memory: "23Gi"},
		},
		Images: []results.PodImage{{Mesh: "baseline", Container: "app", Image: "meshmark:dev", ImageID: "docker.io/library/meshmark@sha256:0123", Pods: 6}},
	}
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| meshmark's host: Host | bench-1 |",
		"| cluster | https://198.18.0.1:6443 (context meshmark-local) |",
		"| cluster: Kubernetes | v1.37.2 |", "| cluster: nodes | 2 |",
		"| node node-1 | kubelet v1.37.2, Debian GNU/Linux 12 (bookworm), kernel 6.1.0-28-amd64, containerd://1.6.20, amd64, 2 CPUs, 23Gi memory |",
		"| image: baseline, container app | meshmark:dev (docker.io/library/meshmark@sha256:0123), 6 pods |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown provenance lacks %q", want)
		}
	}
	if local := provenanceRows(Summarize(syntheticRun(t), nil, Options{})); local[0][0] != "Host" {
		t.Errorf("a local run's first provenance row is %q, want Host", local[0])
	}
}

// TestMTLSOnTheWireCountsThePodsLookedAt: the check counts the service pods whose
// inbound the enrollment looked at on the wire, as the answer's security column does:
// an ingress gateway, which takes plaintext from outside by design and is not looked
// at, does not fail it (S1's run printed "strict mTLS seen 12/12" beside a failed
// "12/13"); a pod that saw nothing, or plaintext, still does; and where nothing was
// looked at there is no such check.
func TestMTLSOnTheWireCountsThePodsLookedAt(t *testing.T) {
	check := func(enr string) (CheckRow, bool) {
		var e enrollment
		if err := json.Unmarshal([]byte(enr), &e); err != nil {
			t.Fatal(err)
		}
		for _, c := range enrollmentChecks(results.Mesh{Label: "m"}, e) {
			if strings.HasPrefix(c.Check, "mTLS on the wire") {
				return c, true
			}
		}
		return CheckRow{}, false
	}
	const pods = `{"pod":"a-0","service":"a","meshed":true,"mtls_observed":"mtls"},{"pod":"b-0","service":"b","meshed":true,"mtls_observed":"mtls"}`
	gateway := `{"pod":"gw-0","service":"ingress-gateway","meshed":true}`
	if c, ok := check(`{"mtls":"strict","pass":true,"pods":[` + pods + `,` + gateway + `]}`); !ok || !c.Pass || !strings.HasPrefix(c.Detail, "2/2 ") {
		t.Errorf("with a gateway not looked at: %+v (present %v); want a pass, 2/2", c, ok)
	}
	for _, seen := range []string{"none", "plaintext", "mixed"} {
		other := `{"pod":"c-0","service":"c","meshed":true,"mtls_observed":"` + seen + `"}`
		if c, ok := check(`{"mtls":"strict","pass":true,"pods":[` + pods + `,` + other + `]}`); !ok || c.Pass {
			t.Errorf("a pod that saw %s: %+v (present %v); want a failure", seen, c, ok)
		}
	}
	if c, ok := check(`{"mtls":"strict","pass":true,"pods":[` + gateway + `]}`); ok {
		t.Errorf("nothing looked at on the wire: %+v; want no such check", c)
	}
	// Permissive: the check's own plaintext from outside the mesh, accepted as the mode
	// promises, is left out of what each pod saw (mesh.PodEnrollment.ObserveInbound),
	// and the row says it was accepted.
	permissive := `{"pod":"a-0","service":"a","meshed":true,"mtls_observed":"mtls","outside_plaintext_requests":1},` +
		`{"pod":"b-0","service":"b","meshed":true,"mtls_observed":"mtls","outside_plaintext_requests":2}`
	if c, ok := check(`{"mtls":"permissive","pass":true,"pods":[` + permissive + `]}`); !ok || !c.Pass ||
		c.Detail != "2/2 service pods saw only mTLS from the mesh's pods, 0 saw plaintext; the check's own 3 plaintext requests from outside the mesh were accepted, as permissive mTLS allows" {
		t.Errorf("permissive, the outsider's plaintext accepted: %+v (present %v); want a pass that says so", c, ok)
	}
}

// TestPlaintextRowSaysHowEachRequestEnded: the row "plaintext from outside refused"
// reads the proof either platform stores (mesh.Enrollment.JudgePlaintext): how many
// requests were refused and how, and whether their positive controls were answered; a
// positive control not answered fails the row. A run stored before the proof was kept
// still reads.
func TestPlaintextRowSaysHowEachRequestEnded(t *testing.T) {
	row := func(e mesh.Enrollment) CheckRow {
		raw, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var stored enrollment
		if err := json.Unmarshal(raw, &stored); err != nil {
			t.Fatal(err)
		}
		for _, c := range enrollmentChecks(results.Mesh{Label: "istio"}, stored) {
			if c.Check == "plaintext from outside refused" {
				return c
			}
		}
		t.Fatalf("no plaintext row for %s", raw)
		return CheckRow{}
	}
	refused := func(svc string) meshprobe.PlaintextProbe {
		return meshprobe.PlaintextProbe{Service: svc, Refused: true, Observed: "refused: connection reset"}
	}
	answered := meshprobe.PlaintextProbe{Service: "meshmark-plaintext-control", Observed: "answered: HTTP 200"}
	var e mesh.Enrollment
	e.JudgePlaintext([]meshprobe.PlaintextProbe{refused("details"), refused("reviews"), refused("ratings")}, []meshprobe.PlaintextProbe{answered, answered})
	if c := row(e); !c.Pass || c.Detail != "plaintext from outside the mesh refused 3 of 3 times (3× refused: connection reset); positive controls answered 2 of 2 (2× answered: HTTP 200)" {
		t.Errorf("refused and controlled: %+v", c)
	}
	var blind mesh.Enrollment
	blind.JudgePlaintext([]meshprobe.PlaintextProbe{refused("details")}, []meshprobe.PlaintextProbe{{Service: "ztunnel metrics on node n1", Refused: true, Observed: "not answered: no route to host"}})
	if c := row(blind); c.Pass || !strings.Contains(c.Detail, "positive controls answered 0 of 1 (1× not answered: no route to host)") {
		t.Errorf("control not answered: %+v; want a failure saying so", c)
	}
	old := true
	if c := row(mesh.Enrollment{PlaintextRefused: &old}); !c.Pass || c.Detail != "a plaintext request from outside the mesh was refused by every service pod" {
		t.Errorf("a run stored before the proof was kept: %+v", c)
	}
}
