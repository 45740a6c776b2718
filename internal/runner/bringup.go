package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// deployment is one mesh brought up on a fresh local testbed: the pods, the mesh's
// data plane and the workload, ready for load.
type deployment struct {
	mesh       *study.Mesh
	tb         *testbed.Testbed
	app        topology.App
	profile    mesh.Profile
	enrollment mesh.Enrollment
	// sut is the system under test as brought up: every process the substrate runs
	// for it, watched during each trial.
	sut []substrate.Process
	// client is the load generator's pod; generator is the generator process in it
	// (meshmark-pod generator), which gen drives.
	client    topology.Pod
	generator substrate.Process
	gen       *loadgen.Pool
	entry     workload.Entrypoint
	// podBin is the copy of meshmark-pod the deployment's pods run.
	podBin string
	took   time.Duration
	// phases says where bring-up time went, for the progress line.
	phases []string
}

// bringUp creates a testbed, installs the mesh before the workload starts (interception
// must be in place for the first connection), starts every service, and proves the mesh
// is set up as claimed.
func (r *runner) bringUp(ctx context.Context, m *study.Mesh) (d *deployment, err error) {
	start := time.Now()
	last := start
	phase := func(name string) {
		now := time.Now()
		d.phases = append(d.phases, fmt.Sprintf("%s %s", name, now.Sub(last).Round(time.Millisecond)))
		last = now
	}
	profile, err := mesh.New(m.Profile, m.Options)
	if err != nil {
		return nil, fmt.Errorf("mesh %s: %w", m.Name, err)
	}
	// Bring-up is CPU-heavy (a proxy per pod) and everything it starts inherits
	// meshmark's mask: on every CPU it may use, then placed by pin once checked.
	if err := r.unpin(); err != nil {
		return nil, fmt.Errorf("bring-up on all CPUs: %w", err)
	}
	local := r.study.Spec.Substrate.Local
	tb, err := testbed.New(ctx, testbed.Options{Nodes: local.Nodes, LogDir: r.logDir(m.Name)})
	if err != nil {
		return nil, err
	}
	d = &deployment{mesh: m, tb: tb, profile: profile, entry: r.graph.Entrypoint()}
	phase("testbed")
	defer func() {
		if err != nil {
			d.close()
			d = nil
		}
	}()
	var deps []testbed.Deployment
	for _, w := range r.graph.Deployments() {
		deps = append(deps, testbed.Deployment{Service: w.Service, Version: w.Version, Weight: w.Weight, Replicas: w.Replicas, Port: w.Port, Protocol: w.Protocol})
	}
	if r.study.IngressExperiment() >= 0 {
		// The gateway is a service of the app, so every profile enrolls its pod.
		deps = append(deps, testbed.Deployment{Service: gateway.Service, Weight: 1, Replicas: 1, Port: gateway.Port, Protocol: r.entryProtocol()})
	}
	d.app, err = tb.Deploy(ctx, testbed.AppSpec{
		Name:        r.graph.Name,
		Deployments: deps,
		ClientNode:  fmt.Sprintf("node%d", local.LoadgenNode),
	})
	if err != nil {
		return d, err
	}
	if len(d.app.Clients) == 0 {
		return d, errors.New("testbed deployed no client pod for the load generator")
	}
	d.client = d.app.Clients[0]
	d.app.Calls, d.app.Entrypoint = graphEdges(r.graph), r.graph.Entrypoint().Service
	phase("pods")
	if err := profile.Install(ctx, tb, &d.app); err != nil {
		return d, fmt.Errorf("mesh %s: install: %w", m.Name, err)
	}
	phase("mesh")
	if err := r.startWorkload(ctx, d); err != nil {
		return d, err
	}
	phase("workload")
	if err := r.startGenerator(ctx, d); err != nil {
		return d, err
	}
	phase("generator")
	d.enrollment, err = profile.Check(ctx, tb, &d.app)
	if err != nil {
		return d, fmt.Errorf("mesh %s: enrollment check: %w", m.Name, err)
	}
	phase("check")
	if err := r.pin(d); err != nil {
		return d, err
	}
	for _, p := range liveProcesses(tb) {
		if p.Spec().Role != substrate.RoleLoadGen {
			d.sut = append(d.sut, p)
		}
	}
	d.took = time.Since(start)
	return d, nil
}

