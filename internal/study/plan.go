package study

import "slices"

// Trial is one experiment run against one mesh in one repeat: the unit the runner
// executes and the results store keys by.
type Trial struct {
	// Seq is the trial's position in the run, from 0.
	Seq int
	// Stage groups experiments by dependency: stage 0 needs nothing, stage n needs
	// capacities measured in stage n-1. Every trial of a stage runs before any trial
	// of the next, so a rate like "75% of lowest capacity" can see every mesh's
	// capacity from every repeat.
	Stage int
	// Repeat counts from 0. In interleaved order a repeat is a block holding every
	// mesh once.
	Repeat     int
	Mesh       *Mesh
	Experiment *Experiment
	// BringUp is true when the runner must (re)create the workload and mesh before
	// this trial: the mesh differs from the previous trial's, the study asks for a
	// fresh bring-up per repeat and the repeat changed, the previous trial was a
	// security one (its probes change policies and interception), or, on the local
	// substrate, the previous trial was of an earlier stage (a capacity search, which
	// drove the deployment past its knee). With KeepMeshesUp the previous trial is the
	// same mesh's, which stayed up meanwhile.
	BringUp bool
}

// needsBringUp says whether t needs its mesh (re)created, after prev: the trial before
// it in the run, or with KeepMeshesUp the last trial of the same mesh (nil if none).
//
// On the local substrate a new stage starts on fresh deployments, because the stage
// before it searched each mesh's capacity, past its knee: on the demo's deployments
// kept up from the search, the latency blocks' p99 varied so much from block to block
// that its interval was ±35–48 %, against ±8 % on deployments that had not been
// through it (docs/study.md). On a cluster a bring-up is a Helm install, and a mesh
// stays installed across the stage as before.
func (spec *Spec) needsBringUp(prev *Trial, t *Trial) bool {
	return prev == nil || prev.Mesh != t.Mesh || (spec.FreshBringUpPerRepeat && prev.Repeat != t.Repeat) ||
		prev.Experiment.Kind == KindSecurity || (prev.Stage != t.Stage && spec.Substrate.Kubernetes == nil)
}

// previousFor is the trial needsBringUp compares t with, among the trials before it.
func (spec *Spec) previousFor(before []Trial, t *Trial) *Trial {
	for i := len(before) - 1; i >= 0; i-- {
		if !spec.KeepMeshesUp || before[i].Mesh == t.Mesh {
			return &before[i]
		}
	}
	return nil
}

// Plan expands the study into trials in run order: for each dependency stage, then
// either (interleaved) each repeat as a block with every mesh once in an order drawn
// from the seed, or (sequential) each mesh in file order with all its repeats in a
// row. A mesh's experiments of one stage run back to back, in file order, on one
// bring-up, except security experiments: they run once per mesh (in the first
// repeat; a verdict does not need repeats) and after that mesh's load experiments of
// the stage, since their probes disturb the deployment. The same study and seed
// always give the same plan.
func (s *Study) Plan() []Trial {
	spec := &s.Spec
	stages := s.stages()
	rng := newSplitMix(spec.Seed)
	var out []Trial
	add := func(stage, repeat, mesh int, exps []int) {
		for _, e := range exps {
			if spec.Experiments[e].Kind == KindSecurity && repeat > 0 || repeat >= spec.RepeatsOf(&spec.Experiments[e]) {
				continue
			}
			t := Trial{Seq: len(out), Stage: stage, Repeat: repeat, Mesh: &spec.Meshes[mesh], Experiment: &spec.Experiments[e]}
			t.BringUp = spec.needsBringUp(spec.previousFor(out, &t), &t)
			out = append(out, t)
		}
	}
	for stage, exps := range stages {
		exps = securityLast(spec.Experiments, exps)
		repeats := 0
		for _, e := range exps {
			repeats = max(repeats, spec.RepeatsOf(&spec.Experiments[e]))
		}
		switch spec.Order {
		case Sequential:
			for m := range spec.Meshes {
				for r := 0; r < repeats; r++ {
					add(stage, r, m, exps)
				}
			}
		default:
			for r := 0; r < repeats; r++ {
				for _, m := range rng.permutation(len(spec.Meshes)) {
					add(stage, r, m, exps)
				}
			}
		}
	}
	return out
}

