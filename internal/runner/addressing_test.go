package runner

import (
	"context"
	"slices"
	"testing"

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
// and its dialer; any other mesh changes nothing.
func TestMeshAddressing(t *testing.T) {
	app := topology.App{Namespace: "default", Services: []topology.Service{{Name: "web"}, {Name: "api"}, {Name: "ghost"}}}
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
	if dial, ok := meshDial(d, "web.default.traefik.mesh", "5000"); !ok || dial != "198.18.2.1:5000" {
		t.Errorf("load generator dials %s %v, want its own node's proxy", dial, ok)
	}
	if _, ok := meshDial(d, "web.default.traefik.mesh", "5001"); ok {
		t.Errorf("a mesh name on another service's port was resolved")
	}

	d.profile = plainMesh{}
	if args := meshAddressArgs(d, client); args != nil {
		t.Errorf("plain mesh added workload args %q", args)
	}
	if u := r.targetURL(d, &study.Experiment{}, "/x"); u != "http://web:8080/x" {
		t.Errorf("plain mesh load target %s", u)
	}
}
