package ambient

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/topology"
	"gopkg.in/yaml.v3"
)

func splitApp() *topology.App {
	pod := func(name, svc, ver, ip, node string) topology.Pod {
		return topology.Pod{Name: name, Service: svc, Version: ver, Node: node, IP: netip.MustParseAddr(ip), Port: 9080}
	}
	return &topology.App{Namespace: "bookinfo", Services: []topology.Service{
		{Name: "productpage", VIP: netip.MustParseAddr("198.19.128.1"), Port: 9080, Versions: []topology.Version{
			{Name: "v1", Endpoints: []topology.Pod{pod("pp-0", "productpage", "v1", "198.18.1.2", "node0")}}}},
		{Name: "reviews", VIP: netip.MustParseAddr("198.19.128.2"), Port: 9080, Versions: []topology.Version{
			{Name: "v1", Weight: 20, Endpoints: []topology.Pod{pod("rv1-0", "reviews", "v1", "198.18.1.3", "node0")}},
			{Name: "v2", Weight: 80, Endpoints: []topology.Pod{pod("rv2-0", "reviews", "v2", "198.18.2.2", "node1"), pod("rv2-1", "reviews", "v2", "198.18.2.3", "node1")}},
			{Name: "v3", Weight: 0, Endpoints: []topology.Pod{pod("rv3-0", "reviews", "v3", "198.18.2.4", "node1")}}}},
	}, Clients: []topology.Pod{{Name: "loadgen", Node: "node1", IP: netip.MustParseAddr("198.18.2.5")}}}
}

// TestLocalConfigSplitsByCapacity: weights become per-connection capacity, a weight-0
// version is no endpoint, an unsplit service spreads evenly, unmeshed pods are TCP.
func TestLocalConfigSplitsByCapacity(t *testing.T) {
	app := splitApp()
	meshed := map[string]bool{"pp-0": true, "rv1-0": true, "rv2-0": true, "rv2-1": true, "rv3-0": true}
	cfg, err := BuildLocalConfig(app, meshed, ServiceAccount, "cluster.local", []Policy{StrictPolicy("bookinfo")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]LocalWorkload{}
	for _, w := range cfg.Workloads {
		byName[w.Name] = w
	}
	key := "bookinfo/reviews.bookinfo.svc.cluster.local"
	for name, want := range map[string]int{"rv1-0": 2000, "rv2-0": 4000, "rv2-1": 4000} {
		w := byName[name]
		if w.Capacity != want || w.Services[key][9080] != 9080 {
			t.Errorf("%s: capacity %d services %v, want capacity %d behind %s", name, w.Capacity, w.Services, want, key)
		}
	}
	if len(byName["rv3-0"].Services) != 0 {
		t.Errorf("weight-0 version is an endpoint: %v", byName["rv3-0"].Services)
	}
	if pp := byName["pp-0"]; pp.Services["bookinfo/productpage.bookinfo.svc.cluster.local"][9080] != 9080 {
		t.Errorf("unsplit service lost its endpoint: %v", pp.Services)
	}
	if byName["loadgen"].Protocol != "TCP" || byName["pp-0"].Protocol != "HBONE" {
		t.Errorf("protocols: loadgen %s, pp-0 %s", byName["loadgen"].Protocol, byName["pp-0"].Protocol)
	}
	if byName["rv2-1"].ServiceAccount != "reviews" || byName["rv2-1"].UID != "Kubernetes//v1/Pod/bookinfo/rv2-1" {
		t.Errorf("identity fields: %+v", byName["rv2-1"])
	}
	out, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// serde_yaml needs integer port keys and tagged enum values.
	for _, want := range []string{"9080: 9080", "- !Presence []", "action: Deny"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("config lacks %q:\n%s", want, out)
		}
	}
	var back map[string]any
	if err := yaml.Unmarshal(out, &back); err != nil {
		t.Fatalf("not YAML: %v", err)
	}
	app.Services[0].VIP = netip.Addr{}
	if _, err := BuildLocalConfig(app, meshed, ServiceAccount, "cluster.local", nil, nil); err == nil {
		t.Error("a service without VIP was accepted")
	}
}
