package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/owner"
	"golang.org/x/sys/unix"
)

const (
	ownerFile    = "owner"
	manifestFile = "manifest.json"
)

// manifest records what a run created, for people and for `meshmark clean`.
type manifest struct {
	ID         string      `json:"id"`
	Owner      owner.Owner `json:"owner"`
	Created    time.Time   `json:"created"`
	Namespaces []string    `json:"namespaces"`
	EtcNetns   []string    `json:"etc_netns"`
}

// saveManifest must be called with tb.mu held (or before the testbed is shared).
func (tb *Testbed) saveManifest() error {
	data, err := json.MarshalIndent(tb.manifest, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(tb.runDir, manifestFile), data, 0o644)
	}
	if err != nil {
		return fmt.Errorf("testbed: manifest: %w", err)
	}
	return nil
}

// runIDPattern matches a run id; objectPattern a namespace or /etc/netns entry.
var (
	runIDPattern  = regexp.MustCompile(`^[0-9a-f]{6}$`)
	objectPattern = regexp.MustCompile(`^mm-([0-9a-f]{6})-[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// ParseObjectName returns the run id of a meshmark namespace name, or false for any
// name meshmark did not create.
func ParseObjectName(name string) (id string, ok bool) {
	m := objectPattern.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// CleanOptions select what Clean removes.
type CleanOptions struct {
	// All removes every meshmark object, also those of runs whose owner still lives.
	All bool
	// Runs, when not empty, limits cleaning to these run ids.
	Runs []string
}

// CleanedRun is what Clean did for one run.
type CleanedRun struct {
	ID string
	// Owner is the owner pid, 0 when the run directory or owner file was gone.
	Owner         int
	OwnerAlive    bool
	Killed        []int    // pids of processes that were still running in its namespaces
	Namespaces    []string // removed network namespaces
	EtcNetns      []string // removed /etc/netns directories
	RunDir        string   // removed run directory, empty if none
	Errors        []string
	SkippedReason string // non-empty when the run was left alone
}

// CleanReport lists every run Clean looked at.
type CleanReport struct {
	Runs []CleanedRun
}

// Removed reports whether Clean removed anything.
func (r CleanReport) Removed() bool {
	for _, run := range r.Runs {
		if run.SkippedReason == "" {
			return true
		}
	}
	return false
}

// Clean removes the leftovers of testbeds whose owner process is dead (or of every
// testbed with All): processes in their namespaces, the namespaces, the /etc/netns
// entries and the run directories. Only names that match mm-<6 hex>-<label> and run
// directories named by 6 hex characters are touched.
func Clean(ctx context.Context, opts CleanOptions) (CleanReport, error) {
	if os.Geteuid() != 0 {
		return CleanReport{}, errors.New("clean: needs root")
	}
	for _, id := range opts.Runs {
		if !runIDPattern.MatchString(id) {
			return CleanReport{}, fmt.Errorf("clean: run id %q: want 6 lower-case hex characters", id)
		}
	}
	namespaces := map[string][]string{}
	etc := map[string][]string{}
	ids := map[string]bool{}
	for dir, into := range map[string]map[string][]string{netnsDir: namespaces, etcNetnsDir: etc} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return CleanReport{}, fmt.Errorf("clean: %w", err)
		}
		for _, e := range entries {
			if id, ok := ParseObjectName(e.Name()); ok {
				into[id] = append(into[id], e.Name())
				ids[id] = true
			}
		}
	}
	runDirs, err := os.ReadDir(RunRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return CleanReport{}, fmt.Errorf("clean: %w", err)
	}
	for _, e := range runDirs {
		if e.IsDir() && runIDPattern.MatchString(e.Name()) {
			ids[e.Name()] = true
		}
		// A run directory under construction that a kill left behind; a minute is far
		// longer than creating one takes.
		if info, err := e.Info(); err == nil && len(opts.Runs) == 0 && e.IsDir() && strings.HasPrefix(e.Name(), ".new-") && time.Since(info.ModTime()) > time.Minute {
			os.RemoveAll(filepath.Join(RunRoot, e.Name()))
		}
	}
	var sorted []string
	for id := range ids {
		if len(opts.Runs) == 0 || slices.Contains(opts.Runs, id) {
			sorted = append(sorted, id)
		}
	}
	slices.Sort(sorted)

	var report CleanReport
	var errs []error
	for _, id := range sorted {
		if err := ctx.Err(); err != nil {
			return report, err
		}
		run := CleanedRun{ID: id}
		runDir := filepath.Join(RunRoot, id)
		_, statErr := os.Stat(runDir)
		hasRunDir := statErr == nil
		if data, err := os.ReadFile(filepath.Join(runDir, ownerFile)); err == nil {
			if o, err := owner.Parse(data); err == nil {
				run.Owner = o.PID
				run.OwnerAlive = o.Alive()
			} else {
				run.Errors = append(run.Errors, fmt.Sprintf("%s: %v", filepath.Join(runDir, ownerFile), err))
			}
		}
		// A run directory is created complete with its owner file (by rename) and
		// removed last, so namespaces without a run directory belong to nobody.
		if run.OwnerAlive && !opts.All {
			run.SkippedReason = fmt.Sprintf("owner pid %d is alive", run.Owner)
			report.Runs = append(report.Runs, run)
			continue
		}
		nsNames := namespaces[id]
		pids, err := netNSProcesses(nsNames)
		if err != nil {
			run.Errors = append(run.Errors, err.Error())
		}
		run.Killed = pids
		if err := killAndWait(pids, 2*time.Second); err != nil {
			run.Errors = append(run.Errors, err.Error())
		}
		for _, name := range nsNames {
			if err := removeNamedNetNS(name); err != nil {
				run.Errors = append(run.Errors, err.Error())
			} else {
				run.Namespaces = append(run.Namespaces, name)
			}
		}
		for _, name := range etc[id] {
			dir := filepath.Join(etcNetnsDir, name)
			if err := os.RemoveAll(dir); err != nil {
				run.Errors = append(run.Errors, err.Error())
			} else {
				run.EtcNetns = append(run.EtcNetns, dir)
			}
		}
		if hasRunDir {
			if err := os.RemoveAll(runDir); err != nil {
				run.Errors = append(run.Errors, err.Error())
			} else {
				run.RunDir = runDir
			}
		}
		for _, e := range run.Errors {
			errs = append(errs, fmt.Errorf("run %s: %s", id, e))
		}
		report.Runs = append(report.Runs, run)
	}
	return report, errors.Join(errs...)
}

// netNSProcesses returns the pids whose network namespace is one of the named ones,
// like `ip netns pids` but for many namespaces in one pass over /proc. The calling
// process is never listed.
func netNSProcesses(names []string) ([]int, error) {
	if len(names) == 0 {
		return nil, nil
	}
	inodes := map[uint64]bool{}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(netnsDir, name), &st); err == nil {
			inodes[st.Ino] = true
		}
	}
	if len(inodes) == 0 {
		return nil, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue // exited meanwhile, or a kernel thread
		}
		if inodes[st.Ino] {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killNetNSProcesses kills whatever still runs in the named namespaces.
func killNetNSProcesses(names []string, grace time.Duration) error {
	pids, err := netNSProcesses(names)
	if err != nil {
		return err
	}
	return killAndWait(pids, grace)
}

// killAndWait sends SIGKILL and waits until the processes are gone or zombies (a
// zombie holds no namespace).
func killAndWait(pids []int, timeout time.Duration) error {
	for _, pid := range pids {
		unix.Kill(pid, unix.SIGKILL)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d survived SIGKILL for %v", pid, timeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields, ok := owner.StatFields(data)
	return !ok || len(fields) == 0 || fields[0] != "Z"
}
