package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A new policy version reaches the pod it names (and no other), and is marked applied
// only once every open stream has sent it; a file that does not parse keeps the last
// good policy.
func TestPolicyFileIsPushedThenApplied(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "authz-policy.json")
	srv := &inboundServer{cfg: &Config{}, policy: newPolicyStore()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.policy.watchFile(ctx, path)

	permits := func(pod string) string {
		a := srv.server(pod).GetAuthorizations()[0]
		if ids := a.GetAuthentication().GetMeshTLS().GetIdentities().GetIdentities(); len(ids) > 0 {
			return ids[0].GetName()
		}
		if a.GetAuthentication().GetUnauthenticated() != nil {
			return "anyone"
		}
		return "?"
	}
	stream := srv.policy.register()
	if err := os.WriteFile(path, []byte(`{"version": 1, "pods": {"reviews-v1-0": ["productpage.default.serviceaccount.identity.linkerd.cluster.local"]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { p, _ := srv.policy.snapshot(); return p.Version == 1 })
	if got := permits("reviews-v1-0"); !strings.HasPrefix(got, "productpage.") {
		t.Errorf("reviews-v1-0 admits %s", got)
	}
	if got := permits("reviews-v2-0"); got != "anyone" {
		t.Errorf("a pod the policy does not name admits %s", got)
	}
	time.Sleep(3 * policyPoll)
	if _, err := os.Stat(path + AppliedSuffix); err == nil {
		t.Fatal("marked applied before the open stream sent it")
	}
	srv.policy.sent(stream, 1)
	waitFor(t, func() bool { b, _ := os.ReadFile(path + AppliedSuffix); return strings.TrimSpace(string(b)) == "1" })
	os.WriteFile(path, []byte(`{"version": 2, "pods": `), 0o644)
	time.Sleep(3 * policyPoll)
	if p, _ := srv.policy.snapshot(); p.Version != 1 {
		t.Errorf("a broken file replaced the policy: version %d", p.Version)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatal("timed out")
}
