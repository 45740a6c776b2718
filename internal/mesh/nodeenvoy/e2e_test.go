package nodeenvoy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a tiny workload inside a pod.
const helperEnv = "MESHMARK_NODEENVOY_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "serve" {
		serveHelper()
		return
	}
	os.Exit(m.Run())
}

// serveHelper answers with its pod name; /?to=host:port makes it call another service
// by name, the way a workload does (name resolution, the pod's rules, its node).
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
		fmt.Fprint(w, pod)
	})
	if err := http.ListenAndServe(":"+os.Getenv("PORT"), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type bed struct {
	tb  *testbed.Testbed
	app *topology.App
}

// newBed deploys a bookinfo-like app on three nodes: the client alone on node0, the
// services spread over node1 and node2, so calls cross nodes and stay on one.
func newBed(t *testing.T) bed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	if _, err := prereq.Envoy(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Envoy: %v", err)
		}
		t.Fatalf("these tests run a real Envoy: %v", err)
	}
	ctx := context.Background()
	tb, err := testbed.New(ctx, testbed.Options{Nodes: 3, Namespace: "bookinfo", LogDir: os.Getenv("MESHMARK_TEST_LOGDIR")})
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
	for _, p := range app.Pods() {
		if p.Service == "" {
			continue
		}
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

func (b bed) get(t *testing.T, from topology.Pod, addr, host, path string) string {
	t.Helper()
	r, err := mesh.ProbeHTTP(context.Background(), b.tb, from, addr, host, path)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 {
		t.Fatalf("%s -> %s%s: HTTP %d: %s", from.Name, addr, path, r.Status, r.Body)
	}
	return r.Body
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
	if len(e.Pods) != len(b.app.Pods()) {
		t.Errorf("check covered %d pods, want %d", len(e.Pods), len(b.app.Pods()))
	}
	for _, pe := range e.Pods {
		if !pe.Meshed || !pe.Sidecar || !pe.Answered || pe.OutboundRequests == 0 {
			t.Errorf("pod %s not carried by its node proxy: %+v", pe.Pod, pe)
		}
	}
	return e
}

// bypassIsCaught makes productpage translate VIPs itself again (its rules flushed) and
// expects the check to name it.
func bypassIsCaught(t *testing.T, p mesh.Profile, b bed) {
	t.Helper()
	ctx := context.Background()
	if out, err := b.tb.Exec(ctx, b.pod("productpage-v1-0"), nil, "iptables", "-w", "-t", "nat", "-F", Chain); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	broken, err := p.Check(ctx, b.tb, b.app)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(broken.Failures, "\n")
	if broken.Pass || !strings.Contains(all, "pod productpage-v1-0 -> service reviews") || !strings.Contains(all, "bypassed the node proxy") {
		t.Errorf("check missed a pod that bypasses its node: %s", broken.Summary())
	}
	for _, f := range broken.Failures {
		t.Logf("expected failure: %s", f)
		if !strings.HasPrefix(f, "pod productpage-v1-0 ") {
			t.Errorf("failure blames another pod: %s", f)
		}
	}
}

// uninstallLeavesNothing removes the profile and checks every namespace is as before.
func uninstallLeavesNothing(t *testing.T, p *Profile, b bed) {
	t.Helper()
	ctx := context.Background()
	var pids []int
	for _, n := range p.nodes {
		if n.proc != nil {
			pids = append(pids, n.proc.PID())
		}
	}
	if err := p.Uninstall(ctx, b.tb); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("node Envoy pid %d still there after Uninstall (kill 0: %v)", pid, err)
		}
	}
	targets := b.app.Pods()
	for _, n := range []string{"node0", "node1", "node2"} {
		np, err := b.tb.NodePod(n)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, np)
	}
	for _, pod := range targets {
		out, err := b.tb.Exec(ctx, pod, nil, "iptables-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), Chain) {
			t.Errorf("%s: rules left after Uninstall:\n%s", pod.Name, out)
		}
	}
	// The testbed's own service path works again.
	b.get(t, b.app.Clients[0], mesh.Addr(b.app.Service("reviews").VIP, 9080), "reviews:9080", "/")
}

