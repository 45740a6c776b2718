// Package meshtest holds what the mesh profiles' end-to-end tests share: a
// bookinfo-like app on a real multi-node testbed whose workloads are the test binary
// itself acting as a tiny HTTP service (ServeHelper), and the checks of what an
// enrollment check proved.
package meshtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
)

// HelperEnv makes a test binary act as the workload (see ServeHelper): a test's
// TestMain calls ServeHelper and returns when it is set to "serve".
const HelperEnv = "MESHMARK_MESHTEST_HELPER"

// ServeHelper answers with its pod name. /?to=authority[&via=ip:port] makes it call
// another service first, with that authority in the URL (name:port, or a mesh's own
// name), dialling via instead of resolving the name when given, and answers
// "<pod>><callee's answer>".
func ServeHelper() {
	pod := os.Getenv("POD_NAME")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			tr := &http.Transport{}
			if via := r.URL.Query().Get("via"); via != "" {
				tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, via)
				}
			}
			resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: tr}).Get("http://" + to + "/")
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

// Bed is a testbed with the app deployed and its workloads serving.
type Bed struct {
	TB  *testbed.Testbed
	App *topology.App
}

// NewBed deploys productpage and reviews v1/v2/v3 (weights 25/75/0) on three nodes:
// the client alone on node0, the services over node1 and node2, so calls both cross
// nodes and stay on one. The caller has checked for root and its proxy binary.
func NewBed(t *testing.T) Bed {
	t.Helper()
	return NewBedWith(t)
}

// NewBedWith is NewBed with more services deployed beside productpage and reviews.
func NewBedWith(t *testing.T, extra ...testbed.Deployment) Bed {
	t.Helper()
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
	app, err := tb.Deploy(ctx, testbed.AppSpec{Name: "bookinfo", ClientNode: "node0", Deployments: append([]testbed.Deployment{
		{Service: "productpage", Port: 9080},
		{Service: "reviews", Version: "v1", Weight: 25, Port: 9080},
		{Service: "reviews", Version: "v2", Weight: 75, Port: 9080},
		{Service: "reviews", Version: "v3", Weight: 0, Port: 9080},
	}, extra...)})
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
			Env: []string{HelperEnv + "=serve", fmt.Sprintf("PORT=%d", p.Port)},
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
	return Bed{TB: tb, App: &app}
}

// Nodes are the testbed's node names.
var Nodes = []string{"node0", "node1", "node2"}

// Pod returns the named pod of the app.
func (b Bed) Pod(name string) topology.Pod {
	for _, p := range b.App.Pods() {
		if p.Name == name {
			return p
		}
	}
	panic("no pod " + name)
}

// Get sends one request from inside a pod and requires a 200.
func (b Bed) Get(t *testing.T, from topology.Pod, addr, host, path string) string {
	t.Helper()
	r, err := mesh.ProbeHTTP(context.Background(), b.TB, from, addr, host, path)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 {
		t.Fatalf("%s -> %s%s: HTTP %d: %s", from.Name, addr, path, r.Status, r.Body)
	}
	return r.Body
}

// CheckPasses runs the profile's check and requires every pod enrolled, its traffic
// counted on its node, and (proxied) its node's proxy up.
func CheckPasses(t *testing.T, p mesh.Profile, b Bed, proxied bool) mesh.Enrollment {
	t.Helper()
	e, err := p.Check(context.Background(), b.TB, b.App)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Pass {
		t.Fatalf("enrollment failed: %s\n%+v", e.Summary(), e.Pods)
	}
	t.Log(e.Summary())
	if len(e.Pods) != len(b.App.Pods()) {
		t.Errorf("check covered %d pods, want %d", len(e.Pods), len(b.App.Pods()))
	}
	for _, pe := range e.Pods {
		if !pe.Meshed || pe.Sidecar != proxied || !pe.Answered || pe.OutboundRequests == 0 {
			t.Errorf("pod %s not carried by its node (proxied %v): %+v", pe.Pod, proxied, pe)
		}
	}
	return e
}

// NodeProxies counts the node-proxy processes of the testbed still running.
func (b Bed) NodeProxies() (pids []int) {
	for _, pr := range b.TB.Processes() {
		if pr.Spec().Role == substrate.RoleNodeProxy && alive(pr.PID()) {
			pids = append(pids, pr.PID())
		}
	}
	return pids
}

// CheckPlaintextProven fails t unless e holds the proof that the checks of a mesh
// that refuses plaintext store (mesh.Enrollment.JudgePlaintext): plaintext requests
// from outside the mesh, each refused, and their positive controls, each answered.
func CheckPlaintextProven(t testing.TB, e mesh.Enrollment) {
	t.Helper()
	if e.PlaintextRefused == nil || !*e.PlaintextRefused {
		t.Errorf("the check did not establish that plaintext is refused: %v %v", e.PlaintextRefused, e.Failures)
	}
	if len(e.Plaintext) == 0 || len(e.PlaintextControl) == 0 {
		t.Errorf("plaintext requests %+v, positive controls %+v: want both kept", e.Plaintext, e.PlaintextControl)
	}
	for _, p := range e.Plaintext {
		if !p.Refused {
			t.Errorf("plaintext request %s served: %s", p.Target, p.Observed)
		}
	}
	for _, c := range e.PlaintextControl {
		if c.Refused {
			t.Errorf("positive control %s not answered: %s", c.Target, c.Observed)
		}
	}
	t.Logf("%s", meshprobe.DescribeProof(e.Plaintext, e.PlaintextControl))
}

// CheckPermissiveWire fails t unless each service pod of e, checked under permissive
// mTLS, accepted the check's own plaintext from outside the mesh and counted it apart
// (mesh.PodEnrollment.ObserveInbound), so that what the mesh's own pods sent it reads
// mTLS only; pods named in idle get no traffic from the mesh (a version of weight 0)
// and read none.
func CheckPermissiveWire(t testing.TB, e mesh.Enrollment, idle ...string) {
	t.Helper()
	for _, pe := range e.Pods {
		if pe.Service == "" {
			continue
		}
		want := map[bool]string{true: "none", false: "mtls"}[slices.Contains(idle, pe.Pod)]
		if pe.MTLSObserved != want || pe.OutsidePlaintext == 0 || pe.OutsidePlaintext > pe.InboundPlaintext {
			t.Errorf("pod %s: mTLS observed %q with %d of %d plaintext requests from outside the mesh; want %q, and the outsider's probe counted",
				pe.Pod, pe.MTLSObserved, pe.OutsidePlaintext, pe.InboundPlaintext, want)
		}
	}
}
