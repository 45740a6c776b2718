package analysis

import "github.com/meshmark/meshmark/internal/results"

// ComparePair compares the group at b against the group at a (a is the reference) on
// one metric, by the same method as the comparisons with the baseline: the t interval
// over repeats (paired when they ran in the same interleaved blocks), the noise floor
// of a's point and the metric's margin. a and b may be any two groups of the run,
// two meshes at one point or one mesh at two points (S3's gateway against no gateway).
// ok is false when either group was not measured.
func ComparePair(run *results.Run, rep *Report, a, b Key, m Metric) (c Comparison, ok bool) {
	ga, gb := rep.Group(a), rep.Group(b)
	if ga == nil || gb == nil {
		return Comparison{}, false
	}
	opts := rep.Options.withDefaults()
	opts.Metrics = []Metric{m}
	floors := NoiseFloor(run, rep.Groups, Point{a.Experiment, a.Step}, opts)
	return compareGroups(ga, gb, opts, floors)[0], true
}
