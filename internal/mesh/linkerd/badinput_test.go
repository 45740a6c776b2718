package linkerd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/testbed"
)

func TestOptionsLinkerdCannotHonourAreRefused(t *testing.T) {
	for _, c := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"mtls": "off"}, "mtls", "cannot turn mTLS off"},
		{map[string]any{"retries": true}, "retries", "not supported by linkerd"},
		{map[string]any{"request_id": false}, "request_id", "not supported by linkerd"},
		{map[string]any{"circuit_breakers": "unlimited"}, "circuit_breakers", "not supported by linkerd"},
		{map[string]any{"telemetry": "off"}, "telemetry", "not supported by linkerd"},
		{map[string]any{"authz": "spiffe://cluster.local/ns/x/sa/y"}, "authz", "neither a service account"},
		{map[string]any{"authz": 3}, "authz", "not a list"},
		{map[string]any{"replicas": 2}, "replicas", "unknown option for linkerd"},
	} {
		_, err := mesh.New(Name, c.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != c.key || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an OptionError on %s saying %q", c.raw, err, c.key, c.want)
		}
	}
	for _, raw := range []map[string]any{nil, {"mtls": "strict", "concurrency": 1, "access_log": "on"}, {"authz": []any{"productpage", "reviews.bookinfo.serviceaccount.identity.linkerd.cluster.local"}}} {
		if _, err := mesh.New(Name, raw); err != nil {
			t.Errorf("%v refused: %v", raw, err)
		}
	}
}

func TestInterceptionRulesAreProxyInits(t *testing.T) {
	ic := Interception{ProxyUID: 2102, InboundPort: 4143, OutboundPort: 4140, SkipInbound: []int{4190, 4191}, Outbound: true}
	got := ic.InstallRules()
	for _, want := range []string{
		"-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191 -j RETURN",
		"-A PROXY_INIT_REDIRECT -p tcp -j REDIRECT --to-ports 4143",
		"-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -j RETURN",
		"-A PROXY_INIT_OUTPUT -o lo -j RETURN",
		"-A PROXY_INIT_OUTPUT -p tcp -j REDIRECT --to-ports 4140",
		"-I PREROUTING 1 -p tcp -j PROXY_INIT_REDIRECT",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("rules lack %q:\n%s", want, got)
		}
	}
}

// noProcessLeft fails if any process the testbed started is still alive.
func noProcessLeft(t *testing.T, tb *testbed.Testbed) {
	t.Helper()
	for _, p := range tb.Processes() {
		if p.Spec().Role == "workload" {
			continue
		}
		if err := syscall.Kill(p.PID(), 0); err == nil {
			t.Errorf("%s in %s (pid %d) still runs", p.Spec().Name, p.Pod(), p.PID())
		}
	}
}

func noRulesLeft(t *testing.T, b bed) {
	t.Helper()
	for _, pod := range b.app.Pods() {
		out, err := b.tb.Exec(context.Background(), pod, nil, "iptables-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "PROXY_INIT") {
			t.Errorf("pod %s keeps proxy-init rules:\n%s", pod.Name, out)
		}
	}
}

func TestMissingProxyBinaryIsAClearError(t *testing.T) {
	b := newBed(t)
	// Neither the tools directory nor PATH holds linkerd2-proxy.
	t.Setenv("MESHMARK_TOOLS", t.TempDir())
	t.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	p, err := mesh.New(Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Install(context.Background(), b.tb, b.app)
	if err == nil || !strings.Contains(err.Error(), "linkerd2-proxy not found") || !strings.Contains(err.Error(), "meshmark setup") {
		t.Fatalf("got %v, want an error naming linkerd2-proxy and how to get it", err)
	}
	t.Log(err)
	noProcessLeft(t, b.tb)
	noRulesLeft(t, b)
}

func TestProxyNeverReadyNamesPodAndLogAndTearsDown(t *testing.T) {
	logs := t.TempDir()
	t.Setenv("MESHMARK_TEST_LOGDIR", logs)
	b := newBedWith(t, testbed.Options{StartTimeout: 4 * time.Second})
	p, err := New(mesh.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	prof := p.(*Profile)
	prof.cpEnv = []string{refuseIdentityEnv + "=1"}
	err = prof.Install(context.Background(), b.tb, b.app)
	if err == nil {
		t.Fatal("Install succeeded with a control plane that certifies nobody")
	}
	msg := err.Error()
	for _, want := range []string{"pod productpage-v1-0", "linkerd-proxy not ready", filepath.Join(logs, "productpage-v1-0.linkerd-proxy.log"), "Failed to obtain identity"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%.3000s", want, msg)
		}
	}
	if _, statErr := os.Stat(filepath.Join(logs, "productpage-v1-0.linkerd-proxy.log")); statErr != nil {
		t.Error(statErr)
	}
	noProcessLeft(t, b.tb)
	noRulesLeft(t, b)
}
