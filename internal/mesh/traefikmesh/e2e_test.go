package traefikmesh

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshtest"
	"github.com/meshmark/meshmark/internal/prereq"
)

func TestMain(m *testing.M) {
	if os.Getenv(meshtest.HelperEnv) == "serve" {
		meshtest.ServeHelper()
		return
	}
	os.Exit(m.Run())
}

func TestTraefikMeshOnNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := prereq.ProxyBin("traefik"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Traefik: %v", err)
		}
		t.Fatalf("this test runs the real Traefik: %v", err)
	}
	b := meshtest.NewBed(t)
	ctx := context.Background()
	pm, err := mesh.New(Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := pm.(*Profile)
	if err := p.Install(ctx, b.TB, b.App); err != nil {
		t.Fatal(err)
	}
	meshtest.CheckPasses(t, p, b, true)
	if n := len(b.NodeProxies()); n != 3 {
		t.Errorf("%d node proxies running, want one per node (3)", n)
	}
	loadgen := b.App.Clients[0]
	productpage := b.Pod("productpage-v1-0")
	ppAuth, ppDial, _ := p.CalleeAddress(loadgen, "productpage")
	rvAuth, rvDial, _ := p.CalleeAddress(productpage, "reviews")
	if !strings.HasPrefix(ppAuth, "productpage.bookinfo.traefik.mesh:") || !strings.HasPrefix(rvDial, productpageNodeIP(t, b)+":") {
		t.Errorf("mesh addresses: productpage %s via %s, reviews from productpage %s via %s", ppAuth, ppDial, rvAuth, rvDial)
	}

	// The workload's own call by mesh name, through both nodes' Traefiks.
	q := url.Values{"to": {rvAuth}, "via": {rvDial}}
	if body := b.Get(t, loadgen, ppDial, ppAuth, "/?"+q.Encode()); !strings.HasPrefix(body, "productpage-v1-0>reviews-v") {
		t.Errorf("loadgen -> productpage -> reviews by mesh names returned %q", body)
	}
	// A name that is not the service's on its entry point is not routed.
	if r, err := mesh.ProbeHTTP(ctx, b.TB, productpage, rvDial, "productpage.bookinfo.traefik.mesh", "/"); err != nil || r.Status != 404 {
		t.Errorf("reviews' entry point with productpage's name: %+v %v, want 404", r, err)
	}

	// The weighted service honours 25/75/0.
	before := p.ReadCounters(ctx, b.TB, b.App)
	counts := map[string]int{}
	const n = 400
	for range n {
		counts[b.Get(t, productpage, rvDial, rvAuth, "/")]++
	}
	deltas := mesh.DiffCounters(before, p.ReadCounters(ctx, b.TB, b.App))
	t.Logf("split over %d requests: %v", n, counts)
	if counts["reviews-v3-0"] != 0 {
		t.Errorf("weight-0 version got %d requests", counts["reviews-v3-0"])
	}
	if v1 := 100 * float64(counts["reviews-v1-0"]) / n; v1 < 15 || v1 > 35 {
		t.Errorf("v1 got %.1f%% of traffic, want 25 ± 10 (counts %v)", v1, counts)
	}
	got, unit, ok := mesh.InboundTotal(deltas, "reviews")
	if !ok || unit != meshkube.UnitRequests || got != n {
		t.Errorf("Traefiks counted %d %s into reviews (ok %v) for %d requests: %+v", got, unit, ok, n, deltas)
	}

	// A pod whose mesh address leads straight to the service bypasses the proxy: the
	// request is answered, the check must still fail.
	reviewsPod := b.Pod("reviews-v1-0")
	host, port, _ := strings.Cut(rvDial, ":")
	dnat := []string{"-t", "nat", "-I", "OUTPUT", "-d", host + "/32", "-p", "tcp", "--dport", port, "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", reviewsPod.IP, reviewsPod.Port)}
	if out, err := b.TB.Exec(ctx, productpage, nil, append([]string{"iptables", "-w"}, dnat...)...); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	broken, err := p.Check(ctx, b.TB, b.App)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(broken.Failures, "\n")
	if broken.Pass || !strings.Contains(all, "pod productpage-v1-0 -> service reviews") || !strings.Contains(all, "bypassed the node proxy") {
		t.Errorf("check missed a pod that bypasses its node's Traefik: %s", broken.Summary())
	}
	for _, f := range broken.Failures {
		t.Logf("expected failure: %s", f)
		if !strings.HasPrefix(f, "pod productpage-v1-0 -> service reviews") {
			t.Errorf("unexpected failure: %s", f)
		}
	}
	dnat[2] = "-D"
	if out, err := b.TB.Exec(ctx, productpage, nil, append([]string{"iptables", "-w"}, dnat...)...); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	if err := p.Uninstall(ctx, b.TB); err != nil {
		t.Fatal(err)
	}
	if pids := b.NodeProxies(); len(pids) > 0 {
		t.Errorf("node proxies still running after Uninstall: %v", pids)
	}
	if c, err := b.TB.DialContext(ctx, productpage, "tcp", rvDial); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Uninstall", rvDial)
	}
}

func productpageNodeIP(t *testing.T, b meshtest.Bed) string {
	n, err := b.TB.NodePod(b.Pod("productpage-v1-0").Node)
	if err != nil {
		t.Fatal(err)
	}
	return n.IP.String()
}

func TestOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"mtls": "strict"}, "mtls", "no mTLS"},
		{map[string]any{"mtls": "permissive"}, "mtls", "no mTLS"},
		{map[string]any{"retries": "off"}, "retries", "not modelled"},
		{map[string]any{"mesh_clients": "on"}, "mesh_clients", "no opt-out"},
		{map[string]any{"l7": "on"}, "l7", "unknown option for traefik-mesh"},
	} {
		_, err := mesh.New(Name, c.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != c.key || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an option error on %q mentioning %q", c.raw, err, c.key, c.want)
		}
	}
	for _, raw := range []map[string]any{nil, {"mtls": "off"}, {"concurrency": 1, "access_log": "on"}} {
		if _, err := mesh.New(Name, raw); err != nil {
			t.Errorf("%v refused: %v", raw, err)
		}
	}
}