func TestCiliumEnvoyOnNodes(t *testing.T) {
	b := newBed(t)
	loadgen := b.app.Clients[0]
	productpage := b.pod("productpage-v1-0")
	reviewsVIP := mesh.Addr(b.app.Service("reviews").VIP, 9080)
	productpageVIP := mesh.Addr(b.app.Service("productpage").VIP, 9080)

	t.Run("l7", func(t *testing.T) {
		p := install(t, b, nil)
		checkPasses(t, p, b)
		// A workload's own call by name crosses both nodes' Envoys.
		if body := b.get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080"); !strings.HasPrefix(body, "productpage-v1-0>reviews-v") {
			t.Errorf("loadgen -> productpage -> reviews returned %q", body)
		}

		before := p.ReadCounters(context.Background(), b.tb, b.app)
		counts := map[string]int{}
		const n = 400
		for range n {
			counts[b.get(t, productpage, reviewsVIP, "reviews:9080", "/")]++
		}
		after := p.ReadCounters(context.Background(), b.tb, b.app)
		if counts["reviews-v3-0"] != 0 {
			t.Errorf("weight-0 version got %d requests", counts["reviews-v3-0"])
		}
		if v1 := 100 * float64(counts["reviews-v1-0"]) / n; v1 < 15 || v1 > 35 {
			t.Errorf("v1 got %.1f%% of traffic, want 25 ± 10 (counts %v)", v1, counts)
		}
		t.Logf("split over %d requests: %v", n, counts)
		deltas := mesh.DiffCounters(before, after)
		got, unit, ok := mesh.InboundTotal(deltas, "reviews")
		if !ok || unit != mesh.UnitRequests || got < n {
			t.Errorf("node Envoys counted %d %s into reviews (ok %v) for %d requests: %+v", got, unit, ok, n, deltas)
		}
		for _, d := range deltas {
			if d.Pod == productpage.Node && d.Inbound["reviews"] < n {
				t.Errorf("productpage's node %s counted %d for reviews", d.Pod, d.Inbound["reviews"])
			}
		}
		bypassIsCaught(t, p, b)
		uninstallLeavesNothing(t, p, b)
	})

	t.Run("l7-off", func(t *testing.T) {
		nodeProxies := func() (n int) {
			for _, pr := range b.tb.Processes() {
				if pr.Spec().Role == substrate.RoleNodeProxy {
					n++
				}
			}
			return n
		}
		already := nodeProxies()
		p := install(t, b, map[string]any{"l7": "off"})
		checkPasses(t, p, b)
		before := p.ReadCounters(context.Background(), b.tb, b.app)
		for range 20 {
			b.get(t, loadgen, productpageVIP, "productpage:9080", "/?to=reviews:9080")
		}
		deltas := mesh.DiffCounters(before, p.ReadCounters(context.Background(), b.tb, b.app))
		// The probes open a connection each; productpage keeps its connection to
		// reviews alive, so that one is counted once at least.
		for svc, want := range map[string]uint64{"productpage": 20, "reviews": 1} {
			got, unit, ok := mesh.InboundTotal(deltas, svc)
			if !ok || unit != mesh.UnitConnections || got < want {
				t.Errorf("nodes counted %d %s into %s (ok %v), want %d: %+v", got, unit, svc, ok, want, deltas)
			}
		}
		if n := nodeProxies(); n != already {
			t.Errorf("l7 off started %d node proxies", n-already)
		}
		bypassIsCaught(t, p, b)
		uninstallLeavesNothing(t, p, b)
	})
}

func TestOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"mtls": "strict"}, "mtls", "WireGuard"},
		{map[string]any{"mtls": "permissive"}, "mtls", "WireGuard"},
		{map[string]any{"l7": "sometimes"}, "l7", "not one of on, off"},
		{map[string]any{"mesh_clients": "off"}, "mesh_clients", "every pod on its node"},
		{map[string]any{"trust_domain": "example.org"}, "trust_domain", "WireGuard"},
	} {
		_, err := mesh.New(Name, c.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != c.key || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an option error on %q mentioning %q", c.raw, err, c.key, c.want)
		}
	}
	for _, raw := range []map[string]any{nil, {"mtls": "off"}, {"l7": false}, {"l7": "on", "concurrency": 1, "telemetry": "off"}} {
		if _, err := mesh.New(Name, raw); err != nil {
			t.Errorf("%v refused: %v", raw, err)
		}
	}
}