// ExtraRound is one more repeat (index repeat) of the study's last stage, its load
// experiments only, every mesh once in an order drawn from the seed and the repeat,
// continuing a run whose trials so far are before (not empty): what a precision target
// adds, a round at a time. Nil when the last stage has no load experiment.
func (s *Study) ExtraRound(repeat int, before []Trial) []Trial {
	spec := &s.Spec
	stages := s.stages()
	stage := len(stages) - 1
	var exps []int
	for _, e := range stages[stage] {
		if spec.Experiments[e].Kind != KindSecurity {
			exps = append(exps, e)
		}
	}
	if len(exps) == 0 || len(before) == 0 {
		return nil
	}
	rng := newSplitMix(spec.Seed ^ (uint64(repeat) * 0x9e3779b97f4a7c15))
	all := slices.Clip(before)
	for _, m := range rng.permutation(len(spec.Meshes)) {
		for _, e := range exps {
			t := Trial{Seq: all[len(all)-1].Seq + 1, Stage: stage, Repeat: repeat, Mesh: &spec.Meshes[m], Experiment: &spec.Experiments[e]}
			t.BringUp = spec.needsBringUp(spec.previousFor(all, &t), &t)
			all = append(all, t)
		}
	}
	return all[len(before):]
}

// Remeasure returns plan with the trials of experiment exp among plan[:at+1] run again
// right after plan[at], each (repeat, mesh) once, in the order they first ran: what the
// runner does when it lowers the rate of that experiment because a trial at the old
// rate saturated its target, so that every mesh and repeat is measured at the same
// rate. Sequence numbers and bring-ups are set anew from the inserted trials on, as Plan
// sets them.
func (s *Study) Remeasure(plan []Trial, at int, exp *Experiment) []Trial {
	out := slices.Clone(plan[:at+1])
	type key struct {
		repeat int
		mesh   *Mesh
	}
	seen := map[key]bool{}
	for _, t := range plan[:at+1] {
		if k := (key{t.Repeat, t.Mesh}); t.Experiment == exp && !seen[k] {
			seen[k] = true
			out = append(out, t)
		}
	}
	out = append(out, plan[at+1:]...)
	for i := at + 1; i < len(out); i++ {
		t := &out[i]
		t.Seq = i
		t.BringUp = s.Spec.needsBringUp(s.Spec.previousFor(out[:i], t), t)
	}
	return out
}

// securityLast moves the security experiments of a stage after its load experiments,
// keeping file order within each.
func securityLast(all []Experiment, exps []int) []int {
	out := make([]int, 0, len(exps))
	for _, e := range exps {
		if all[e].Kind != KindSecurity {
			out = append(out, e)
		}
	}
	for _, e := range exps {
		if all[e].Kind == KindSecurity {
			out = append(out, e)
		}
	}
	return out
}

// stages returns experiment indexes grouped by dependency depth, each group in file
// order. References always point to earlier experiments (the parser checks), so one
// pass computes every depth.
func (s *Study) stages() [][]int {
	depth := map[string]int{}
	var out [][]int
	for i, e := range s.Spec.Experiments {
		d := 0
		if e.Rate.IsRelative() {
			d = depth[e.CapacityFrom] + 1
		}
		depth[e.Name] = d
		for len(out) <= d {
			out = append(out, nil)
		}
		out[d] = append(out[d], i)
	}
	return out
}

// splitMix is SplitMix64 with an unbiased bounded draw, written out here rather than
// taken from math/rand so that a recorded seed gives the same order with any Go
// version.
type splitMix struct{ state uint64 }

func newSplitMix(seed uint64) *splitMix { return &splitMix{state: seed} }

func (r *splitMix) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// below returns a uniform number in [0, n) by rejection sampling.
func (r *splitMix) below(n uint64) uint64 {
	limit := -n % n // 2^64 mod n: values under it would bias the result
	for {
		if v := r.next(); v >= limit {
			return v % n
		}
	}
}

// permutation returns 0..n-1 shuffled (Fisher–Yates).
func (r *splitMix) permutation(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := int(r.below(uint64(i + 1)))
		p[i], p[j] = p[j], p[i]
	}
	return p
}
