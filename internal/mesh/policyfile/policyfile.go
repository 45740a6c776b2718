// Package policyfile owns how a mesh profile hands a policy to its control-plane
// process while the mesh runs, and learns that the proxies have it: the profile writes
// a versioned JSON document, renamed into place; the control plane follows the file,
// pushes each new version to its proxies the way the real control plane would, and
// writes the version to the file's AppliedSuffix companion once every proxy has it.
// Linkerd's policy API and ztunnel's xDS both use it.
package policyfile

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"
)

// AppliedSuffix names the file the control plane writes a version to once applied.
const AppliedSuffix = ".applied"

// Poll is how often the control plane looks at the policy file; settle is how long it
// waits for its proxies to have a version before giving up on marking it.
const (
	Poll   = 100 * time.Millisecond
	settle = 5 * time.Second
)

// Push writes doc, a JSON document whose "version" is version, to path and returns
// once the control plane has marked that version (or a later one) applied.
func Push(ctx context.Context, path string, doc []byte, version int64, timeout time.Duration) error {
	// Renamed into place, so the control plane never reads half a file.
	if err := os.WriteFile(path+".tmp", doc, 0o644); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(path + AppliedSuffix)
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v >= version {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("policy version %d not applied to every proxy within %s (see the control plane's log)", version, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(Poll / 4):
		}
	}
}

// Follow watches path until ctx ends. For each document with a version it has not
// seen, it calls apply, which parses the document and hands it to the proxies' streams;
// it then waits for applied(version) and marks the version applied. A document that
// does not parse, or that apply rejects, is logged and skipped, the last good policy
// staying in force.
func Follow(ctx context.Context, path string, apply func(doc []byte, version int64) error, applied func(version int64) bool) {
	t := time.NewTicker(Poll)
	defer t.Stop()
	var seen int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue // no policy yet
		}
		var head struct {
			Version int64 `json:"version"`
		}
		if err := json.Unmarshal(b, &head); err != nil {
			log.Printf("policy: %s: %v (keeping version %d)", path, err, seen)
			continue
		}
		if head.Version == seen {
			continue
		}
		prev := seen
		seen = head.Version // a bad version is reported once, not every tick
		if err := apply(b, head.Version); err != nil {
			log.Printf("policy: %s: version %d: %v (keeping version %d)", path, head.Version, err, prev)
			continue
		}
		deadline := time.Now().Add(settle)
		for !applied(head.Version) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if !applied(head.Version) {
			log.Printf("policy: version %d not taken by every proxy within %s", head.Version, settle)
			continue
		}
		if err := os.WriteFile(path+AppliedSuffix, fmt.Appendf(nil, "%d\n", head.Version), 0o644); err != nil {
			log.Printf("policy: %v", err)
		}
	}
}
