package nodeenvoy

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/topology"
)

func smallApp() *topology.App {
	pod := func(svc, ver, ip string) topology.Pod {
		return topology.Pod{Name: svc + "-" + ver + "-0", Service: svc, Version: ver, IP: netip.MustParseAddr(ip), Port: 9080}
	}
	return &topology.App{Name: "bookinfo", Namespace: "bookinfo", Services: []topology.Service{
		{Name: "productpage", Port: 9080, VIP: netip.MustParseAddr("198.19.128.1"), Versions: []topology.Version{{Name: "v1", Weight: 100, Endpoints: []topology.Pod{pod("productpage", "v1", "198.18.1.2")}}}},
		{Name: "reviews", Port: 9080, VIP: netip.MustParseAddr("198.19.128.2"), Versions: []topology.Version{
			{Name: "v1", Weight: 25, Endpoints: []topology.Pod{pod("reviews", "v1", "198.18.1.3")}},
			{Name: "v2", Weight: 75, Endpoints: []topology.Pod{pod("reviews", "v2", "198.18.2.2")}},
		}},
	}}
}

func TestRules(t *testing.T) {
	app := smallApp()
	pp := app.Services[0].Versions[0].Endpoints[0]
	on := PodRules(app, pp, true)
	if !strings.Contains(on, `-A MM-NODEPROXY -d 198.19.128.1/32 -p tcp -m tcp --dport 9080 -m comment --comment "service productpage to the node" -j ACCEPT`) ||
		!strings.Contains(on, "-I OUTPUT 1 -p tcp -j MM-NODEPROXY") {
		t.Errorf("pod rules with l7:\n%s", on)
	}
	if off := PodRules(app, pp, false); strings.Contains(off, "service productpage") || !strings.Contains(off, "service reviews") {
		t.Errorf("without l7 a pod keeps translating its own service only:\n%s", off)
	}
	if n := NodeRules(app, true); !strings.Contains(n, `--comment "service reviews" -j REDIRECT --to-ports 15001`) || !strings.Contains(n, "-I PREROUTING 1 -p tcp -j MM-NODEPROXY") {
		t.Errorf("node rules with l7:\n%s", n)
	}
	if n := NodeRules(app, false); strings.Contains(n, "REDIRECT") || !strings.Contains(n, `--comment "service reviews" -j RETURN`) {
		t.Errorf("node rules without l7:\n%s", n)
	}
}

func TestParseRuleCounters(t *testing.T) {
	got := ParseRuleCounters(`*nat
:MM-NODEPROXY - [0:0]
[5:300] -A PREROUTING -p tcp -j MM-NODEPROXY
[7:420] -A MM-NODEPROXY -d 198.19.128.1/32 -p tcp -m tcp --dport 9080 -m comment --comment "service productpage" -j RETURN
[0:0] -A MM-NODEPROXY -d 198.19.128.2/32 -p tcp -m tcp --dport 9080 -m comment --comment "service reviews" -j RETURN
[9:540] -A MESHMARK-SERVICES -d 198.19.128.2/32 -p tcp -m tcp --dport 9080 -m comment --comment "service reviews" -j MM-SVC-A
COMMIT
`)
	if len(got) != 2 || got["productpage"] != 7 || got["reviews"] != 0 {
		t.Errorf("counters %v", got)
	}
}

func TestInboundOf(t *testing.T) {
	got := InboundOf(smallApp(), map[string]uint64{
		"cluster.outbound|9080||productpage.bookinfo.svc.cluster.local.upstream_rq_total":   4,
		"cluster.outbound|9080|v1|reviews.bookinfo.svc.cluster.local.upstream_rq_total":     3,
		"cluster.outbound|9080|v2|reviews.bookinfo.svc.cluster.local.upstream_rq_total":     9,
		"cluster.outbound|9080||reviews.bookinfo.svc.cluster.local.upstream_rq_total":       0,
		"cluster.outbound|9080|v2|reviews.bookinfo.svc.cluster.local.upstream_rq_completed": 9,
		"cluster.outbound|9080||other.elsewhere.svc.cluster.local.upstream_rq_total":        5,
	})
	if got["productpage"] != 4 || got["reviews"] != 12 || len(got) != 2 {
		t.Errorf("inbound %v", got)
	}
}

// The node Envoy's bootstrap is accepted by the real Envoy, with and without
// telemetry, and has no inbound side.
func TestBootstrapValidates(t *testing.T) {
	envoy, err := prereq.Envoy()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Envoy: %v", err)
		}
		t.Fatal(err)
	}
	node := topology.Pod{Name: "node0", Node: "node0", IP: netip.MustParseAddr("198.18.1.1")}
	for _, telemetry := range []bool{true, false} {
		o := mesh.DefaultOptions()
		o.Telemetry = telemetry
		b, err := envoysidecar.BuildOutboundBootstrap(smallApp(), node, o)
		if err != nil {
			t.Fatal(err)
		}
		js, err := envoysidecar.MarshalBootstrap(b)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(js), "virtualInbound") || !strings.Contains(string(js), "router~198.18.1.1~node0") {
			t.Errorf("node bootstrap has an inbound side or a sidecar's id:\n%.400s", js)
		}
		if !telemetry && !strings.Contains(string(js), `upstream_rq_total`) {
			t.Errorf("telemetry off drops the counters the check needs")
		}
		path := filepath.Join(t.TempDir(), "envoy.json")
		if err := os.WriteFile(path, js, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.CommandContext(context.Background(), envoy, "--mode", "validate", "-c", path, "--log-level", "error").CombinedOutput(); err != nil {
			t.Fatalf("envoy rejected the node bootstrap: %v\n%s", err, out)
		}
	}
}
