package none

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// loopback is a substrate whose pods all share the host's loopback: enough for a
// profile that only dials.
type loopback struct{ substrate.Substrate }

func (loopback) DialContext(ctx context.Context, _ topology.Pod, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func TestRejectsMeshOnlyOptions(t *testing.T) {
	for _, raw := range []map[string]any{{"mtls": "strict"}, {"mtls": "permissive"}, {"mesh_clients": true}} {
		_, err := mesh.New(Name, raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) {
			t.Errorf("none accepted %v: %v", raw, err)
		}
	}
	if _, err := mesh.New(Name, map[string]any{"mtls": "disabled", "concurrency": 2}); err != nil {
		t.Errorf("none refused harmless options: %v", err)
	}
}

func TestCheckReportsPodsThatDoNotAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	up := srv.Listener.Addr().(*net.TCPAddr)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := dead.Addr().(*net.TCPAddr).Port
	dead.Close() // nothing listens there any more

	lo := netip.MustParseAddr("127.0.0.1")
	app := &topology.App{Name: "t", Namespace: "default", Services: []topology.Service{{
		Name: "svc", Port: up.Port, Versions: []topology.Version{{Name: "v1", Endpoints: []topology.Pod{
			{Name: "up", Service: "svc", IP: lo, Port: up.Port},
			{Name: "down", Service: "svc", IP: lo, Port: deadPort},
		}}},
	}}, Clients: []topology.Pod{{Name: "loadgen", IP: lo}}}
	p, _ := mesh.New(Name, nil)
	e, err := p.Check(context.Background(), loopback{}, app)
	if err != nil {
		t.Fatal(err)
	}
	if e.Pass || len(e.Failures) != 1 || !strings.Contains(e.Failures[0], "pod down") {
		t.Fatalf("want exactly the dead pod reported, got %s", e.Summary())
	}
	if !e.Pods[0].Answered || e.Pods[1].Answered || len(e.Pods) != 3 {
		t.Errorf("per-pod results wrong: %+v", e.Pods)
	}
}

// TestNameIsTheStoredBaseline: the store and the analysis, below the registry, know the
// baseline by results.BaselineProfile; it must be this profile's name.
func TestNameIsTheStoredBaseline(t *testing.T) {
	if Name != results.BaselineProfile {
		t.Errorf("none.Name %q, results.BaselineProfile %q", Name, results.BaselineProfile)
	}
}
