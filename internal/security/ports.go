package security

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecondPort is where the probes open a listener of their own in a meshed pod,
// standing in for a port an application opens beside its service port (an admin or
// debug endpoint): clear of every port the meshes and the workload use.
const SecondPort = 19080

// podServer is a plain HTTP server the probe runs inside a pod; it counts the requests
// it answered, so that a refusal is told apart from a listener that was never there.
type podServer struct {
	srv    *http.Server
	served atomic.Int64
}

// listenInPod starts a podServer on port inside pod and proves it answers from the pod
// itself (over loopback, which no interception touches). It returns an error wrapping
// syscall.EADDRINUSE when something of the pod listens there already.
func listenInPod(ctx context.Context, tgt Target, pod topology.Pod, port int) (*podServer, error) {
	pl, ok := tgt.Sub.(substrate.PodListener)
	if !ok {
		return nil, errors.New("the substrate cannot open a listener in a pod")
	}
	ln, err := pl.ListenIn(pod, "tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return nil, err
	}
	ps := &podServer{}
	ps.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps.served.Add(1)
		fmt.Fprintf(w, "meshmark security probe: port %d of pod %s\n", port, pod.Name)
	})}
	go ps.srv.Serve(ln)
	res, err := mesh.ProbeHTTP(ctx, tgt.Sub, pod, fmt.Sprintf("127.0.0.1:%d", port), "", "/")
	if err != nil || res.Status != http.StatusOK {
		ps.close()
		return nil, fmt.Errorf("the probe's listener on port %d of %s does not answer from the pod itself: %v (HTTP %d)", port, pod.Name, err, res.Status)
	}
	return ps, nil
}

// close stops the server and its listener.
func (ps *podServer) close() { ps.srv.Close() }

// callPort sends one plain request from the vantage point to pod:port and says whether
// it was kept from the application: held only when the call was refused and the
// listener behind the port saw nothing.
func callPort(ctx context.Context, tgt Target, from topology.Pod, pod topology.Pod, port int, ps *podServer) (string, bool) {
	before := int64(0)
	if ps != nil {
		before = ps.served.Load()
	}
	res, err := mesh.ProbeHTTP(ctx, tgt.Sub, from, mesh.Addr(pod.IP, port), "", "/")
	obs, refused := meshprobe.Refusal(res, err)
	if ps != nil && ps.served.Load() > before {
		return "the application's listener answered without the proxy: " + obs, false
	}
	return obs, refused
}

// secondPortCheck: a caller with no mesh identity calls a port the pod's application
// opens beside its service port. A mesh that refuses plaintext refuses it there too
// (Istio's STRICT, Linkerd's all-authenticated and ztunnel's policy cover the whole
// workload); ok is false when the probe cannot open the port.
func secondPortCheck(ctx context.Context, tgt Target, from topology.Pod, where string, pod topology.Pod) (results.SecurityCheck, bool) {
	ps, err := listenInPod(ctx, tgt, pod, SecondPort)
	if err != nil {
		return results.SecurityCheck{}, false
	}
	defer ps.close()
	c := results.SecurityCheck{Target: fmt.Sprintf("%s -> pod %s, a second port of the app (%s)", where, pod.Name, mesh.Addr(pod.IP, SecondPort))}
	c.Observed, c.Held = callPort(ctx, tgt, from, pod, SecondPort, ps)
	return c, true
}

// excludedPortChecks: for each port the profile's interception excludes by design, a
// caller with no mesh identity calls it on pod. A free port gets the probe's listener
// (an application that happened to use it); a port the proxy itself serves is called as
// it is. Each check is documented: evidence of what the exclusion leaves open, not a
// failure of the mesh's promise.
func excludedPortChecks(ctx context.Context, tgt Target, from topology.Pod, where string, pod topology.Pod, ports []int) []results.SecurityCheck {
	var out []results.SecurityCheck
	for _, port := range ports {
		c := results.SecurityCheck{Target: fmt.Sprintf("%s -> pod %s port %d, excluded from interception", where, pod.Name, port), Documented: true}
		ps, err := listenInPod(ctx, tgt, pod, port)
		switch {
		case err == nil:
			c.Observed, c.Held = callPort(ctx, tgt, from, pod, port, ps)
			ps.close()
		case errors.Is(err, syscall.EADDRINUSE):
			obs, refused := callPort(ctx, tgt, from, pod, port, nil)
			c.Observed, c.Held = "the pod's own listener there (the proxy's): "+obs, refused
		default:
			c.Observed, c.Held = "not tried: "+err.Error(), true
		}
		out = append(out, c)
	}
	return out
}
