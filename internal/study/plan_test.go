package study

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func planStudy(t *testing.T, order string, repeats int, seed uint64) *Study {
	t.Helper()
	doc := strings.Replace(minimal, "  meshes:\n", "  meshes:\n    - {name: m3, profile: envoy-sidecar}\n    - {name: m4, profile: envoy-sidecar, options: {mtls: strict}}\n", 1)
	doc += fmt.Sprintf("    - {name: soak, kind: soak, rate: 100, duration: 30s}\n  order: %s\n  repeats: %d\n  seed: %d\n", order, repeats, seed)
	s, err := Parse("plan.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func signature(trials []Trial) []string {
	var out []string
	for _, tr := range trials {
		out = append(out, fmt.Sprintf("%d/%d/%s/%s/%v", tr.Stage, tr.Repeat, tr.Mesh.Name, tr.Experiment.Name, tr.BringUp))
	}
	return out
}

func TestPlanInterleavedBlocks(t *testing.T) {
	s := planStudy(t, "interleaved", 5, 42)
	trials := s.Plan()
	meshes, exps := len(s.Spec.Meshes), len(s.Spec.Experiments)
	if len(trials) != meshes*exps*s.Spec.Repeats {
		t.Fatalf("%d trials, want %d", len(trials), meshes*exps*s.Spec.Repeats)
	}
	// Dependencies: every capacity trial before the first fixed-rate trial.
	lastCap, firstLat := -1, len(trials)
	for i, tr := range trials {
		if tr.Seq != i {
			t.Fatalf("trial %d has Seq %d", i, tr.Seq)
		}
		switch tr.Experiment.Name {
		case "cap":
			lastCap = i
		case "lat":
			firstLat = min(firstLat, i)
		}
	}
	if lastCap > firstLat {
		t.Errorf("a capacity trial (%d) runs after a fixed-rate trial that needs it (%d)", lastCap, firstLat)
	}
	// Blocks: within a stage, each repeat is a contiguous run holding every mesh
	// exactly once, with that mesh's experiments of the stage back to back.
	orders := map[string]bool{}
	for i := 0; i < len(trials); {
		stage, rep := trials[i].Stage, trials[i].Repeat
		seen := map[string]bool{}
		var order []string
		for i < len(trials) && trials[i].Stage == stage && trials[i].Repeat == rep {
			m := trials[i].Mesh.Name
			if !seen[m] {
				seen[m] = true
				order = append(order, m)
				if !trials[i].BringUp && (i == 0 || trials[i-1].Mesh.Name != m) {
					t.Errorf("trial %d switches to mesh %s without a bring-up", i, m)
				}
			} else if trials[i-1].Mesh.Name != m {
				t.Errorf("stage %d repeat %d: mesh %s appears twice, not back to back", stage, rep, m)
			} else if trials[i].BringUp {
				t.Errorf("trial %d brings up %s again although it is already up", i, m)
			}
			i++
		}
		if len(seen) != meshes {
			t.Errorf("stage %d repeat %d holds %d meshes, want %d", stage, rep, len(seen), meshes)
		}
		orders[strings.Join(order, ",")] = true
	}
	// 10 blocks of 4 meshes in a seeded random order: all identical would mean no shuffle.
	if len(orders) < 2 {
		t.Errorf("every block has the same mesh order %v: the order is not randomised", orders)
	}
}

func TestPlanDeterministic(t *testing.T) {
	a := signature(planStudy(t, "interleaved", 4, 7).Plan())
	b := signature(planStudy(t, "interleaved", 4, 7).Plan())
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same study and seed gave two different plans")
	}
	differs := false
	for seed := uint64(8); seed < 16 && !differs; seed++ {
		differs = !reflect.DeepEqual(a, signature(planStudy(t, "interleaved", 4, seed).Plan()))
	}
	if !differs {
		t.Error("eight other seeds all gave the plan of seed 7")
	}
}

