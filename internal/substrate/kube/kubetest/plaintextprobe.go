package kubetest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	corev1 "k8s.io/api/core/v1"
)

// PlaintextProbe is the plaintext probe pod's process as package kube has it, which
// this package cannot import (kube's own tests import it): the caller passes kube's
// pieces in.
type PlaintextProbe struct {
	// Selector picks the probe pods: kube.RoleLabel+"="+kube.PlaintextProbeRole.
	Selector string
	// ParseTarget reads one of a probe pod's --target arguments:
	// kube.ParsePlaintextTarget.
	ParseTarget func(arg string) (meshprobe.PlaintextTarget, error)
	// Run calls the targets and returns the report, as `meshmark plaintext-probe` does:
	// kube.RunPlaintextProbe.
	Run func(ctx context.Context, targets []meshprobe.PlaintextTarget, control *meshprobe.PlaintextTarget, dial meshprobe.DialFunc) []byte
	// Control is the positive control's service (kube.PlaintextControlService): a
	// plaintext service outside the mesh, which answers as the workload does unless
	// ControlDown says it cannot be reached.
	Control string
}

// PlaintextProbeStandIn stands in for the process of the plaintext probe's pods (see
// StandInPlaintextProbe).
type PlaintextProbeStandIn struct {
	mu    sync.Mutex
	seen  []corev1.Pod // each probe pod as it was when kwok had marked it running
	serve map[string]bool
	end   func(ctx context.Context, p *corev1.Pod, report []byte) error
	// controlDown makes the positive control unreachable, as from a pod whose cluster
	// DNS does not answer.
	controlDown bool
}

// ControlDown says whether the next probe pods can reach the positive control.
func (s *PlaintextProbeStandIn) ControlDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.controlDown = down
}

// StandInPlaintextProbe stands in for the process of every plaintext probe pod. kwok
// runs no container, so once kwok has marked a probe pod running, the test does what
// `meshmark plaintext-probe` would do in it with the pod's own arguments (probe.Run),
// except that each service's cluster name leads to a listener of the test: a server
// answering as the workload does for the services Set serves, and for the others a
// listener that closes every connection, as a sidecar that wants mTLS does; the positive
// control answers as the workload does (unless ControlDown). Then it ends
// the pod as the kubelet would, by default with the report as its termination message
// (Set may say otherwise).
func (c *Cluster) StandInPlaintextProbe(t testing.TB, probe PlaintextProbe) *PlaintextProbeStandIn {
	t.Helper()
	workloadAddr := serveLikeTheWorkload(t)
	closed := closingListener(t)
	s := &PlaintextProbeStandIn{}
	c.OnNewPods(t, probe.Selector, func(ctx context.Context, p *corev1.Pod) (bool, error) {
		if p.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		s.mu.Lock()
		s.seen = append(s.seen, *p.DeepCopy())
		serve, end, controlDown := s.serve, s.end, s.controlDown
		s.mu.Unlock()
		to := map[string]string{}
		var targets []meshprobe.PlaintextTarget
		var control *meshprobe.PlaintextTarget
		args := p.Spec.Containers[0].Args
		for i := 0; i+1 < len(args); i++ {
			if args[i] != "--target" && args[i] != "--control" {
				continue
			}
			tg, err := probe.ParseTarget(args[i+1])
			if err != nil {
				return true, err
			}
			if args[i] == "--control" {
				control = &tg
			} else {
				targets = append(targets, tg)
			}
			to[tg.Addr] = closed
			if serve[tg.Service] || tg.Service == probe.Control && probe.Control != "" && !controlDown {
				to[tg.Addr] = workloadAddr
			}
			if tg.Service == probe.Control && controlDown {
				to[tg.Addr] = "127.0.0.1:1" // nothing listens: connection refused, as a dead path gives
			}
		}
		report := probe.Run(ctx, targets, control, func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, to[addr])
		})
		if end != nil {
			return true, end(ctx, p, report)
		}
		return true, c.EndPod(ctx, p.Namespace, p.Name, 0, string(report))
	})
	return s
}

// Set says how the next probe pods behave: the services in serve answer as the workload
// does, and end, unless nil, ends each pod in place of the report (report is what the
// probe reported).
func (s *PlaintextProbeStandIn) Set(serve map[string]bool, end func(ctx context.Context, p *corev1.Pod, report []byte) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serve, s.end = serve, end
}

// Pods returns every probe pod the stand-in ran, as it was when kwok had marked it
// running.
func (s *PlaintextProbeStandIn) Pods() []corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// serveLikeTheWorkload answers as `meshmark service` does: with a trace naming the
// service (from the Host the probe sent) and a pod of it.
func serveLikeTheWorkload(t testing.TB) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		svc, _, _ := strings.Cut(r.Host, ".")
		fmt.Fprintf(w, `{"service":%q,"version":"v1","pod":"%s-v1-7d9c"}`, svc, svc)
	}))
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// closingListener closes every connection once its request has come in.
func closingListener(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// Read to the end of the request: closing with bytes unread would reset.
			_, _ = http.ReadRequest(bufio.NewReader(c))
			c.Close()
		}
	}()
	return l.Addr().String()
}
