package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Cleaned is what Clean did with one cluster.
type Cleaned struct {
	Name    string
	Removed bool
	Why     string // why it was removed or kept
}

// Clean takes apart the clusters nobody will take down: a test's cluster once its test
// process is gone, a `cluster up` killed before it finished, and namespaces or cgroups
// left without a cluster directory. A cluster that `cluster up` finished stays until
// `cluster down`, unless all is set.
func Clean(ctx context.Context, all bool, progress io.Writer) ([]Cleaned, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("clean: needs root")
	}
	names, err := List()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Cleaned
	var errs []error
	for _, name := range names {
		seen[name] = true
		st, err := Load(name)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if st == nil {
			st = &State{Name: name}
		}
		switch {
		case st.Owner.Alive() && !all:
			out = append(out, Cleaned{Name: name, Why: fmt.Sprintf("its owner, pid %d, is alive", st.Owner.PID)})
			continue
		case st.Phase == PhaseUp && st.Owner.PID == 0 && !all:
			out = append(out, Cleaned{Name: name, Why: "made by `meshmark cluster up`; `meshmark cluster down --name " + name + "` removes it"})
			continue
		}
		why := "its owner is gone"
		if st.Owner.PID == 0 && st.Phase != PhaseUp {
			why = "it never came up"
		}
		if err := teardown(ctx, st, progress); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
			continue
		}
		out = append(out, Cleaned{Name: name, Removed: true, Why: why})
	}
	// Namespaces whose cluster directory is gone.
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), NetNSPrefix)
		name, _, _ = strings.Cut(name, ".node")
		if !ok || seen[name] || !namePattern.MatchString(name) {
			continue
		}
		if err := teardown(ctx, &State{Name: name}, progress); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
			continue
		}
		seen[name] = true
		out = append(out, Cleaned{Name: name, Removed: true, Why: "its namespace was left without its directory"})
	}
	// Cgroups whose cluster directory is gone.
	base, err := clusterCgroup("")
	if err == nil {
		parent := filepath.Join(cgroupFS, "pids", filepath.Dir(base))
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), filepath.Base(base))
			if !ok || seen[name] || !namePattern.MatchString(name) {
				continue
			}
			if err := teardown(ctx, &State{Name: name}, progress); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
				continue
			}
			out = append(out, Cleaned{Name: name, Removed: true, Why: "its cgroup was left without its directory"})
		}
	}
	return out, errors.Join(errs...)
}
