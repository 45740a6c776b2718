package analysis

import (
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// Trial flags set by the runner are counted per group, so reports can say in how many
// trials the generator fell behind or traffic went around the mesh.
func TestGroupCountsTrialFlags(t *testing.T) {
	start := time.Unix(1000, 0)
	trial := func(repeat int, flags ...string) results.Trial {
		h := results.NewLatencyHistogram()
		_ = h.RecordValue(500)
		return results.Trial{Repeat: repeat, Mesh: "sidecar", Experiment: "latency", Kind: results.KindFixedRate,
			Start: start, End: start.Add(time.Second),
			Result: results.TrialResult{Requests: 1, Latency: h, ServiceTime: h, Flags: flags}}
	}
	run := &results.Run{Meshes: []results.Mesh{{Label: "sidecar", Profile: "envoy-sidecar"}},
		Trials: []results.Trial{trial(0, results.FlagProxyBypassed), trial(1), trial(2, results.FlagGeneratorBehind, results.FlagProxyBypassed)}}
	groups := Groups(run)
	if len(groups) != 1 {
		t.Fatalf("%d groups, want 1", len(groups))
	}
	if g := groups[0]; g.ProxyBypassed != 2 || g.GeneratorBehind != 1 {
		t.Errorf("proxy bypassed in %d, generator behind in %d; want 2 and 1", g.ProxyBypassed, g.GeneratorBehind)
	}
}
