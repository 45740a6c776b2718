package linkerd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a tiny workload inside a pod.
const helperEnv = "MESHMARK_LINKERD_HELPER"

// TestMain lets the test binary stand in for meshmark: as a pod's workload, and as
// `meshmark linkerd-controlplane`, which the profile starts from ControlPlaneBinary
// (by default os.Executable, here this binary).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "serve" {
		serveHelper()
		return
	}
	if len(os.Args) == 4 && os.Args[1] == ControlPlaneCommand && os.Args[2] == "--config" {
		cfg, err := controlplane.LoadConfig(os.Args[3])
		if err == nil {
			err = controlplane.Run(context.Background(), cfg)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// serveHelper answers with its pod name; /?to=host:port makes it call another service
// by name first, as a workload does (through its pod's interception and proxy).
func serveHelper() {
	pod := os.Getenv("POD_NAME")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + to + "/")
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			fmt.Fprintf(w, "%s>%s", pod, b)
			return
		}
		fmt.Fprintf(w, "%s|", pod)
	})
	if err := http.ListenAndServe(":"+os.Getenv("PORT"), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// proxyBinary skips only outside CI when linkerd2-proxy is absent.
func proxyBinary(t testing.TB) string {
	t.Helper()
	p, err := prereq.ProxyBin("linkerd2-proxy")
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("these tests run the real linkerd2-proxy: %v", err)
		}
		t.Fatalf("CI must provide linkerd2-proxy: %v", err)
	}
	return p
}

type bed struct {
	tb  *testbed.Testbed
	app *topology.App
}

func newBed(t *testing.T) bed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	proxyBinary(t)
	ctx := context.Background()
	tb, err := testbed.New(ctx, testbed.Options{Namespace: "bookinfo", LogDir: os.Getenv("MESHMARK_TEST_LOGDIR")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Errorf("testbed close: %v", err)
		}
	})
	app, err := tb.Deploy(ctx, testbed.AppSpec{Name: "bookinfo", Deployments: []testbed.Deployment{
		{Service: "productpage", Port: 9080},
		{Service: "reviews", Version: "v1", Weight: 25, Port: 9080},
		{Service: "reviews", Version: "v2", Weight: 75, Port: 9080},
		{Service: "reviews", Version: "v3", Weight: 0, Port: 9080},
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
	for _, s := range app.Services {
		for _, v := range s.Versions {
			for _, p := range v.Endpoints {
				_, err := tb.Start(ctx, p, substrate.ProcessSpec{
					Name: "app", Role: substrate.RoleWorkload, Argv: []string{bin},
					Env: []string{helperEnv + "=serve", fmt.Sprintf("PORT=%d", p.Port)},
					UID: substrate.WorkloadUID,
					Ready: func(ctx context.Context) error {
						c, err := tb.DialContext(ctx, p, "tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
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
		}
	}
	return bed{tb: tb, app: &app}
}

func (b bed) pod(name string) topology.Pod {
	for _, p := range b.app.Pods() {
		if p.Name == name {
			return p
		}
	}
	panic("no pod " + name)
}

func install(t *testing.T, b bed, raw map[string]any) *Profile {
	t.Helper()
	p, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Install(context.Background(), b.tb, b.app); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Uninstall(context.Background(), b.tb); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return p.(*Profile)
}

func checkPasses(t *testing.T, p mesh.Profile, b bed) mesh.Enrollment {
	t.Helper()
	e, err := p.Check(context.Background(), b.tb, b.app)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.MarshalIndent(e, "", "  ")
	if !e.Pass {
		t.Fatalf("enrollment failed: %s\n%s", e.Summary(), js)
	}
	t.Logf("%s\n%s", e.Summary(), js)
	return e
}

func TestLinkerdMeshInNamespaces(t *testing.T) {
	b := newBed(t)
	p := install(t, b, nil)
	checkPasses(t, p, b)
}
