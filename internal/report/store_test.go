package report

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// TestReportFromStore renders a run that went through the real SQLite store, the way
// `meshmark report` does, and checks it says what the in-memory run says.
func TestReportFromStore(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	run := syntheticRun(t)
	trials := run.Trials
	stored := *run
	stored.Trials = nil
	if err := st.CreateRun(ctx, &stored); err != nil {
		t.Fatal(err)
	}
	for i := range trials {
		if err := st.AddTrial(ctx, stored.ID, &trials[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.FinishRun(ctx, stored.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	back, err := st.LoadRun(ctx, "last")
	if err != nil {
		t.Fatal(err)
	}
	want, got := Summarize(run, nil, Options{}), Summarize(back, nil, Options{})
	if len(got.Groups) != len(want.Groups) || len(got.Resources) != len(want.Resources) || len(got.Checks) != len(want.Checks) {
		t.Fatalf("stored run reports %d groups, %d resources, %d checks; in memory %d, %d, %d",
			len(got.Groups), len(got.Resources), len(got.Checks), len(want.Groups), len(want.Resources), len(want.Checks))
	}
	if len(got.Network) == 0 || fmt.Sprint(got.Network) != fmt.Sprint(want.Network) {
		t.Errorf("network rows differ after the store:\n got %+v\nwant %+v", got.Network, want.Network)
	}
	for i := range want.Groups {
		if got.Groups[i].P99Ms != want.Groups[i].P99Ms || got.Groups[i].Requests != want.Groups[i].Requests {
			t.Errorf("group %d: stored p99 %v / %d requests, in memory %v / %d", i, got.Groups[i].P99Ms, got.Groups[i].Requests,
				want.Groups[i].P99Ms, want.Groups[i].Requests)
		}
	}
	if len(got.Provenance.Configs) != 2 || got.Provenance.Configs[0].SHA256 != want.Provenance.Configs[0].SHA256 {
		t.Errorf("config digests lost in the store: %+v", got.Provenance.Configs)
	}
	var buf bytes.Buffer
	if err := Render(&buf, SMP, back, nil, Options{}); err != nil {
		t.Fatal(err)
	}
}