// startWorkload starts `meshmark-pod service` in every service pod, all at once, and
// waits until each answers its health check from inside its own pod.
func (r *runner) startWorkload(ctx context.Context, d *deployment) error {
	exe, err := r.podBinary(d)
	if err != nil {
		return err
	}
	graphArg, err := r.graphArg(d)
	if err != nil {
		return err
	}
	// A service is pinned to the system-under-test CPUs once it is up. Sized for every
	// CPU at its start, the Go runtime would shrink itself a second or so later, in
	// the middle of the warm-up or the trial; sized for the placement, it never changes.
	var env []string
	if _, sut := placement(r.study.Spec.Substrate.Local); len(sut) > 0 {
		env = []string{"GOMAXPROCS=" + strconv.Itoa(len(sut))}
	}
	byKey := map[string]workload.Deployment{}
	for _, w := range r.graph.Deployments() {
		byKey[w.Service+"/"+w.Version] = w
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, pod := range d.app.Pods() {
		if pod.Service == "" {
			continue
		}
		if pod.Service == gateway.Service {
			wg.Add(1)
			go func(pod topology.Pod) {
				defer wg.Done()
				if err := r.startGateway(ctx, d, pod); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("start %s: %w", pod.Name, err))
					mu.Unlock()
				}
			}(pod)
			continue
		}
		w, ok := byKey[pod.Service+"/"+pod.Version]
		if !ok {
			return fmt.Errorf("pod %s: no deployment %s %s in graph %s", pod.Name, pod.Service, pod.Version, r.graph.Name)
		}
		argv := append([]string{exe}, r.graph.ServiceArgs(w, pod.Name)...)
		for i := range argv {
			if argv[i] == "--graph" && i+1 < len(argv) {
				argv[i+1] = graphArg
			}
		}
		argv = append(argv, meshAddressArgs(d, pod)...)
		wg.Add(1)
		go func(pod topology.Pod) {
			defer wg.Done()
			_, err := d.tb.Start(ctx, pod, substrate.ProcessSpec{
				Name:  "app",
				Role:  substrate.RoleWorkload,
				Argv:  argv,
				Env:   env,
				UID:   substrate.WorkloadUID,
				Ready: healthy(d.tb, pod),
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("start %s: %w", pod.Name, err))
				mu.Unlock()
			}
		}(pod)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// meshAddressArgs tells a workload how to address its callees when the mesh has names
// of its own (mesh.Addressing), or which pods to spread its calls over when callers
// balance per request themselves (mesh.Spreader), as `meshmark-pod service` flags.
func meshAddressArgs(d *deployment, from topology.Pod) []string {
	var args []string
	if sp, ok := d.profile.(mesh.Spreader); ok {
		for _, s := range d.app.Services {
			eps, ok := sp.SpreadEndpoints(&d.app, s.Name)
			if !ok {
				continue
			}
			args = append(args, "--spread", workload.FormatSpread(s.Name, eps))
		}
	}
	ma, ok := d.profile.(mesh.Addressing)
	if !ok {
		return args
	}
	for _, s := range d.app.Services {
		authority, dial, ok := ma.CalleeAddress(from, s.Name)
		if !ok {
			continue
		}
		host, _, err := net.SplitHostPort(authority)
		if err != nil {
			continue
		}
		args = append(args, "--callee", s.Name+"="+authority, "--resolve", host+"="+dial)
	}
	return args
}

// healthy polls the service's health endpoint from inside its own pod, straight to the
// app's port on loopback so that no mesh rule is involved.
func healthy(tb *testbed.Testbed, pod topology.Pod) func(context.Context) error {
	client := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return tb.DialContext(ctx, pod, network, addr)
			},
			DisableKeepAlives: true,
		},
	}
	url := fmt.Sprintf("http://127.0.0.1:%d%s", pod.Port, workload.HealthPath)
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

