package nodeenvoy

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshtest"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/topology"
)

func TestMain(m *testing.M) {
	if os.Getenv(meshtest.HelperEnv) == "serve" {
		meshtest.ServeHelper()
		return
	}
	os.Exit(m.Run())
}

func newBed(t *testing.T) meshtest.Bed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	if _, err := prereq.Envoy(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Envoy: %v", err)
		}
		t.Fatalf("these tests run a real Envoy: %v", err)
	}
	return meshtest.NewBed(t)
}

func install(t *testing.T, b meshtest.Bed, raw map[string]any) *Profile {
	t.Helper()
	p, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Install(context.Background(), b.TB, b.App); err != nil {
		t.Fatal(err)
	}
	return p.(*Profile)
}

// bypassIsCaught makes productpage translate VIPs itself again (its rules flushed) and
// expects the check to name it, and it alone.
func bypassIsCaught(t *testing.T, p mesh.Profile, b meshtest.Bed) {
	t.Helper()
	ctx := context.Background()
	if out, err := b.TB.Exec(ctx, b.Pod("productpage-v1-0"), nil, "iptables", "-w", "-t", "nat", "-F", Chain); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	broken, err := p.Check(ctx, b.TB, b.App)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(broken.Failures, "\n")
	if broken.Pass || !strings.Contains(all, "pod productpage-v1-0 -> service reviews") || !strings.Contains(all, "bypassed the node proxy") {
		t.Errorf("check missed a pod that bypasses its node: %s", broken.Summary())
	}
	for _, f := range broken.Failures {
		t.Logf("expected failure: %s", f)
		if !strings.HasPrefix(f, "pod productpage-v1-0 ") {
			t.Errorf("failure blames another pod: %s", f)
		}
	}
}

// uninstallLeavesNothing removes the profile and checks every namespace is as before.
func uninstallLeavesNothing(t *testing.T, p *Profile, b meshtest.Bed) {
	t.Helper()
	ctx := context.Background()
	if err := p.Uninstall(ctx, b.TB); err != nil {
		t.Fatal(err)
	}
	if pids := b.NodeProxies(); len(pids) > 0 {
		t.Errorf("node proxies still running after Uninstall: %v", pids)
	}
	targets := b.App.Pods()
	for _, n := range meshtest.Nodes {
		np, err := b.TB.NodePod(n)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, np)
	}
	for _, pod := range targets {
		out, err := b.TB.Exec(ctx, pod, nil, "iptables-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), Chain) {
			t.Errorf("%s: rules left after Uninstall:\n%s", pod.Name, out)
		}
	}
	// The testbed's own service path works again.
	b.Get(t, b.App.Clients[0], mesh.Addr(b.App.Service("reviews").VIP, 9080), "reviews:9080", "/")
}

func TestCiliumEnvoyOnNodes(t *testing.T) {
	b := newBed(t)
	loadgen := b.App.Clients[0]
	productpage := b.Pod("productpage-v1-0")
	reviewsVIP := mesh.Addr(b.App.Service("reviews").VIP, 9080)
	productpageVIP := mesh.Addr(b.App.Service("productpage").VIP, 9080)

	t.Run("l7", func(t *testing.T) {
		p := install(t, b, nil)
		meshtest.CheckPasses(t, p, b, true)
		if n := len(b.NodeProxies()); n != 3 {
			t.Errorf("%d node proxies running, want one per node (3)", n)
		}
		// A workload's own call by name crosses both nodes' Envoys.
		if body := b.Get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080"); !strings.HasPrefix(body, "productpage-v1-0>reviews-v") {
			t.Errorf("loadgen -> productpage -> reviews returned %q", body)
		}

		before := p.ReadCounters(context.Background(), b.TB, b.App)
		counts := splitCounts(t, b, productpage, reviewsVIP, "reviews:9080")
		after := p.ReadCounters(context.Background(), b.TB, b.App)
		deltas := mesh.DiffCounters(before, after)
		got, unit, ok := mesh.InboundTotal(deltas, "reviews")
		if !ok || unit != meshkube.UnitRequests || got < uint64(counts) {
			t.Errorf("node Envoys counted %d %s into reviews (ok %v) for %d requests: %+v", got, unit, ok, counts, deltas)
		}
		for _, d := range deltas {
			if d.Pod == productpage.Node && d.Inbound["reviews"] < uint64(counts) {
				t.Errorf("productpage's node %s counted %d for reviews", d.Pod, d.Inbound["reviews"])
			}
		}
		bypassIsCaught(t, p, b)
		uninstallLeavesNothing(t, p, b)
	})

	t.Run("l7-off", func(t *testing.T) {
		p := install(t, b, map[string]any{"l7": "off"})
		meshtest.CheckPasses(t, p, b, false)
		if pids := b.NodeProxies(); len(pids) != 0 {
			t.Errorf("l7 off runs node proxies: %v", pids)
		}
		before := p.ReadCounters(context.Background(), b.TB, b.App)
		for range 20 {
			b.Get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080")
		}
		deltas := mesh.DiffCounters(before, p.ReadCounters(context.Background(), b.TB, b.App))
		// The probes open a connection each; productpage keeps its connection to
		// reviews alive, so that one is counted once at least.
		for svc, want := range map[string]uint64{"productpage": 20, "reviews": 1} {
			got, unit, ok := mesh.InboundTotal(deltas, svc)
			if !ok || unit != meshkube.UnitConnections || got < want {
				t.Errorf("nodes counted %d %s into %s (ok %v), want %d: %+v", got, unit, svc, ok, want, deltas)
			}
		}
		bypassIsCaught(t, p, b)
		uninstallLeavesNothing(t, p, b)
	})
}

// splitCounts sends 400 requests for reviews from pod and checks the 25/75/0 split;
// it returns how many were sent.
func splitCounts(t *testing.T, b meshtest.Bed, from topology.Pod, addr, host string) int {
	t.Helper()
	counts := map[string]int{}
	const n = 400
	for range n {
		counts[b.Get(t, from, addr, host, "/")]++
	}
	if counts["reviews-v3-0"] != 0 {
		t.Errorf("weight-0 version got %d requests", counts["reviews-v3-0"])
	}
	if v1 := 100 * float64(counts["reviews-v1-0"]) / n; v1 < 15 || v1 > 35 {
		t.Errorf("v1 got %.1f%% of traffic, want 25 ± 10 (counts %v)", v1, counts)
	}
	t.Logf("split over %d requests: %v", n, counts)
	return n
}

func TestOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"mtls": "strict"}, "mtls", "WireGuard"},
		{map[string]any{"mtls": "permissive"}, "mtls", "WireGuard"},
		{map[string]any{"l7": "sometimes"}, "l7", "not one of on, off"},
		{map[string]any{"mesh_clients": "off"}, "mesh_clients", "every pod on its node"},
		{map[string]any{"trust_domain": "example.org"}, "trust_domain", "WireGuard"},
	} {
		_, err := mesh.New(Name, c.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != c.key || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an option error on %q mentioning %q", c.raw, err, c.key, c.want)
		}
	}
	for _, raw := range []map[string]any{nil, {"mtls": "off"}, {"l7": false}, {"l7": "on", "concurrency": 1, "telemetry": "off"}} {
		if _, err := mesh.New(Name, raw); err != nil {
			t.Errorf("%v refused: %v", raw, err)
		}
	}
}
