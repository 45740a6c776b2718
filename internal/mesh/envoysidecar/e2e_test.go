package envoysidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshtest"
	"github.com/meshmark/meshmark/internal/mesh/none"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a tiny workload inside a pod instead of
// running tests.
const helperEnv = "MESHMARK_ENVOYSIDECAR_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "serve" {
		serveHelper()
		return
	}
	os.Exit(m.Run())
}

// serveHelper answers with its pod name and the caller identity its sidecar forwarded;
// /call?to=host:port makes it call another service by name, the way a workload does
// (through name resolution, the pod's interception and its sidecar).
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
		fmt.Fprintf(w, "%s|%s", pod, r.Header.Get("X-Forwarded-Client-Cert"))
	})
	if err := http.ListenAndServe(":"+os.Getenv("PORT"), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// bed is a testbed with a small bookinfo-like app whose workloads run.
type bed struct {
	tb  *testbed.Testbed
	app *topology.App
}

func newBed(t *testing.T) bed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	envoyBinary(t)
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

// get sends a request from inside a pod (as root, so it is intercepted like the app's).
func (b bed) get(t *testing.T, from topology.Pod, addr, host, path string) (string, error) {
	t.Helper()
	r, err := mesh.ProbeHTTP(context.Background(), b.tb, from, addr, host, path)
	if err != nil {
		return "", err
	}
	if r.Status != 200 {
		return r.Body, fmt.Errorf("HTTP %d: %s", r.Status, r.Body)
	}
	return r.Body, nil
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
	if !e.Pass {
		t.Fatalf("enrollment failed: %s\n%+v", e.Summary(), e.Pods)
	}
	js, _ := json.MarshalIndent(e, "", "  ")
	t.Logf("%s\n%s", e.Summary(), js)
	return e
}

func TestSidecarMeshInNamespaces(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	loadgen := b.app.Clients[0]
	productpage := b.pod("productpage-v1-0")
	reviewsVIP := mesh.Addr(b.app.Service("reviews").VIP, 9080)
	productpageVIP := mesh.Addr(b.app.Service("productpage").VIP, 9080)

	// Baseline: the none profile sees every pod answer directly.
	base, _ := mesh.New(none.Name, map[string]any{"mtls": "off"})
	if e := checkPasses(t, base, b); len(e.Pods) != 5 {
		t.Fatalf("none check covered %d pods, want 5", len(e.Pods))
	}

	t.Run("permissive", func(t *testing.T) {
		p := install(t, b, nil) // Istio's defaults: permissive, clients unmeshed
		e := checkPasses(t, p, b)
		for _, pe := range e.Pods {
			switch {
			case pe.Service == "":
				if pe.Meshed || pe.Sidecar {
					t.Errorf("client %s enrolled by default: %+v", pe.Pod, pe)
				}
			case !pe.Sidecar || pe.InboundRequests == 0 || pe.OutboundRequests == 0 || !pe.Answered:
				t.Errorf("pod %s not enrolled: %+v", pe.Pod, pe)
			case pe.Pod != "reviews-v3-0" && pe.InboundMTLS == 0:
				t.Errorf("pod %s saw no mTLS from the mesh: %+v", pe.Pod, pe)
			}
		}
		// The check's own plaintext from outside the mesh is accepted, as permissive
		// mode promises, and does not count as the mesh's traffic (reviews v3, of
		// weight 0, gets none).
		meshtest.CheckPermissiveWire(t, e, "reviews-v3-0")

		// The workload's own call goes app -> sidecar -> mTLS -> sidecar -> app, and
		// the callee learns the caller's identity from the verified certificate.
		body, err := b.get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080")
		if err != nil {
			t.Fatalf("loadgen -> productpage -> reviews: %v", err)
		}
		if !strings.HasPrefix(body, "productpage-v1-0>reviews-v") || !strings.Contains(body, "URI=spiffe://cluster.local/ns/bookinfo/sa/productpage") {
			t.Errorf("workload call through the mesh returned %q", body)
		}

		// Weighted split 25/75/0, intercepted from inside productpage.
		counts := map[string]int{}
		const n = 400
		for range n {
			body, err := b.get(t, productpage, reviewsVIP, "reviews:9080", "/")
			if err != nil {
				t.Fatal(err)
			}
			counts[strings.SplitN(body, "|", 2)[0]]++
		}
		if counts["reviews-v3-0"] != 0 {
			t.Errorf("weight-0 version got %d requests", counts["reviews-v3-0"])
		}
		if v1 := 100 * float64(counts["reviews-v1-0"]) / n; v1 < 15 || v1 > 35 {
			t.Errorf("v1 got %.1f%% of traffic, want 25 ± 10 (counts %v)", v1, counts)
		}

		// The check must notice a pod whose inbound traffic bypasses its sidecar.
		if out, err := b.tb.Exec(ctx, b.pod("reviews-v2-0"), nil, "iptables", "-w", "-t", "nat", "-F", "ISTIO_INBOUND"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		broken, err := p.Check(ctx, b.tb, b.app)
		if err != nil {
			t.Fatal(err)
		}
		if broken.Pass || !strings.Contains(strings.Join(broken.Failures, "\n"), "pod reviews-v2-0: a direct request from unmeshed client loadgen bypassed its sidecar") {
			t.Errorf("check missed a pod without inbound interception: %s", broken.Summary())
		}
		for _, f := range broken.Failures {
			t.Logf("expected failure: %s", f)
		}

		if err := p.Uninstall(ctx, b.tb); err != nil {
			t.Fatal(err)
		}
		out, err := b.tb.Exec(ctx, productpage, nil, "iptables-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "ISTIO") {
			t.Errorf("rules left after Uninstall:\n%s", out)
		}
		if body, err := b.get(t, productpage, reviewsVIP, "reviews:9080", "/"); err != nil || strings.Contains(body, "spiffe") {
			t.Errorf("after Uninstall, a direct call returned %q, %v", body, err)
		}
	})

	t.Run("strict", func(t *testing.T) {
		p := install(t, b, map[string]any{"mtls": "strict", "telemetry": "off"})
		e := checkPasses(t, p, b)
		meshtest.CheckPlaintextProven(t, e)
		for _, pe := range e.Pods {
			if !pe.Meshed || !pe.Sidecar {
				t.Errorf("under strict every pod, the client too, must be meshed: %+v", pe)
			}
			if pe.Service != "" && (pe.MTLSObserved != "mtls" || pe.InboundPlaintext != 0) {
				t.Errorf("pod %s observed %s (plaintext %d) under strict", pe.Pod, pe.MTLSObserved, pe.InboundPlaintext)
			}
		}
		// The meshed load generator still reaches the app.
		if _, err := b.get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080"); err != nil {
			t.Errorf("meshed client under strict: %v", err)
		}
		// An outsider (the node's namespace, not enrolled) is refused in plaintext.
		node, err := b.tb.NodePod(productpage.Node)
		if err != nil {
			t.Fatal(err)
		}
		if body, err := b.get(t, node, mesh.Addr(productpage.IP, 9080), "productpage", "/"); err == nil {
			t.Errorf("strict mTLS served plaintext from outside the mesh: %q", body)
		}
	})
}
