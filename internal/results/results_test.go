package results

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

func TestJSONRoundTripKeepsHistogramsLossless(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lat, svc, lag, ivh := NewLatencyHistogram(), NewLatencyHistogram(), NewLatencyHistogram(), NewLatencyHistogram()
	for i := 0; i < 20000; i++ {
		v := int64(rng.ExpFloat64()*800) + 50
		_ = lat.RecordValue(v)
		_ = svc.RecordValue(v / 2)
		_ = lag.RecordValue(int64(rng.IntN(30)) + 1)
		if i%10 == 0 {
			_ = ivh.RecordValue(v)
		}
	}
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	in := Trial{Repeat: 2, Mesh: "sidecar", Experiment: "fixed", Kind: KindFixedRate,
		Start: start, End: start.Add(10 * time.Second),
		Result: TrialResult{Requests: 20000, Errors: 3, Latency: lat, ServiceTime: svc,
			Intervals:   []Interval{{Start: start, Duration: time.Second, Count: 2000, Histogram: ivh, P50: ivh.ValueAtQuantile(50)}},
			StatusCodes: map[int]int64{200: 19997, 503: 3},
			Generator:   GeneratorHealth{SendLag: lag, LateSends: 4},
			Network: []NetSample{
				{Pod: "productpage-0", Node: "n1", Mesh: "sidecar", Interface: "eth0", T: start, RxBytes: 1 << 40, TxBytes: 7,
					RxPackets: 3, TxPackets: 4, RxDropped: 5, TxDropped: 6},
				{Pod: "productpage-0", Interface: "lo", T: start.Add(time.Second), RxBytes: 9}}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Trial
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	for _, q := range []float64{0, 50, 90, 99, 99.9, 100} {
		if a, b := lat.ValueAtQuantile(q), out.Result.Latency.ValueAtQuantile(q); a != b {
			t.Errorf("latency p%v: %d before, %d after", q, a, b)
		}
		if a, b := svc.ValueAtQuantile(q), out.Result.ServiceTime.ValueAtQuantile(q); a != b {
			t.Errorf("service time p%v: %d before, %d after", q, a, b)
		}
		if a, b := lag.ValueAtQuantile(q), out.Result.Generator.SendLag.ValueAtQuantile(q); a != b {
			t.Errorf("send lag p%v: %d before, %d after", q, a, b)
		}
		if a, b := ivh.ValueAtQuantile(q), out.Result.Intervals[0].Histogram.ValueAtQuantile(q); a != b {
			t.Errorf("interval p%v: %d before, %d after", q, a, b)
		}
	}
	if !lat.Equals(out.Result.Latency) {
		t.Error("latency histogram differs after round trip")
	}
	if out.Result.StatusCodes[503] != 3 || out.Result.Generator.LateSends != 4 || out.Result.Intervals[0].Count != 2000 {
		t.Errorf("scalar fields lost: %+v", out.Result)
	}
	if !reflect.DeepEqual(out.Result.Network, in.Result.Network) {
		t.Errorf("network samples differ after round trip:\n got %+v\nwant %+v", out.Result.Network, in.Result.Network)
	}
	if got := out.Throughput(); got < 1999 || got > 2000 {
		t.Errorf("throughput %v, want 1999.7", got)
	}
}

func TestMicrosClampsToTrackableRange(t *testing.T) {
	if got := Micros(2 * time.Minute); got != HistogramHighest {
		t.Errorf("2m -> %d, want clamp to %d", got, HistogramHighest)
	}
	if got := Micros(10 * time.Nanosecond); got != HistogramLowest {
		t.Errorf("10ns -> %d, want %d", got, HistogramLowest)
	}
	h := NewLatencyHistogram()
	if err := h.RecordValue(Micros(time.Hour)); err != nil {
		t.Errorf("clamped value not recordable: %v", err)
	}
}

func FuzzDecodeHistogram(f *testing.F) {
	h := NewLatencyHistogram()
	_ = h.RecordValue(123)
	s, _ := EncodeHistogram(h)
	f.Add(s)
	f.Add("")
	f.Add("HISTFAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := DecodeHistogram(s)
		if err != nil || h == nil {
			return
		}
		s2, err := EncodeHistogram(h)
		if err != nil {
			t.Fatalf("re-encode of decoded histogram failed: %v", err)
		}
		h2, err := DecodeHistogram(s2)
		if err != nil || !h.Equals(h2) {
			t.Fatalf("re-decode differs: %v", err)
		}
	})
}
