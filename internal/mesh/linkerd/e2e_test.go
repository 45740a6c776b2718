package linkerd

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshtest"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a tiny workload inside a pod.
const helperEnv = "MESHMARK_LINKERD_HELPER"

// refuseIdentityEnv makes the control plane (this binary) refuse every Certify.
const refuseIdentityEnv = "MESHMARK_LINKERD_TEST_REFUSE_IDENTITY"

// This switches the package's dispatch off: TestMain below serves the control
// plane itself, so that a test can make it refuse identities.
var _ = func() bool { dispatchControlPlane = false; return true }()

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
		if err == nil && os.Getenv(refuseIdentityEnv) != "" {
			cfg.Workloads = nil // a control plane that knows no workload certifies none
		}
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

// serveHelper answers "<pod>|<client identity>"; /?to=host:port makes it call another service
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
		// The inbound proxy names a verified mesh client in l5d-client-id.
		fmt.Fprintf(w, "%s|%s", pod, r.Header.Get("l5d-client-id"))
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
	return newBedWith(t, testbed.Options{})
}

// newBedWith deploys productpage and reviews v1/v2/v3 (25/75/0) with the helper
// workload running in each pod.
func newBedWith(t testing.TB, opts testbed.Options) bed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	proxyBinary(t)
	ctx := context.Background()
	opts.Namespace, opts.LogDir = "bookinfo", os.Getenv("MESHMARK_TEST_LOGDIR")
	tb, err := testbed.New(ctx, opts)
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

// call sends a request from inside a pod (as root, so it is intercepted like the app's)
// and fails unless the workload answered 200.
func (b bed) call(from topology.Pod, addr, host, path string) (string, error) {
	r, err := get(context.Background(), b.tb, from, nil, addr, host, path)
	if err != nil {
		return "", err
	}
	if r.status != 200 {
		return r.body, fmt.Errorf("HTTP %d (l5d-proxy-error %q): %s", r.status, r.proxyError, r.body)
	}
	return r.body, nil
}

