package analysis

import "testing"

// BenchmarkCompareGroups is the cost of one mesh-vs-baseline comparison on every
// default metric: 5 repeats × 20 000 requests each. `meshmark show` runs a few of
// these per measuring point, so it should stay well under a second.
func BenchmarkCompareGroups(b *testing.B) {
	run := synthRun(1, 5, 20000, 200)
	groups := Groups(run)
	opts := Options{Seed: 1}.withDefaults()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		compareGroups(groups[0], groups[1], opts, nil)
	}
}

// BenchmarkAnalyzeManyBlocks is the whole analysis of a run in the design that
// resolves the smallest differences: 100 interleaved blocks of 300 requests per mesh
// (docs/report.md). A study with a precision target analyses its run after every
// round of blocks.
func BenchmarkAnalyzeManyBlocks(b *testing.B) {
	run := synthRun(1, 100, 300, 50)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Analyze(run, Options{Seed: 1}, nil)
	}
}
