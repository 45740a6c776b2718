package policyfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// A pushed version is handed to apply once, marked applied only when the proxies have
// it, and Push returns then; a document apply rejects leaves the last good version in
// force and Push times out.
func TestPushFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var current, calls atomic.Int64
	var proxiesHave atomic.Int64
	go Follow(ctx, path, func(doc []byte, version int64) error {
		calls.Add(1)
		if string(doc) == fmt.Sprintf(`{"version": %d, "bad": true}`, version) {
			return errors.New("rejected")
		}
		current.Store(version)
		go func() { time.Sleep(300 * time.Millisecond); proxiesHave.Store(version) }() // the streams take a while
		return nil
	}, func(v int64) bool { return proxiesHave.Load() >= v })

	start := time.Now()
	if err := Push(ctx, path, []byte(`{"version": 1}`), 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("Push returned after %s, before the proxies had the version", took)
	}
	if current.Load() != 1 {
		t.Errorf("applied version %d", current.Load())
	}
	time.Sleep(3 * Poll)
	if calls.Load() != 1 {
		t.Errorf("version 1 handed to apply %d times", calls.Load())
	}
	if err := Push(ctx, path, []byte(`{"version": 2, "bad": true}`), 2, 700*time.Millisecond); err == nil {
		t.Error("a rejected version was reported applied")
	}
	if current.Load() != 1 {
		t.Errorf("a rejected version replaced the good one: %d", current.Load())
	}
	b, _ := os.ReadFile(path + AppliedSuffix)
	if string(b) != "1\n" {
		t.Errorf("applied file %q", b)
	}
}
