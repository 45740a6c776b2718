package envoysidecar

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/meshmark/meshmark/internal/topology"
)

// planApp is a bookinfo-shaped topology: productpage calls details and reviews,
// reviews (v1, v2, v3, v3 with two pods) calls ratings; the load generator is a client.
func planApp(withEdges bool) (*topology.App, []topology.Pod) {
	var meshed []topology.Pod
	ip := 10
	svc := func(name string, versions map[string]int) topology.Service {
		s := topology.Service{Name: name, Port: 9080, VIP: netip.AddrFrom4([4]byte{198, 19, 0, byte(ip)})}
		for _, v := range []string{"v1", "v2", "v3"} {
			n, ok := versions[v]
			if !ok {
				continue
			}
			ver := topology.Version{Name: v, Weight: 1}
			for i := range n {
				ip++
				p := topology.Pod{Name: fmt.Sprintf("%s-%s-%d", name, v, i), Service: name, Version: v, Port: 9080,
					IP: netip.AddrFrom4([4]byte{198, 18, 0, byte(ip)})}
				ver.Endpoints = append(ver.Endpoints, p)
				meshed = append(meshed, p)
			}
			s.Versions = append(s.Versions, ver)
		}
		return s
	}
	app := &topology.App{Name: "bookinfo", Services: []topology.Service{
		svc("productpage", map[string]int{"v1": 1}), svc("details", map[string]int{"v1": 1}),
		svc("reviews", map[string]int{"v1": 1, "v2": 1, "v3": 2}), svc("ratings", map[string]int{"v1": 1}),
	}, Clients: []topology.Pod{{Name: "loadgen-0"}}}
	if withEdges {
		app.Calls = map[string][]string{"productpage": {"details", "reviews"}, "reviews": {"ratings"}, "details": {}, "ratings": {}}
		app.Entrypoint = "productpage"
	}
	return app, meshed
}

// The enrollment check probes along the graph's edges: callers probe their callees,
// every service gets enough probes for each of its endpoints, no pod probes its own
// service, every meshed pod sends at least one probe, and far fewer probes go out than
// with every pod probing every service.
func TestProbePlanFollowsTheGraphsEdges(t *testing.T) {
	app, meshed := planApp(true)
	plan := probePlan(app, meshed)
	received := map[string]int{}
	sent := 0
	for _, pod := range meshed {
		if len(plan[pod.Name]) == 0 {
			t.Errorf("pod %s sends no probe: its outbound interception would go unproven", pod.Name)
		}
		for svc, n := range plan[pod.Name] {
			if svc == pod.Service {
				t.Errorf("pod %s probes its own service", pod.Name)
			}
			received[svc] += n
			sent += n
		}
	}
	if plan["productpage-v1-0"]["reviews"] == 0 || plan["productpage-v1-0"]["details"] == 0 || plan["reviews-v2-0"]["ratings"] == 0 {
		t.Errorf("callers do not probe their callees: %v", plan)
	}
	// ratings calls nothing: its one probe goes to details, which calls nothing either,
	// not to productpage, which would fan out. (details probes productpage in the
	// load generator's stead: the client is not meshed here.)
	if !reflect.DeepEqual(plan["ratings-v1-0"], map[string]int{"details": 1}) {
		t.Errorf("ratings, which calls nothing, probes %v; want one probe to details", plan["ratings-v1-0"])
	}
	if plan["details-v1-0"]["productpage"] != coverageProbes(app.Services[0]) {
		t.Errorf("productpage, which no meshed pod calls, is probed %v", plan["details-v1-0"])
	}
	if plan["productpage-v1-0"]["ratings"] != 0 {
		t.Errorf("productpage probes ratings, which it does not call: %v", plan["productpage-v1-0"])
	}
	for _, s := range app.Services {
		if want := coverageProbes(s); received[s.Name] < want {
			t.Errorf("service %s gets %d probes, want at least %d", s.Name, received[s.Name], want)
		}
	}
	// reviews v3 has two pods at a third of the traffic: 10 hits each needs 60 probes.
	if got := coverageProbes(app.Services[2]); got != 60 {
		t.Errorf("coverage probes for reviews: %d, want 60", got)
	}
	noEdges, _ := planApp(false)
	all := 0
	for _, m := range probePlan(noEdges, meshed) {
		for _, n := range m {
			all += n
		}
	}
	t.Logf("probes sent: %d along the edges, %d from every pod to every service", sent, all)
	if sent >= all {
		t.Errorf("probing along edges sends %d probes, every pod to every service %d", sent, all)
	}
}

// On a 100-pod fan-out (root calling nine leaf services, ten pods each) probing along
// the edges sends a small fraction of what every pod to every service sends.
func TestProbePlanScalesWithTheEdges(t *testing.T) {
	app := &topology.App{Name: "fanout-9", Calls: map[string][]string{"root": nil}, Entrypoint: "root",
		Clients: []topology.Pod{{Name: "loadgen"}}}
	var meshed []topology.Pod
	for i, name := range []string{"root", "leaf-0", "leaf-1", "leaf-2", "leaf-3", "leaf-4", "leaf-5", "leaf-6", "leaf-7", "leaf-8"} {
		s := topology.Service{Name: name, Port: 9080, VIP: netip.AddrFrom4([4]byte{198, 19, 0, byte(i + 1)})}
		v := topology.Version{Name: "v1", Weight: 1}
		for j := range 10 {
			p := topology.Pod{Name: fmt.Sprintf("%s-v1-%d", name, j), Service: name, Version: "v1", Port: 9080}
			v.Endpoints = append(v.Endpoints, p)
			meshed = append(meshed, p)
		}
		s.Versions = []topology.Version{v}
		app.Services = append(app.Services, s)
		if name != "root" {
			app.Calls["root"] = append(app.Calls["root"], name)
			app.Calls[name] = nil
		}
	}
	meshed = append(meshed, app.Clients[0])
	count := func(plan map[string]map[string]int) (n int) {
		for _, m := range plan {
			for _, k := range m {
				n += k
			}
		}
		return n
	}
	edges := count(probePlan(app, meshed))
	app.Calls = nil
	all := count(probePlan(app, meshed))
	t.Logf("101 pods: %d probes along the edges, %d from every pod to every service", edges, all)
	if edges*10 > all {
		t.Errorf("probing along the edges sends %d probes, more than a tenth of %d", edges, all)
	}
}
