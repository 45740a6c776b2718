package ambient

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a tiny workload inside a pod.
const helperEnv = "MESHMARK_AMBIENT_HELPER"

func TestMain(m *testing.M) {
	// The profile starts the control plane as `<own binary> ambient-controlplane`;
	// in tests the own binary is this test binary.
	if len(os.Args) > 1 && os.Args[1] == ControlPlaneCommand {
		os.Exit(ControlPlaneMain(os.Args[2:]))
	}
	if os.Getenv(helperEnv) == "serve" {
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s from %s", os.Getenv("POD_NAME"), r.RemoteAddr)
		})
		if err := http.ListenAndServe(":"+os.Getenv("PORT"), nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// needZtunnel skips only when the binary is absent outside CI.
func needZtunnel(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	if _, err := prereq.ProxyBin("ztunnel"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("these tests run the real ztunnel: %v", err)
		}
		t.Skipf("ztunnel not installed: %v", err)
	}
}

type bed struct {
	tb  *testbed.Testbed
	app *topology.App
}

// newBed deploys productpage and reviews (v1 25%, v2 75%) over two nodes, the client
// on node0 and the services on node1 and node0, with workloads running.
func newBed(t *testing.T) bed {
	t.Helper()
	needZtunnel(t)
	ctx := context.Background()
	tb, err := testbed.New(ctx, testbed.Options{Nodes: 2, Namespace: "bookinfo", LogDir: os.Getenv("MESHMARK_TEST_LOGDIR")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Errorf("testbed close: %v", err)
		}
	})
	app, err := tb.Deploy(ctx, testbed.AppSpec{Name: "bookinfo", ClientNode: "node0", Deployments: []testbed.Deployment{
		{Service: "productpage", Port: 9080},
		{Service: "reviews", Version: "v1", Weight: 25, Port: 9080},
		{Service: "reviews", Version: "v2", Weight: 75, Port: 9080},
	}})
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := tb.WriteFile(app.Clients[0], "bin/server", self, 0o750)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range app.Pods() {
		if pod.Service == "" {
			continue
		}
		_, err := tb.Start(ctx, pod, substrate.ProcessSpec{
			Name: "app", Role: substrate.RoleWorkload, Argv: []string{bin},
			Env: []string{helperEnv + "=serve", fmt.Sprintf("PORT=%d", pod.Port), "POD_NAME=" + pod.Name},
			UID: substrate.WorkloadUID,
			Ready: func(ctx context.Context) error {
				c, err := tb.DialContext(ctx, pod, "tcp", fmt.Sprintf("127.0.0.1:%d", pod.Port))
				if err == nil {
					c.Close()
				}
				return err
			},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return bed{tb: tb, app: &app}
}

func install(t *testing.T, b bed, raw map[string]any, policies ...Policy) *Profile {
	t.Helper()
	mp, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	p := mp.(*Profile)
	p.Policies = policies
	if err := p.Install(context.Background(), b.tb, b.app); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Uninstall(context.Background(), b.tb); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return p
}

func TestSharedModeEnrollsEveryPod(t *testing.T) {
	b := newBed(t)
	p := install(t, b, map[string]any{"mtls": "strict"})
	e, err := p.Check(context.Background(), b.tb, b.app)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", e.Summary())
	for _, pe := range e.Pods {
		t.Logf("%+v", pe)
	}
	if !e.Pass {
		t.Fatalf("check failed: %v", e.Failures)
	}
}
