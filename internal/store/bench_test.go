package store

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkAddTrial is the cost of committing one trial (5000 requests, 5 intervals,
// samples and proxy stats) durably: WAL with synchronous=FULL, one fsync per commit.
// The runner commits once per trial, so anything under ~100 ms is invisible.
func BenchmarkAddTrial(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "results.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	run := sampleRun()
	if err := s.CreateRun(ctx, run); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	tr := syntheticTrial(rng, "none", 0, 5000, time.Now())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tr.ID = 0
		if err := s.AddTrial(ctx, run.ID, tr); err != nil {
			b.Fatal(err)
		}
	}
}
