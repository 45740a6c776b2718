package analysis

import "testing"

// BenchmarkCompareGroups is the cost of one mesh-vs-baseline comparison on every
// default metric: 5 repeats × 20 000 requests each, 4000 resamples. `meshmark show`
// runs a few of these per measuring point, so it should stay well under a second.
func BenchmarkCompareGroups(b *testing.B) {
	run := synthRun(1, 5, 20000, 200)
	groups := Groups(run)
	opts := Options{Seed: 1}.withDefaults()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		compareGroups(groups[0], groups[1], opts, nil)
	}
}
