package loadgen

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
)

// The shares of a constant rate, each a schedule of its own, send together exactly
// what one generator at the whole rate sends.
func TestSplitConstantRateInterleaves(t *testing.T) {
	const rate, gens, length = 900.0, 4, time.Second
	var union []time.Duration
	for i := 0; i < gens; i++ {
		cfg := load.Config{Open: &load.OpenModel{Schedule: load.ScheduleSpec{Arrival: load.Constant, Rate: rate}}}
		if err := Split(&cfg, Share{Index: i, Of: gens}); err != nil {
			t.Fatal(err)
		}
		s, err := load.NewSchedule(cfg.Open.Schedule, length)
		if err != nil {
			t.Fatal(err)
		}
		for {
			at, _ := s.Next()
			if at >= length {
				break
			}
			union = append(union, at)
		}
	}
	slices.Sort(union)
	one, err := load.NewSchedule(load.ScheduleSpec{Arrival: load.Constant, Rate: rate}, length)
	if err != nil {
		t.Fatal(err)
	}
	var want []time.Duration
	for {
		at, _ := one.Next()
		if at >= length {
			break
		}
		want = append(want, at)
	}
	if len(union) != len(want) {
		t.Fatalf("%d generators send %d times in %s, one generator %d", gens, len(union), length, len(want))
	}
	for i := range want {
		if d := union[i] - want[i]; d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("send %d at %s, one generator sends at %s", i, union[i], want[i])
		}
	}
}

func TestSplitDividesTheLoad(t *testing.T) {
	var counts, conns []int64
	for i := 0; i < 3; i++ {
		cfg := load.Config{Count: 10, Open: &load.OpenModel{Connections: 8, Schedule: load.ScheduleSpec{Arrival: load.Poisson, Rate: 300, Seed: 1}}}
		if err := Split(&cfg, Share{Index: i, Of: 3}); err != nil {
			t.Fatal(err)
		}
		counts = append(counts, cfg.Count)
		conns = append(conns, int64(cfg.Open.Connections))
		if cfg.Open.Schedule.Rate != 100 || (i > 0) == (cfg.Open.Schedule.Seed == 1) {
			t.Errorf("share %d: %+v: want 100/s and a seed of its own", i, cfg.Open.Schedule)
		}
	}
	if !slices.Equal(counts, []int64{4, 3, 3}) || !slices.Equal(conns, []int64{3, 3, 2}) {
		t.Errorf("-n 10 -c 8 over 3 generators: counts %v, connections %v", counts, conns)
	}
	closed := load.Config{Closed: &load.ClosedModel{Connections: 5, Rate: 100}}
	if err := Split(&closed, Share{Index: 1, Of: 2}); err != nil || closed.Closed.Connections != 2 || closed.Closed.Rate != 50 {
		t.Errorf("closed share: %+v, %v", closed.Closed, err)
	}
	for _, tc := range []struct {
		cfg  load.Config
		want string
	}{
		{load.Config{Closed: &load.ClosedModel{Connections: 1}}, "-c 1 is fewer connections than 2 generators"},
		{load.Config{Count: 1, Closed: &load.ClosedModel{Connections: 4}}, "-n 1 is fewer requests than 2 generators"},
		{load.Config{Users: &load.UsersModel{Users: 1}}, "--users 1 is fewer users than 2 generators"},
	} {
		if err := Split(&tc.cfg, Share{Index: 0, Of: 2}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
}

func TestParseResolve(t *testing.T) {
	got, err := ParseResolve([]string{"front.shop.svc:9080:127.0.0.1:18080", "api:443:198.18.0.7"})
	if err != nil || got["front.shop.svc:9080"] != "127.0.0.1:18080" || got["api:443"] != "198.18.0.7:443" {
		t.Errorf("%v %v", got, err)
	}
	for _, bad := range []string{"front", "front:9080", "front:9080:not an address"} {
		if _, err := ParseResolve([]string{bad}); err == nil {
			t.Errorf("--resolve %q accepted", bad)
		}
	}
}
