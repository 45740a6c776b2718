package metrics

import (
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
)

func TestFromLoadIntervalKeepsCountsAndLatencies(t *testing.T) {
	h := load.NewHistogram()
	for i := 0; i < 30; i++ {
		_ = h.RecordValue(250) // µs
	}
	for i := 0; i < 10; i++ {
		_ = h.RecordValue(4000)
	}
	enc, err := load.EncodeHistogram(h)
	if err != nil {
		t.Fatal(err)
	}
	iv, err := FromLoadInterval("details", load.Interval{Length: 2 * time.Second, Completed: 42, RequestedRate: 25,
		Errors: load.Errors{Timeout: 2}, Latency: enc})
	if err != nil {
		t.Fatal(err)
	}
	if iv.Completed != 42 || iv.Errors["timeout"] != 2 || len(iv.Errors) != 1 || iv.Duration != 2*time.Second {
		t.Fatalf("%+v", iv)
	}
	var n uint64
	for _, lc := range iv.Latency {
		n += lc.Count
		// 3 significant digits: each value within 0.1% above what was recorded.
		if !(lc.Value >= 250*time.Microsecond && lc.Value <= 251*time.Microsecond ||
			lc.Value >= 4*time.Millisecond && lc.Value <= 4004*time.Microsecond) {
			t.Errorf("unexpected latency %v", lc.Value)
		}
	}
	if n != 40 {
		t.Errorf("latency counts sum to %d, want 40", n)
	}
	r := New()
	r.ObserveInterval(RunLabels{Mesh: "none"}, iv)
	fams, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == NameLatency {
			hist := f.Metric[0].GetHistogram()
			for _, b := range hist.Bucket {
				if b.GetUpperBound() == 0.00025 && b.GetCumulativeCount() != 30 ||
					b.GetUpperBound() == 0.005 && b.GetCumulativeCount() != 40 {
					t.Errorf("bucket %v = %d", b.GetUpperBound(), b.GetCumulativeCount())
				}
			}
			return
		}
	}
	t.Fatal("no latency histogram exported")
}
