package runner

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// namedMesh is a profile whose callers use its own names (as traefik-mesh does); only
// its addressing matters here.
type namedMesh struct{ mesh.Profile }

func (namedMesh) CalleeAddress(from topology.Pod, svc string) (string, string, bool) {
	if svc == "ghost" {
		return "", "", false
	}
	node := map[string]string{"node0": "198.18.1.1", "node1": "198.18.2.1"}[from.Node]
	port := map[string]string{"web": "5000", "api": "5001"}[svc]
	return svc + ".default.traefik.mesh:" + port, node + ":" + port, true
}

type plainMesh struct{ mesh.Profile }

func (plainMesh) Install(context.Context, substrate.Substrate, *topology.App) error { return nil }

// A mesh with its own names reaches the workload's flags, the load generator's URL
// and where its generator resolves names; any other mesh changes nothing.
func TestMeshAddressing(t *testing.T) {
	app := topology.App{Namespace: "default", Services: []topology.Service{
		{Name: "web", VIP: netip.MustParseAddr("198.18.128.1"), Port: 8080},
		{Name: "api", VIP: netip.MustParseAddr("198.18.128.2"), Port: 8081},
		{Name: "ghost", VIP: netip.MustParseAddr("198.18.128.3"), Port: 8082}}}
	client := topology.Pod{Name: "loadgen", Node: "node1"}
	d := &deployment{app: app, client: client, profile: namedMesh{}, entry: workload.Entrypoint{Service: "web", Port: 8080}}

	args := meshAddressArgs(d, topology.Pod{Name: "web-v1-0", Node: "node0"})
	want := []string{
		"--callee", "web=web.default.traefik.mesh:5000", "--resolve", "web.default.traefik.mesh=198.18.1.1:5000",
		"--callee", "api=api.default.traefik.mesh:5001", "--resolve", "api.default.traefik.mesh=198.18.1.1:5001",
	}
	if !slices.Equal(args, want) {
		t.Errorf("workload args\n got %q\nwant %q", args, want)
	}
	r := &runner{}
	if u := r.targetURL(d, &study.Experiment{}, "/x"); u != "http://web.default.traefik.mesh:5000/x" {
		t.Errorf("load target %s", u)
	}
	// The generator's pod is on node1: the mesh's names lead to its own node's proxy,
	// and only on their own service's port.
	resolve := generatorResolve(d)
	wantResolve := []string{
		"web:8080:198.18.128.1:8080", "web.default.traefik.mesh:5000:198.18.2.1:5000",
		"api:8081:198.18.128.2:8081", "api.default.traefik.mesh:5001:198.18.2.1:5001",
		"ghost:8082:198.18.128.3:8082",
	}
	if !slices.Equal(resolve, wantResolve) {
		t.Errorf("generator --resolve\n got %q\nwant %q", resolve, wantResolve)
	}
	if m, err := loadgen.ParseResolve(resolve); err != nil || m["web.default.traefik.mesh:5000"] != "198.18.2.1:5000" || m["web.default.traefik.mesh:5001"] != "" {
		t.Errorf("the generator reads %v (%v)", m, err)
	}

	d.profile = plainMesh{}
	if args := meshAddressArgs(d, client); args != nil {
		t.Errorf("plain mesh added workload args %q", args)
	}
	if u := r.targetURL(d, &study.Experiment{}, "/x"); u != "http://web:8080/x" {
		t.Errorf("plain mesh load target %s", u)
	}
	if resolve := generatorResolve(d); !slices.Equal(resolve, []string{"web:8080:198.18.128.1:8080", "api:8081:198.18.128.2:8081", "ghost:8082:198.18.128.3:8082"}) {
		t.Errorf("plain mesh generator --resolve %q", resolve)
	}
}

// clientPodDialer connects from the load generator's pod, names resolving as its
// /etc/hosts resolves them: for tests that call the app as the generator would.
func clientPodDialer(d *deployment) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.tb.DialContext(ctx, d.client, network, addr)
	}
}