// TestPlanStableAcrossVersions pins the order one seed produces: a recorded seed must
// reproduce a run's order with any later meshmark or Go version.
func TestPlanStableAcrossVersions(t *testing.T) {
	r := newSplitMix(1)
	var got []int
	for range 3 {
		got = append(got, r.permutation(4)...)
	}
	// SplitMix64 from state 1: outputs 0x910a2dec89025cc1, 0xbeeb8da1658eec67, ...
	first := newSplitMix(1).next()
	if first != 0x910a2dec89025cc1 {
		t.Fatalf("SplitMix64 first output %#x, want the reference 0x910a2dec89025cc1", first)
	}
	again := newSplitMix(1)
	var want []int
	for range 3 {
		want = append(want, again.permutation(4)...)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("permutations differ for one seed: %v vs %v", got, want)
	}
}

func TestPlanSequential(t *testing.T) {
	s := planStudy(t, "sequential", 3, 1)
	trials := s.Plan()
	// Stage 0 holds cap and soak: for mesh base, repeats 0,1,2 each cap then soak.
	var got []string
	for _, tr := range trials[:6] {
		got = append(got, fmt.Sprintf("%s/%d/%s", tr.Mesh.Name, tr.Repeat, tr.Experiment.Name))
	}
	want := []string{"m3/0/cap", "m3/0/soak", "m3/1/cap", "m3/1/soak", "m3/2/cap", "m3/2/soak"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sequential start %v, want %v", got, want)
	}
	bringUps := countBringUps(trials)
	// One bring-up per mesh per stage: 4 meshes x 2 stages.
	if bringUps != 8 {
		t.Errorf("%d bring-ups, want 8", bringUps)
	}
}

func TestPlanFreshBringUpPerRepeat(t *testing.T) {
	s := planStudy(t, "sequential", 3, 1)
	s.Spec.FreshBringUpPerRepeat = true
	bringUps := countBringUps(s.Plan())
	// Every (mesh, repeat, stage) starts fresh: 4 x 3 x 2.
	if bringUps != 24 {
		t.Errorf("%d bring-ups, want 24", bringUps)
	}
}

func TestBelowIsUnbiased(t *testing.T) {
	r := newSplitMix(3)
	counts := make([]int, 3)
	const n = 30000
	for range n {
		counts[r.below(3)]++
	}
	for i, c := range counts {
		if c < n/3-600 || c > n/3+600 { // ~7 standard deviations
			t.Errorf("value %d drawn %d times of %d", i, c, n)
		}
	}
}