// podBinary returns a copy of meshmark-pod (Options.PodBinary, else the one beside
// the running meshmark) that the workload uid can execute: the original may sit under a
// directory only root can enter (a go test temp dir, /root). It is copied once per
// deployment, into the load generator's pod, and every pod runs that copy.
func (r *runner) podBinary(d *deployment) (string, error) {
	if d.podBin != "" {
		return d.podBin, nil
	}
	src := r.opts.PodBinary
	if src == "" {
		var err error
		if src, err = podcmd.Find(); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("the in-pod binary: %w", err)
	}
	d.podBin, err = d.tb.WriteFile(d.client, podcmd.Name, data, 0o755)
	return d.podBin, err
}

// generatorSocket is the file the load generator serves plans on, in its pod's
// directory: a Unix socket, which the runner reaches from outside the pod's network
// namespace without a port in the pod or a rule of the mesh in the way.
const generatorSocket = "generator.sock"

// startGenerator starts the load generator in the client pod (`meshmark-pod
// generator`), as root, as meshmark's own connections from that pod always were (a
// mesh's interception treats them as it treated those), sized for the load
// generator's CPUs, and connects to it. Its names resolve only to the testbed's
// addresses (generatorResolve).
func (r *runner) startGenerator(ctx context.Context, d *deployment) error {
	exe, err := r.podBinary(d)
	if err != nil {
		return err
	}
	sock := filepath.Join(filepath.Dir(exe), generatorSocket)
	argv := []string{exe, "generator", "--listen", "unix:" + sock}
	for _, res := range generatorResolve(d) {
		argv = append(argv, "--resolve", res)
	}
	var env []string
	if lg, _ := placement(r.study.Spec.Substrate.Local); len(lg) > 0 {
		// Pinned to its CPUs once up (pin): sized for them from the start, the Go
		// runtime does not resize itself in the middle of a trial.
		env = []string{"GOMAXPROCS=" + strconv.Itoa(len(lg))}
	}
	d.generator, err = d.tb.Start(ctx, d.client, substrate.ProcessSpec{
		Name: generatorProcess,
		Role: substrate.RoleLoadGen,
		Argv: argv,
		Env:  env,
		Ready: func(ctx context.Context) error {
			var dl net.Dialer
			c, err := dl.DialContext(ctx, "unix", sock)
			if err != nil {
				return err
			}
			return c.Close()
		},
	})
	if err != nil {
		return fmt.Errorf("load generator: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d.gen, err = loadgen.Dial(dctx, []string{"unix:" + sock})
	if err != nil {
		return fmt.Errorf("load generator: %w", err)
	}
	return nil
}

// generatorProcess names the load generator's process in its pod; the sampler stores
// its resources under this component.
const generatorProcess = "meshmark-load"

// generatorEnd says, for a load run that failed, how the generator process ended if it
// did, with the end of its log; empty while it runs.
func (d *deployment) generatorEnd() string {
	e, ok := d.generator.(substrate.Exiting)
	if d.generator == nil || !ok {
		return ""
	}
	select {
	case <-e.Done():
	default:
		return ""
	}
	return fmt.Sprintf("; the load generator exited (%v); the end of its log %s:\n%s", e.Err(), d.generator.LogPath(), tailOf(d.generator.LogPath(), logTailBytes))
}

// graphArg is what `meshmark-pod service --graph` gets: the built-in name, or a copy of
// the graph file the workload uid can read.
func (r *runner) graphArg(d *deployment) (string, error) {
	w := r.study.Spec.Workload
	if !w.IsGraphFile() {
		return r.graph.Origin, nil
	}
	data, err := os.ReadFile(r.study.Resolve(w.Graph))
	if err != nil {
		return "", err
	}
	return d.tb.WriteFile(d.client, "graph-"+filepath.Base(w.Graph), data, 0o644)
}

func (r *runner) logDir(mesh string) string {
	if r.opts.LogDir == "" {
		return ""
	}
	return filepath.Join(r.opts.LogDir, strings.ReplaceAll(mesh, "/", "_"))
}

// close tears the whole testbed down. The profile's Uninstall is not needed: deleting
// the pods removes its processes and rules with them.
func (d *deployment) close() {
	if d == nil || d.tb == nil {
		return
	}
	if d.gen != nil {
		d.gen.Close()
	}
	_ = d.tb.Close()
}

// graphEdges lists the services each service of the graph calls, from every version's
// script, for the mesh's enrollment check.
func graphEdges(g *workload.Graph) map[string][]string {
	out := map[string][]string{}
	for _, s := range g.Services {
		seen := map[string]bool{}
		out[s.Name] = []string{}
		for _, v := range s.Versions {
			for _, c := range v.Script.Calls() {
				if !seen[c.Service] {
					seen[c.Service] = true
					out[s.Name] = append(out[s.Name], c.Service)
				}
			}
		}
	}
	return out
}

// entryProtocol is the protocol of the graph's entry service.
func (r *runner) entryProtocol() string {
	if s := r.graph.Service(r.graph.Entrypoint().Service); s != nil {
		return s.Protocol
	}
	return workload.ProtocolHTTP
}

// startGateway runs the ingress gateway's Envoy in its pod: the mesh's own gateway when
// the profile has one (mesh.IngressGateway), else the plain gateway as the workload
// uid, so that the mesh intercepts its calls to the entry service as it does the app's.
func (r *runner) startGateway(ctx context.Context, d *deployment, pod topology.Pod) error {
	envoy, err := prereq.Envoy()
	if err != nil {
		return err
	}
	entry := d.app.Service(d.entry.Service)
	if entry == nil {
		return fmt.Errorf("no entry service %s", d.entry.Service)
	}
	var cfg []byte
	uid := substrate.WorkloadUID
	if own, ok := d.profile.(mesh.IngressGateway); ok {
		// The mesh's own gateway, as the mesh's proxy: its key is the proxy uid's alone.
		cfg, err = own.IngressGatewayConfig(ctx, d.tb, &d.app, pod, entry.Name)
		uid = substrate.ProxyUID
	} else {
		up := gateway.Upstream{Service: entry.Name, Addr: mesh.Addr(entry.VIP, entry.Port), Protocol: entry.Protocol}
		if ma, ok := d.profile.(mesh.Addressing); ok {
			// The gateway calls the entry service by the mesh's name, through its node's proxy.
			if authority, dial, ok := ma.CalleeAddress(pod, entry.Name); ok {
				up.Addr, up.Host = dial, authority
			}
		}
		cfg, err = gateway.Bootstrap(pod.Name, up, gateway.Listen{})
	}
	if err != nil {
		return err
	}
	path, err := d.tb.WriteFile(pod, "gateway.json", cfg, 0o644)
	if err != nil {
		return err
	}
	admin := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.tb.DialContext(ctx, pod, network, addr)
		}}}
	_, err = d.tb.Start(ctx, pod, substrate.ProcessSpec{
		Name: "gateway",
		Role: substrate.RoleGateway,
		Argv: []string{envoy, "-c", path, "--concurrency", "2", "--disable-hot-restart", "--drain-time-s", "1", "--log-level", "warning"},
		UID:  uid,
		Ready: func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/ready", gateway.AdminPort), nil)
			if err != nil {
				return err
			}
			resp, err := admin.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("gateway admin /ready: %s", resp.Status)
			}
			return nil
		},
	})
	return err
}
