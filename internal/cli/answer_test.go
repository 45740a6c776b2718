package cli

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// answerStudy is the study file stored with answerRun: its SLO (p50 and p99 ≤ 5ms) is
// what `show` must judge the run by.
const answerStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: answer}
spec:
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: fast, profile: envoy-sidecar}
    - {name: twin, profile: linkerd}
    - {name: slow, profile: traefik-mesh}
  experiments:
    - {name: fixed, kind: fixed-rate, rate: 1000, duration: 5s, warmup: 1s}
  repeats: 5
  slo: {p50: 5ms, p99: 5ms, errorRate: 0.1%}
`

// storeAnswerRun stores a run of answerStudy: five interleaved repeats at 1000 req/s
// of latencies 300 µs + Exp(400 µs) (p99 about 2.1 ms) plus a shift per mesh: fast and
// twin +100 µs (one distribution), slow +4 ms (p99 about 6.1 ms, over the SLO). Two of
// slow's trials are flagged target-saturated. Each trial has resource and network
// samples, so `show --all` has its per-component and per-pod tables.
func storeAnswerRun(t *testing.T) (db, id string) {
	t.Helper()
	ctx := context.Background()
	db = filepath.Join(t.TempDir(), "results.db")
	s, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	started := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)
	run := &results.Run{Study: "answer", StudyPath: "answer.yaml", StudyFile: []byte(answerStudy), Seed: 9, Started: started,
		Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "fast", Profile: "envoy-sidecar"},
			{Label: "twin", Profile: "linkerd"}, {Label: "slow", Profile: "traefik-mesh"}}}
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 1))
	shift := map[string]int64{"none": 0, "fast": 100, "twin": 100, "slow": 4000}
	for rep := 0; rep < 5; rep++ {
		for i, m := range []string{"none", "fast", "twin", "slow"} {
			begin := started.Add(time.Duration(rep)*time.Minute + time.Duration(i)*10*time.Second)
			tr := &results.Trial{Repeat: rep, Mesh: m, Experiment: "fixed", Kind: results.KindFixedRate,
				Params: results.TrialParams{RequestedRate: 1000}, Start: begin, End: begin.Add(5 * time.Second),
				Result: results.TrialResult{Requests: 5000, Latency: results.NewLatencyHistogram()}}
			for j := 0; j < 5000; j++ {
				_ = tr.Result.Latency.RecordValue(300 + int64(rng.ExpFloat64()*400) + shift[m])
			}
			if m == "slow" && rep < 2 {
				tr.Result.Flags = []string{"target-saturated"}
			}
			for k := 0; k <= 5; k++ {
				at := begin.Add(time.Duration(k) * time.Second)
				cpu := 0.1 * float64(k) // 0.1 cores: 0.1 per 1000 req/s
				tr.Result.Resources = append(tr.Result.Resources, results.ResourceSample{Component: "app", Role: "workload", Pod: "productpage-0",
					Mesh: m, T: at, CPUUserSeconds: cpu, RSSBytes: 30 << 20})
				if m != "none" {
					tr.Result.Resources = append(tr.Result.Resources, results.ResourceSample{Component: "proxy", Role: "sidecar", Pod: "productpage-0",
						Mesh: m, T: at, CPUUserSeconds: 2 * cpu, RSSBytes: 40 << 20})
				}
				tr.Result.Network = append(tr.Result.Network, results.NetSample{Pod: "productpage-0", Mesh: m, Interface: "eth0", T: at,
					RxBytes: int64(k) * 1 << 20, TxBytes: int64(k) * 2 << 20, RxPackets: int64(k) * 1000, TxPackets: int64(k) * 1000})
			}
			if err := s.AddTrial(ctx, run.ID, tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	return db, run.ID
}

// `show` opens with the answer: the study's SLO, one table with each mesh's added
// latency, CPU, memory and verdict, the SLO and the saturation flagged beside the
// numbers they qualify, the meshes ranked with the open step named; the per-metric
// rows and the per-pod network table wait for --all.
func TestShowAnswersFirst(t *testing.T) {
	db, id := storeAnswerRun(t)
	out, code, err := execResults(t, "show", "last", "--db", db)
	if code != 0 {
		t.Fatalf("show: exit %d, %v\n%s", code, err, out)
	}
	lines := strings.Split(out, "\n")
	row := func(mesh string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, mesh+" ") {
				return l
			}
		}
		t.Fatalf("no row for %s:\n%s", mesh, out)
		return ""
	}
	for _, want := range []string{
		"SLO (set by the study): p50 ≤ 5ms, p99 ≤ 5ms, errors ≤ 0.1%",
		"95% intervals: paired t on 5 interleaved blocks of 5s\n",
		"fixed 1000 rps: 5 repeats; latency added to none's p50 ",
		"  slow: target saturated in 2 of 5 trials (trial ",
		"  slow: p99 ",
		"meshmark show " + id + " --all",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	// The saturation stands beside both added latencies, the SLO beside the p99, and
	// the verdict says both before any number.
	slow := row("slow")
	if !regexp.MustCompile(`slow +\+4\.\d\dms \[\+[\d.]+, \+[\d.]+\] \(target saturated 2/5\) +\+4\.\d\dms \[\+[\d.]+, \+[\d.]+\] \(target saturated 2/5; breaks SLO\) `).MatchString(slow) {
		t.Errorf("slow row does not carry its flags beside its numbers:\n%s", slow)
	}
	if !strings.Contains(slow, "saturated in 2 of 5 trials, so its latency is not comparable; breaks the SLO: p99 ") {
		t.Errorf("slow verdict does not lead with the saturation and the SLO:\n%s", slow)
	}
	// 0.2 cores of proxy and 0.3 of the whole system under test at 1000 req/s served.
	if fast := row("fast"); !strings.Contains(fast, " 0.2 (0.3) ") || !strings.Contains(fast, " 40MiB ") || strings.Contains(fast, "SLO") {
		t.Errorf("fast row: want 0.2 (0.3) cores per 1000 req/s, 40MiB of proxy, no SLO flag:\n%s", fast)
	}
	if !strings.Contains(row("none"), "- (0.1)") {
		t.Errorf("none row: want no proxy and 0.1 cores per 1000 req/s:\n%s", row("none"))
	}
	// slow's trials saturated, so its step is not a resolved "<" but says saturated
	if !regexp.MustCompile(`fastest to slowest at p50: (fast|twin) [~=] (fast|twin) ~ slow \(no step significant; (fast|twin) [~=] (fast|twin): .*; (fast|twin) ~ slow: \+[\d.]+% \[[^]]+\] saturated\)`).MatchString(out) {
		t.Errorf("p50 ranking does not leave fast and twin unresolved and slow last, saturated:\n%s", out)
	}
	for _, detail := range []string{"verdict table:", "overhead against none", "network per pod interface", "CORES/1000 RPS"} {
		if strings.Contains(out, detail) {
			t.Errorf("the default summary holds %q, which belongs to --all:\n%s", detail, out)
		}
	}
	all, code, err := execResults(t, "show", "last", "--db", db, "--all")
	if code != 0 {
		t.Fatalf("show --all: exit %d, %v", code, err)
	}
	if !strings.HasPrefix(all, out[:strings.Index(out, "\nsensitivity")]) {
		t.Errorf("show --all does not open with the same answer as show")
	}
	for _, detail := range []string{"verdict table:", "overhead against none", "network per pod interface", "productpage-0"} {
		if !strings.Contains(all, detail) {
			t.Errorf("show --all lacks %q:\n%s", detail, all)
		}
	}
}