// A security experiment, wherever the file lists it, runs once per mesh after that
// mesh's load experiments of its stage, and the next trial brings the mesh up afresh.
func TestPlanSecurityOncePerMeshAndLast(t *testing.T) {
	doc := strings.Replace(minimal, "  experiments:\n", "  experiments:\n    - {name: sec, kind: security}\n", 1) + "  repeats: 3\n  seed: 9\n"
	s, err := Parse("plan.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	trials := s.Plan()
	perMesh := map[string]int{}
	for i, tr := range trials {
		if tr.Experiment.Name != "sec" {
			continue
		}
		perMesh[tr.Mesh.Name]++
		if tr.Repeat != 0 {
			t.Errorf("security trial in repeat %d", tr.Repeat)
		}
		if i > 0 && trials[i-1].Mesh == tr.Mesh && trials[i-1].Stage == tr.Stage && trials[i-1].Experiment.Kind == KindSecurity {
			t.Errorf("two security trials of %s in a row", tr.Mesh.Name)
		}
		for j := i + 1; j < len(trials) && trials[j].Mesh == tr.Mesh && trials[j].Repeat == tr.Repeat && trials[j].Stage == tr.Stage; j++ {
			if !trials[j].BringUp {
				t.Errorf("%s: %s runs after the security probes on the same bring-up", tr.Mesh.Name, trials[j].Experiment.Name)
			}
		}
		if i+1 < len(trials) && !trials[i+1].BringUp {
			t.Errorf("trial after security (%s %s) reuses the probed deployment", trials[i+1].Mesh.Name, trials[i+1].Experiment.Name)
		}
	}
	for _, m := range s.Spec.Meshes {
		if perMesh[m.Name] != 1 {
			t.Errorf("mesh %s: %d security trials, want 1", m.Name, perMesh[m.Name])
		}
	}
	if e := s.Experiment("sec"); e.Requests != defaultSecurityRequests || len(e.Probes) != 5 {
		t.Errorf("defaults: requests %d, probes %v", e.Requests, e.Probes)
	}
	t.Log(signature(trials))
}

// With keepMeshesUp each mesh is brought up once per stage, by its first trial of the
// stage (the stage before searched its capacity, past its knee), and interleaved
// trials switch between meshes that stay up; a fresh bring-up per repeat then comes
// when the same mesh's repeat changes, and a security trial still sends its mesh's next
// trial to a new bring-up. The extra rounds of a precision target bring nothing up.
func TestPlanKeepMeshesUp(t *testing.T) {
	s := planStudy(t, "interleaved", 3, 7)
	s.Spec.KeepMeshesUp = true
	trials := s.Plan()
	seen := map[string]bool{}
	for _, tr := range trials {
		key := fmt.Sprintf("%s in stage %d", tr.Mesh.Name, tr.Stage)
		if first := !seen[key]; tr.BringUp != first {
			t.Errorf("%s %s repeat %d: bring-up %v, want %v (first trial of the mesh in the stage)", key, tr.Experiment.Name, tr.Repeat, tr.BringUp, first)
		}
		seen[key] = true
	}
	if len(seen) != 2*len(s.Spec.Meshes) {
		t.Errorf("meshes and stages %v, want every mesh in both stages", seen)
	}
	extra := s.ExtraRound(3, trials)
	if len(extra) == 0 {
		t.Fatal("no extra round")
	}
	for _, tr := range extra {
		if tr.BringUp {
			t.Errorf("extra round: %s brought up again", tr.Mesh.Name)
		}
	}
	if extra[0].Seq != len(trials) {
		t.Errorf("extra round starts at Seq %d, want %d", extra[0].Seq, len(trials))
	}

	s.Spec.FreshBringUpPerRepeat = true
	bringUps := countBringUps(s.Plan())
	// every (mesh, repeat, stage): 4 meshes x 3 repeats x 2 stages, as without keepMeshesUp
	if bringUps != 24 {
		t.Errorf("keepMeshesUp with freshBringUpPerRepeat: %d bring-ups, want 24", bringUps)
	}

	doc := strings.Replace(minimal, "  experiments:\n", "  experiments:\n    - {name: sec, kind: security}\n", 1) + "  repeats: 2\n  seed: 9\n  keepMeshesUp: true\n"
	sec, err := Parse("plan.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]Trial{}
	for _, tr := range sec.Plan() {
		if prev, ok := last[tr.Mesh.Name]; ok && prev.Experiment.Kind == KindSecurity && !tr.BringUp {
			t.Errorf("%s %s runs on the deployment the security probes disturbed", tr.Mesh.Name, tr.Experiment.Name)
		}
		last[tr.Mesh.Name] = tr
	}
}

// countBringUps counts the trials of a plan that bring their mesh up.
func countBringUps(plan []Trial) int {
	n := 0
	for _, tr := range plan {
		if tr.BringUp {
			n++
		}
	}
	return n
}

// Remeasure runs an experiment's trials so far again after the one that called for it:
// the same meshes and repeats in the same order, numbered on, with a bring-up wherever
// the mesh or the stage changes, and the rest of the plan after them.
func TestRemeasure(t *testing.T) {
	s := planStudy(t, "interleaved", 3, 7)
	plan := s.Plan()
	lat := s.Experiment("lat")
	at := -1
	var again []string
	for i, tr := range plan {
		if tr.Experiment == lat {
			again = append(again, fmt.Sprintf("%d/%s", tr.Repeat, tr.Mesh.Name))
			if len(again) == 5 {
				at = i
				break
			}
		}
	}
	if at < 0 {
		t.Fatal("the plan has fewer than 5 lat trials")
	}
	out := s.Remeasure(plan, at, lat)
	if len(out) != len(plan)+5 {
		t.Fatalf("%d trials, want %d", len(out), len(plan)+5)
	}
	var got []string
	for _, tr := range out[at+1 : at+6] {
		got = append(got, fmt.Sprintf("%d/%s", tr.Repeat, tr.Mesh.Name))
	}
	if !reflect.DeepEqual(got, again) {
		t.Errorf("measured again: %v, want %v", got, again)
	}
	if !reflect.DeepEqual(signature(out[:at+1]), signature(plan[:at+1])) || !reflect.DeepEqual(out[at+6:][0].Mesh, plan[at+1].Mesh) {
		t.Errorf("the plan around the inserted trials changed")
	}
	for i, tr := range out {
		bringUp := i == 0 || out[i-1].Mesh != tr.Mesh || out[i-1].Stage != tr.Stage
		if tr.Seq != i || tr.BringUp != bringUp {
			t.Errorf("trial %d: seq %d, bring-up %v; want %d, %v", i, tr.Seq, tr.BringUp, i, bringUp)
		}
	}
	// Backing off again from the last of them measures the same five again, not the
	// ten that ran.
	again2 := s.Remeasure(out, at+5, lat)
	got = nil
	for _, tr := range again2[at+6 : at+11] {
		got = append(got, fmt.Sprintf("%d/%s", tr.Repeat, tr.Mesh.Name))
	}
	if len(again2) != len(out)+5 || !reflect.DeepEqual(got, again) {
		t.Errorf("second back-off: %d trials, measured again %v; want %d, %v", len(again2), got, len(out)+5, again)
	}
}

// An experiment's own repeats replace the study's: a few capacity searches, then many
// short latency blocks, each block still holding every mesh once.
func TestPlanExperimentRepeats(t *testing.T) {
	doc := strings.Replace(minimal, "      duration: 15s\n", "      duration: 15s\n      repeats: 2\n", 1)
	doc = strings.Replace(doc, "      duration: 20s\n", "      duration: 1s\n      warmup: 100ms\n      repeats: 7\n", 1)
	s, err := Parse("plan.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]map[int]int{} // experiment → repeat → trials
	for _, tr := range s.Plan() {
		if count[tr.Experiment.Name] == nil {
			count[tr.Experiment.Name] = map[int]int{}
		}
		count[tr.Experiment.Name][tr.Repeat]++
	}
	for exp, want := range map[string]int{"cap": 2, "lat": 7} {
		if len(count[exp]) != want {
			t.Errorf("%s ran %d repeats, want %d (spec.repeats is %d)", exp, len(count[exp]), want, s.Spec.Repeats)
		}
		for r, n := range count[exp] {
			if n != len(s.Spec.Meshes) {
				t.Errorf("%s repeat %d holds %d trials, want one per mesh (%d)", exp, r, n, len(s.Spec.Meshes))
			}
		}
	}
	bad := strings.Replace(minimal, "      duration: 20s\n", "      duration: 20s\n      repeats: 0\n", 1)
	if _, err := Parse("bad.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "spec.experiments[1].repeats") {
		t.Errorf("repeats: 0 gave %v, want an error naming spec.experiments[1].repeats", err)
	}
}

// A mesh's first trial of a new stage runs on a fresh deployment on the local
// substrate (the stage before drove it past its knee in a capacity search); on a
// cluster, where a bring-up is a Helm install, the mesh stays installed.
func TestNewStageBringsUpAfreshLocally(t *testing.T) {
	s := planStudy(t, "interleaved", 3, 7)
	plan := s.Plan()
	var prev, next *Trial
	for i := range plan {
		if plan[i].Stage == 1 {
			next = &plan[i]
			break
		}
	}
	if next == nil {
		t.Fatal("the plan has no second stage")
	}
	for i := range plan {
		if plan[i].Stage == 0 && plan[i].Mesh == next.Mesh {
			prev = &plan[i]
		}
	}
	if prev == nil {
		t.Fatalf("%s has no trial in the first stage", next.Mesh.Name)
	}
	if !s.Spec.needsBringUp(prev, next) {
		t.Errorf("local: %s's first trial of stage 1 runs on its stage-0 deployment", next.Mesh.Name)
	}
	s.Spec.Substrate.Kubernetes = &KubernetesSubstrate{}
	if s.Spec.needsBringUp(prev, next) {
		t.Errorf("cluster: %s is installed again for stage 1", next.Mesh.Name)
	}
}
