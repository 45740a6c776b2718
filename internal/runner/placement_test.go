package runner

import "testing"

// TestOwnCPUs: the open model may spin only where the load generator has CPUs the
// system under test does not run on.
func TestOwnCPUs(t *testing.T) {
	for _, c := range []struct {
		loadgen, sut []int
		want         bool
	}{
		{[]int{1}, []int{0}, true},
		{[]int{2, 3}, []int{0, 1}, true},
		{[]int{1}, []int{0, 1}, false},
		{nil, []int{0}, false},
		{[]int{1}, nil, false}, // the system under test may run anywhere, the generator's core too
		{nil, nil, false},
	} {
		if got := ownCPUs(c.loadgen, c.sut); got != c.want {
			t.Errorf("ownCPUs(%v, %v) = %v, want %v", c.loadgen, c.sut, got, c.want)
		}
	}
}
