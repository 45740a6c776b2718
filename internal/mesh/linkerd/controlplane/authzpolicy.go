package controlplane

import (
	"context"
	"encoding/json"
	"log"
	"sync"

	"github.com/meshmark/meshmark/internal/mesh/policyfile"
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
const AppliedSuffix = policyfile.AppliedSuffix

// policyPoll is how often the policy file is checked for a new version.
const policyPoll = policyfile.Poll

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

// watchFile follows the policy file (policyfile.Follow): each new version goes to
// every open WatchPort stream, and is marked applied once all have sent it.
func (s *policyStore) watchFile(ctx context.Context, path string) {
	policyfile.Follow(ctx, path, func(doc []byte, version int64) error {
		var p AuthzPolicy
		if err := json.Unmarshal(doc, &p); err != nil {
			return err
		}
		log.Printf("policy: version %d restricts %d pods", p.Version, len(p.Pods))
		s.set(p)
		return nil
	}, s.allSent)
}
