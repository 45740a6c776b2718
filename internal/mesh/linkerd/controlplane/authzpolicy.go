package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"time"
)

// AuthzPolicy is the authorization a study applies while the control plane runs (what
// Linkerd's policy controller derives from AuthorizationPolicy and
// MeshTLSAuthentication resources): per meshed pod, the client identities its inbound
// side admits. Pods not named keep the default policy. The profile writes it to
// Config.PolicyFile; the control plane picks each new Version up, pushes it on every
// open WatchPort stream, and then writes the version to PolicyFile + ".applied".
type AuthzPolicy struct {
	Version int64               `json:"version"`
	Pods    map[string][]string `json:"pods,omitempty"`
}

// AppliedSuffix names the file the control plane writes a policy's version to once
// every open policy stream has been sent it.
const AppliedSuffix = ".applied"

// policyPoll is how often the policy file is checked for a new version.
const policyPoll = 100 * time.Millisecond

// policyStore holds the current AuthzPolicy and wakes the streams when it changes.
type policyStore struct {
	mu      sync.Mutex
	current AuthzPolicy
	changed chan struct{} // closed and replaced on every change
	streams map[int]int64 // open WatchPort streams: last version each has sent
	nextID  int
}

func newPolicyStore() *policyStore {
	return &policyStore{changed: make(chan struct{}), streams: map[int]int64{}}
}

// snapshot returns the policy and the channel that closes when it next changes.
func (s *policyStore) snapshot() (AuthzPolicy, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, s.changed
}

func (s *policyStore) register() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	s.streams[s.nextID] = -1
	return s.nextID
}

func (s *policyStore) unregister(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, id)
}

func (s *policyStore) sent(id int, version int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[id]; ok {
		s.streams[id] = version
	}
}

// allSent reports whether every open stream has sent version.
func (s *policyStore) allSent(version int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.streams {
		if v < version {
			return false
		}
	}
	return true
}

func (s *policyStore) set(p AuthzPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = p
	close(s.changed)
	s.changed = make(chan struct{})
}

// watchFile polls path for a new policy version until ctx ends. A file that does not
// exist yet is no policy; one that does not parse is logged and ignored, the last
// good policy staying in force.
func (s *policyStore) watchFile(ctx context.Context, path string) {
	t := time.NewTicker(policyPoll)
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
			continue
		}
		var p AuthzPolicy
		if err := json.Unmarshal(b, &p); err != nil {
			log.Printf("policy: %s: %v (keeping version %d)", path, err, seen)
			continue
		}
		if p.Version == seen {
			continue
		}
		seen = p.Version
		log.Printf("policy: version %d restricts %d pods", p.Version, len(p.Pods))
		s.set(p)
		deadline := time.Now().Add(5 * time.Second)
		for !s.allSent(p.Version) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if !s.allSent(p.Version) {
			log.Printf("policy: version %d not sent on every stream within 5s", p.Version)
			continue
		}
		if err := os.WriteFile(path+AppliedSuffix, fmt.Appendf(nil, "%d\n", p.Version), 0o644); err != nil {
			log.Printf("policy: %v", err)
		}
	}
}