func TestLinkerdMeshInNamespaces(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	loadgen := b.app.Clients[0]
	productpage := b.pod("productpage-v1-0")
	reviewsVIP := mesh.Addr(b.app.Service("reviews").VIP, 9080)
	productpageVIP := mesh.Addr(b.app.Service("productpage").VIP, 9080)

	t.Run("permissive", func(t *testing.T) {
		p := install(t, b, nil) // Linkerd's defaults: mTLS between proxies, clients unmeshed
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

		// The workload's own call: app -> proxy -> mTLS -> proxy -> app; the callee's
		// proxy names the caller by the identity meshmark's control plane issued.
		body, err := b.call(loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080")
		if err != nil {
			t.Fatalf("loadgen -> productpage -> reviews: %v", err)
		}
		if want := "productpage.bookinfo.serviceaccount.identity.linkerd.cluster.local"; !strings.HasPrefix(body, "productpage-v1-0>reviews-v") || !strings.HasSuffix(body, "|"+want) {
			t.Errorf("workload call through the mesh returned %q, want the callee to see %s", body, want)
		}

		// On the wire: a TLS client holding a mesh certificate, dialing a pod's
		// intercepted port, is answered by that pod's proxy with the identity issued.
		conf, err := p.probeTLSConfig(b.app)
		if err != nil {
			t.Fatal(err)
		}
		node, err := b.tb.NodePod(productpage.Node)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"productpage-v1-0", "reviews-v2-0"} {
			pod := b.pod(name)
			c := conf.Clone()
			c.ServerName = p.Identity(b.app, pod)
			r, err := get(ctx, b.tb, node, c, mesh.Addr(pod.IP, 9080), "x", "/")
			if err != nil {
				t.Fatalf("mTLS to %s: %v", name, err)
			}
			leaf := r.peer[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.CA().Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				t.Errorf("%s: proxy certificate not from meshmark's CA: %v", name, err)
			}
			if want := p.Identity(b.app, pod); len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != want {
				t.Errorf("%s: proxy presented %v, want %s", name, leaf.DNSNames, want)
			}
			if life := time.Until(leaf.NotAfter); life > CertValidity || life < CertValidity-time.Hour {
				t.Errorf("%s: certificate lives %v, want about %v", name, life, CertValidity)
			}
			if probe := "meshmark-probe.bookinfo.serviceaccount.identity.linkerd.cluster.local"; r.status != 200 || !strings.HasSuffix(r.body, "|"+probe) {
				t.Errorf("%s over mTLS: HTTP %d %q, want 200 naming %s", name, r.status, r.body, probe)
			}
		}

		// The split 25/75/0, from inside productpage through its proxy.
		counts := map[string]int{}
		const n = 400
		for range n {
			body, err := b.call(productpage, reviewsVIP, "reviews:9080", "/")
			if err != nil {
				t.Fatal(err)
			}
			counts[strings.SplitN(body, "|", 2)[0]]++
		}
		if counts["reviews-v3-0"] != 0 {
			t.Errorf("weight-0 version got %d requests", counts["reviews-v3-0"])
		}
		// 25% of 400: a binomial standard deviation is 8.7 requests (2.2 points); 10
		// points is more than 4 of them.
		if v1 := 100 * float64(counts["reviews-v1-0"]) / n; v1 < 15 || v1 > 35 {
			t.Errorf("v1 got %.1f%% of traffic, want 25 ± 10 (counts %v)", v1, counts)
		}
		t.Logf("split over %d requests: %v", n, counts)

		// Telemetry: the entry proxy counts what it carried.
		before := p.ReadCounters(ctx, b.tb, b.app)
		for range 20 {
			if _, err := b.call(loadgen, productpageVIP, "productpage:9080", "/"); err != nil {
				t.Fatal(err)
			}
		}
		deltas := mesh.DiffCounters(before, p.ReadCounters(ctx, b.tb, b.app))
		if got, unit, ok := mesh.InboundTotal(deltas, "productpage"); !ok || got < 20 || unit != meshkube.UnitRequests {
			t.Errorf("proxies counted %d %s into productpage (ok %v), want >= 20 requests", got, unit, ok)
		}

		// The check must notice a pod whose inbound traffic bypasses its proxy.
		if out, err := b.tb.Exec(ctx, b.pod("reviews-v2-0"), nil, "iptables", "-w", "-t", "nat", "-F", chainInbound); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		broken, err := p.Check(ctx, b.tb, b.app)
		if err != nil {
			t.Fatal(err)
		}
		if broken.Pass || !strings.Contains(strings.Join(broken.Failures, "\n"), "pod reviews-v2-0: a direct request from unmeshed client loadgen bypassed its linkerd2-proxy") {
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
		if strings.Contains(string(out), "PROXY_INIT") {
			t.Errorf("rules left after Uninstall:\n%s", out)
		}
		if body, err := b.call(productpage, reviewsVIP, "reviews:9080", "/"); err != nil || !strings.HasSuffix(body, "|") {
			t.Errorf("after Uninstall, a direct call returned %q, %v", body, err)
		}
	})

	t.Run("control plane killed", func(t *testing.T) {
		p := install(t, b, nil)
		checkPasses(t, p, b)
		before := p.ReadCounters(ctx, b.tb, b.app)
		if err := p.ControlPlane().Stop(); err != nil {
			t.Fatal(err)
		}
		// As in Linkerd, the data plane keeps serving from what it was told: mTLS
		// with the certificates it holds, the endpoints and split it last received.
		deadline := time.Now().Add(5 * time.Second)
		n := 0
		for time.Now().Before(deadline) {
			body, err := b.call(loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080")
			if err != nil || !strings.HasSuffix(body, "|productpage.bookinfo.serviceaccount.identity.linkerd.cluster.local") {
				t.Fatalf("request %d after the control plane died: %q, %v", n, body, err)
			}
			n++
		}
		t.Logf("%d requests served through mTLS in the 5 s after the control plane was killed", n)
		// It is recorded: every proxy's counters, as stored with a trial, show the
		// failed control-plane streams and no ready destination controller.
		deltas := mesh.DiffCounters(before, p.ReadCounters(ctx, b.tb, b.app))
		if len(deltas) != 5 {
			t.Fatalf("%d entries read, want 4 proxies and the control plane", len(deltas))
		}
		for _, d := range deltas {
			if d.Component == ControlPlaneComponent {
				if !strings.Contains(d.Err, "identity, destination, policy API not answering") {
					t.Errorf("the dead control plane is recorded as %+v", d)
				}
				continue
			}
			if d.Err != "" {
				t.Fatalf("proxy %s unreadable after the control plane died: %s", d.Pod, d.Err)
			}
			var failures uint64
			for k, v := range d.Counters {
				if strings.HasPrefix(k, "control_response_total{") && strings.Contains(k, "classification=failure") {
					failures += v
				}
			}
			ready, ok := d.Gauges["control_destination_balancer_endpoints{addr="+netip.AddrPortFrom(p.cpIP, DestinationPort).String()+",endpoint_state=ready}"]
			if failures == 0 || !ok || ready != 0 {
				t.Errorf("proxy %s: %d failed control-plane responses, %d ready destination endpoints (present %v); want failures and none ready", d.Pod, failures, ready, ok)
			}
		}
	})

	t.Run("strict", func(t *testing.T) {
		p := install(t, b, map[string]any{"mtls": "strict"})
		e := checkPasses(t, p, b)
		meshtest.CheckPlaintextProven(t, e)
		for _, pe := range e.Pods {
			if !pe.Meshed || !pe.Sidecar {
				t.Errorf("under strict every pod, the client too, must be meshed: %+v", pe)
			}
			if pe.Service != "" && pe.InboundPlaintext != 0 {
				t.Errorf("pod %s served %d plaintext requests under strict", pe.Pod, pe.InboundPlaintext)
			}
		}
		if _, err := b.call(loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080"); err != nil {
			t.Errorf("meshed client under strict: %v", err)
		}
		node, err := b.tb.NodePod(productpage.Node)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := get(ctx, b.tb, node, nil, mesh.Addr(productpage.IP, 9080), "productpage", "/"); err == nil && r.status != 403 {
			t.Errorf("strict served plaintext from outside the mesh: HTTP %d %q", r.status, r.body)
		}
	})

	t.Run("authz", func(t *testing.T) {
		p := install(t, b, map[string]any{"authz": []any{"productpage"}})
		e := checkPasses(t, p, b)
		meshtest.CheckPlaintextProven(t, e)
		// productpage may call reviews; reviews may not call productpage.
		if _, err := b.call(productpage, reviewsVIP, "reviews:9080", "/"); err != nil {
			t.Errorf("allowed identity refused: %v", err)
		}
		r, err := get(ctx, b.tb, b.pod("reviews-v1-0"), nil, productpageVIP, "productpage:9080", "/")
		if err != nil || r.status != 403 {
			t.Errorf("identity outside authz: HTTP %d, %v; want 403", r.status, err)
		}
	})
}
