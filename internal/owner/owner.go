// Package owner records which process owns what a run leaves behind (a local
// testbed's run directory, a local cluster, a Kubernetes namespace's annotation) and tells
// whether that process still lives, so that clean removes only what a dead run left.
package owner

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Owner identifies the process that owns a run. The start time (clock ticks since
// boot, from /proc/<pid>/stat) tells a live owner from a recycled pid.
type Owner struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

func (o Owner) String() string { return fmt.Sprintf("%d %d\n", o.PID, o.StartTime) }

// Current is this process, as an owner record.
func Current() (Owner, error) {
	st, err := processStartTime(os.Getpid())
	if err != nil {
		return Owner{}, err
	}
	return Owner{PID: os.Getpid(), StartTime: st}, nil
}

// Parse reads an owner file: "<pid> <start time>\n".
func Parse(data []byte) (Owner, error) {
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return Owner{}, fmt.Errorf("owner file: line 1: want \"<pid> <start time>\", got %q", firstLine(data))
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return Owner{}, fmt.Errorf("owner file: line 1: field pid: %q is not a process id", fields[0])
	}
	st, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return Owner{}, fmt.Errorf("owner file: line 1: field start time: %q is not a number", fields[1])
	}
	return Owner{PID: pid, StartTime: st}, nil
}

func firstLine(data []byte) string {
	s := string(data)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// processStartTime returns field 22 of /proc/<pid>/stat.
func processStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatStartTime(data)
}

func parseStatStartTime(stat []byte) (uint64, error) {
	fields, ok := StatFields(stat)
	// fields[0] is field 3 (state); start time is field 22.
	if !ok || len(fields) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// StatFields returns the fields of a /proc/<pid>/stat line from field 3 (the state)
// on. The command name (field 2) may contain spaces and parentheses, so the fields
// resume after the last ')'; ok is false when there is none.
func StatFields(stat []byte) (fields []string, ok bool) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(s[i+1:]), true
}

// Alive reports whether the owner process still runs.
func (o Owner) Alive() bool {
	st, err := processStartTime(o.PID)
	return err == nil && st == o.StartTime
}
