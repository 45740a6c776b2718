// Package ambient is the istio-ambient mesh profile: Istio's ambient data plane with the
// real ztunnel, one per node in shared mode, and no istiod. meshmark plays the parts of
// Istio's control plane that ztunnel talks to:
//
//   - istio-cni's node agent: for every enrolled pod it writes the in-pod iptables rules
//     istio-cni writes (iptables.go) and hands the pod's network namespace to its node's
//     ztunnel over the ZDS unix socket (zds.go), after which ztunnel listens inside the
//     pod on 15001 (outbound), 15006 (inbound plaintext) and 15008 (HBONE).
//   - istiod's CA: Istio's IstioCertificateService served with grpc-go over TLS by a
//     `meshmark ambient-controlplane` child process (ca.go; the hidden subcommand is
//     dispatched at this package's init), so its CPU and memory are sampled under the
//     control-plane role. ztunnel authenticates with a bearer token
//     meshmark gave it and asks for the identities of the pods it proxies.
//   - istiod's workload xDS, in two parts. Workloads and services come from ztunnel's
//     local config file (LOCAL_XDS_PATH, config.go) generated from the app graph: a
//     study deploys a fixed graph once per trial set and never changes it while load
//     runs, and ztunnel reads the file once. Authorization policies, which the
//     security experiment applies and removes while the mesh runs, are pushed over
//     delta ADS by the same control-plane process (xds.go), as istiod pushes them.
//
// Without a waypoint ztunnel is an L4 proxy: it counts connections, not requests, and a
// service's version split is applied per connection through endpoint capacity, not per
// request. With `waypoint: on` a namespace waypoint (an Envoy configured with
// go-control-plane, waypoint.go) terminates HBONE, routes each request with the
// version split and re-originates HBONE to the chosen pod, as Istio's waypoint does;
// it runs in the first node's namespace under the gateway role, and its request
// counts are the per-trial counters. A study's ingress gateway is Istio's kind too
// (gateway.go): an Envoy outside capture that carries requests to the entry service's
// pods over HBONE with a certificate of its own.
package ambient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient/zdsapi"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "istio-ambient"

// CAPort is where the control plane serves certificates (istiod's port).
const CAPort = 15012

// caHostname is istiod's service name, also put in the CA's serving certificate.
const caHostname = "istiod.istio-system.svc"

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:        Name,
		Summary:     "Istio ambient: the real ztunnel per node (shared mode, in-pod redirection), HBONE mTLS; L4 unless waypoint: on adds an Envoy waypoint",
		New:         New,
		LocalImages: istiohelm.LocalImages,
		Own: istiohelm.WithOptions(map[string]string{
			"waypoint": "off (default: L4 only) | on (an Envoy waypoint for the namespace: L7 routing, the version split per request)",
		}),
		Unsupported: map[string]string{
			"request_id":       "ztunnel is an L4 proxy: it never sees HTTP requests",
			"access_log":       "ztunnel is an L4 proxy: it has no per-request access log",
			"retries":          "ztunnel is an L4 proxy: it does not retry requests",
			"circuit_breakers": "ztunnel has no per-cluster connection or request limits",
			"telemetry":        "ztunnel's metrics cannot be switched off",
		},
		Needs:     []string{"ztunnel"},
		SMPType:   istiohelm.SMPType,
		OnCluster: istiohelm.OnCluster(""),
	})
}

var _ mesh.Telemetry = (*Profile)(nil)

// Profile is one istio-ambient configuration.
type Profile struct {
	opts         mesh.Options
	mode         mesh.MTLSMode
	withWaypoint bool

	// Policies are added to the generated config (authorization policies beside the
	// strict-mTLS one); set before Install.
	Policies []Policy

	mu       sync.Mutex
	configs  map[string][]byte
	cp       substrate.Process
	cpDir    string
	nodes    map[string]*nodeProxy // by node name
	enrolled map[string]topology.Pod
	rules    map[string]topology.Pod // pods whose rules are in place
	waypoint *waypointProxy
	// ca is where the mesh's proxies outside ztunnel (waypoint, ingress gateway) get
	// their certificates, as Istio's agents do from istiod.
	ca caAccess
	// policyFile is where Authorize writes the policies the control plane pushes over
	// xDS; policyVersion is the last version written.
	policyFile    string
	policyVersion int64
}

// caAccess is the control plane's CA as a proxy reaches it.
type caAccess struct {
	addr  string
	root  []byte
	token string
}

type waypointProxy struct {
	pod  topology.Pod // the namespace it runs in
	proc substrate.Process
}

// Waypoint says whether the profile runs a waypoint.
func (p *Profile) Waypoint() bool { return p.withWaypoint }

type nodeProxy struct {
	node  string
	pod   topology.Pod // the node's namespace
	agent *nodeAgent
	proc  substrate.Process
}

// New builds the profile from parsed options.
func New(o mesh.Options) (mesh.Profile, error) {
	if o.MTLS == mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: "ambient always uses mTLS (HBONE) between enrolled pods; use permissive or strict, or the baseline profile for no mesh"}
	}
	wp, err := o.OwnBool("waypoint", false)
	if err != nil {
		return nil, err
	}
	return &Profile{opts: o, mode: o.EffectiveMTLS(mesh.MTLSPermissive), withWaypoint: wp}, nil
}

func (p *Profile) Name() string { return Name }

// MTLS is the effective mode: permissive (plaintext from outside the mesh accepted) or
// strict (refused).
func (p *Profile) MTLS() mesh.MTLSMode { return p.mode }

// Configs returns the generated ztunnel config, the in-pod rules and the root
// certificate (once the control plane wrote it).
func (p *Profile) Configs() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]byte, len(p.configs))
	for k, v := range p.configs {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// MeshedPods are the pods handed to ztunnel: every service pod, and the clients when
// MeshClients resolves to on.
func (p *Profile) MeshedPods(app *topology.App) []topology.Pod {
	var out []topology.Pod
	for _, s := range app.Services {
		if s.Name == gateway.Service {
			continue // the mesh's ingress gateway is outside ambient capture, as Istio's gateways are
		}
		for _, v := range s.Versions {
			out = append(out, v.Endpoints...)
		}
	}
	if p.opts.ClientsMeshed(p.mode) {
		out = append(out, app.Clients...)
	}
	return out
}

// ServiceAccount is the pod's service account, as envoy-sidecar derives it.
func ServiceAccount(pod topology.Pod) string {
	switch {
	case pod.ServiceAccount != "":
		return pod.ServiceAccount
	case pod.Service != "":
		return pod.Service
	}
	return pod.Name
}

// Identity is the SPIFFE ID ztunnel requests for pod.
func (p *Profile) Identity(app *topology.App, pod topology.Pod) string {
	return topology.SPIFFEID(p.opts.TrustDomain, app.Namespace, ServiceAccount(pod))
}

// nodePodder is implemented by substrates with node namespaces (the testbed).
type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// RootCertPEM is the mesh root the control plane generated (nil before Install).
func (p *Profile) RootCertPEM() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.configs["root-cert.pem"]...)
}

// Issued lists the identities the CA signed so far, in order.
func (p *Profile) Issued() ([]string, error) {
	p.mu.Lock()
	dir := p.cpDir
	p.mu.Unlock()
	if dir == "" {
		return nil, errors.New("control plane not started")
	}
	b, err := os.ReadFile(filepath.Join(dir, IssuedFile))
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// Install starts the CA, a ztunnel per node, hands every enrolled pod to its node's
// ztunnel and redirects the pod's traffic into it. Call it before the workload starts.
func (p *Profile) Install(ctx context.Context, sub substrate.Substrate, app *topology.App) error {
	err := p.install(ctx, sub, app)
	if err != nil {
		_ = p.Uninstall(context.WithoutCancel(ctx), sub)
		return fmt.Errorf("%s install: %w", Name, err)
	}
	return nil
}

func (p *Profile) install(ctx context.Context, sub substrate.Substrate, app *topology.App) error {
	ztunnel, err := prereq.ProxyBin("ztunnel")
	if err != nil {
		return err
	}
	np, ok := sub.(nodePodder)
	if !ok {
		return errors.New("the substrate has no node namespaces to run ztunnel in")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find meshmark's own binary for the control plane: %w", err)
	}
	p.mu.Lock()
	p.configs = map[string][]byte{}
	p.nodes = map[string]*nodeProxy{}
	p.enrolled = map[string]topology.Pod{}
	p.rules = map[string]topology.Pod{}
	p.mu.Unlock()

	pods := p.MeshedPods(app)
	if len(pods) == 0 {
		return errors.New("no pods to enroll")
	}
	meshed := map[string]bool{}
	var nodeNames []string
	for _, pod := range pods {
		meshed[pod.Name] = true
		if pod.Node == "" {
			return fmt.Errorf("pod %s has no node: ambient needs one ztunnel per node", pod.Name)
		}
		if !contains(nodeNames, pod.Node) {
			nodeNames = append(nodeNames, pod.Node)
		}
	}
	sort.Strings(nodeNames)

	// Control plane on the first node.
	cpPod, err := np.NodePod(nodeNames[0])
	if err != nil {
		return err
	}
	token := make([]byte, 24)
	_, _ = rand.Read(token)
	tokenPath, err := sub.WriteFile(cpPod, "ambient/ca-token", []byte(hex.EncodeToString(token)), 0o600)
	if err != nil {
		return err
	}
	var ids []string
	if p.withWaypoint {
		ids = append(ids, topology.SPIFFEID(p.opts.TrustDomain, app.Namespace, WaypointServiceAccount))
	}
	if gw := app.Service(gateway.Service); gw != nil {
		for _, v := range gw.Versions {
			for _, pod := range v.Endpoints {
				ids = append(ids, p.Identity(app, pod))
			}
		}
	}
	for _, pod := range pods {
		if id := p.Identity(app, pod); !contains(ids, id) {
			ids = append(ids, id)
		}
	}
	idPath, err := sub.WriteFile(cpPod, "ambient/identities", []byte(strings.Join(ids, "\n")+"\n"), 0o644)
	if err != nil {
		return err
	}
	cpDir := filepath.Dir(idPath)
	rootPath := filepath.Join(cpDir, RootCertFile)
	_ = os.Remove(rootPath)
	caAddr := fmt.Sprintf("%s:%d", cpPod.IP, CAPort)
	cp, err := sub.Start(ctx, cpPod, substrate.ProcessSpec{
		Name: "ambient-controlplane",
		Role: substrate.RoleControlPlane,
		Argv: []string{self, ControlPlaneCommand, "--dir", cpDir, "--trust-domain", p.opts.TrustDomain,
			"--listen", caAddr, "--token-file", tokenPath, "--identities", idPath,
			"--policy-file", filepath.Join(cpDir, PolicyFile)},
		Ready: func(context.Context) error {
			_, err := os.Stat(rootPath)
			return err
		},
	})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	root, err := os.ReadFile(rootPath)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cp, p.cpDir = cp, cpDir
	p.ca = caAccess{addr: caAddr, root: root, token: hex.EncodeToString(token)}
	p.policyFile, p.policyVersion = filepath.Join(cpDir, PolicyFile), 0
	p.configs["root-cert.pem"] = root
	p.mu.Unlock()

	var policies []Policy
	if p.mode == mesh.MTLSStrict {
		policies = append(policies, StrictPolicy(app.Namespace))
	}
	policies = append(policies, p.Policies...)
	var wp *WaypointWorkload
	if p.withWaypoint {
		// The waypoint runs in the control plane's node namespace, with that address:
		// it is a workload of its own, outside ambient capture, as Istio's is.
		wp = &WaypointWorkload{Name: "waypoint", ServiceAccount: WaypointServiceAccount, Node: cpPod.Node, IP: cpPod.IP}
		if err := p.startWaypoint(ctx, sub, app, cpPod, caAddr, root, hex.EncodeToString(token)); err != nil {
			return err
		}
	}
	cfg, err := BuildLocalConfig(app, meshed, ServiceAccount, p.opts.TrustDomain, policies, wp)
	if err != nil {
		return err
	}
	cfgJSON, err := cfg.Marshal()
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs["ztunnel-config.yaml"] = cfgJSON
	p.configs["inpod.rules"] = []byte(InPodRules())
	p.configs["traffic-split.txt"] = []byte(SplitNote(app, p.withWaypoint))
	p.mu.Unlock()

	// One ztunnel per node, started in parallel.
	errs := make([]error, len(nodeNames))
	var wg sync.WaitGroup
	for i, n := range nodeNames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.startNode(ctx, sub, np, n, ztunnel, cfgJSON, caAddr, rootPath, tokenPath); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", n, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	// Hand over every pod, then redirect its traffic (ztunnel listens in the pod once
	// it acked, so no connection is redirected to a port nobody serves).
	for _, pod := range pods {
		if err := p.enroll(ctx, sub, app, pod); err != nil {
			return fmt.Errorf("pod %s: %w", pod.Name, err)
		}
	}
	return nil
}

func (p *Profile) startNode(ctx context.Context, sub substrate.Substrate, np nodePodder, node, ztunnel string, cfg []byte, caAddr, rootPath, tokenPath string) error {
	npod, err := np.NodePod(node)
	if err != nil {
		return err
	}
	cfgPath, err := sub.WriteFile(npod, "ambient/ztunnel-config.yaml", cfg, 0o644)
	if err != nil {
		return err
	}
	agent, err := listenNodeAgent(filepath.Join(filepath.Dir(cfgPath), "ztunnel.sock"))
	if err != nil {
		return err
	}
	nproxy := &nodeProxy{node: node, pod: npod, agent: agent}
	p.mu.Lock()
	p.nodes[node] = nproxy
	p.mu.Unlock()
	env := []string{
		"PROXY_MODE=shared",
		"INPOD_UDS=" + agent.path,
		"LOCAL_XDS_PATH=" + cfgPath,
		// Workloads and services from the local file, authorization policies over xDS
		// from the control plane, which serves it beside the CA as istiod does.
		"XDS_ADDRESS=https://" + caAddr,
		"XDS_ROOT_CA=" + rootPath,
		"CA_ADDRESS=https://" + caAddr,
		"CA_ROOT_CA=" + rootPath,
		"AUTH_TOKEN=" + tokenPath,
		"CLUSTER_ID=" + clusterID,
		"NODE_NAME=" + node,
		"POD_NAME=ztunnel-" + node,
		"POD_NAMESPACE=istio-system",
		"TRUST_DOMAIN=" + p.opts.TrustDomain,
		fmt.Sprintf("ZTUNNEL_WORKER_THREADS=%d", p.opts.Concurrency),
		"RUST_LOG=warn",
	}
	proc, err := sub.Start(ctx, npod, substrate.ProcessSpec{
		Name: "ztunnel",
		Role: substrate.RoleNodeProxy,
		Argv: []string{ztunnel, "proxy", "ztunnel"},
		Env:  env,
		UID:  0, // setns into pods and SO_MARK need CAP_SYS_ADMIN and CAP_NET_ADMIN
		Ready: func(ctx context.Context) error {
			r, err := mesh.ProbeHTTP(ctx, sub, npod, fmt.Sprintf("127.0.0.1:%d", ReadinessPort), "", "/healthz/ready")
			if err != nil {
				return err
			}
			if r.Status != http.StatusOK {
				return fmt.Errorf("ztunnel /healthz/ready: HTTP %d", r.Status)
			}
			return nil
		},
	})
	if err != nil {
		return fmt.Errorf("start ztunnel: %w", err)
	}
	p.mu.Lock()
	nproxy.proc = proc
	p.mu.Unlock()
	return nil
}

func (p *Profile) enroll(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod) error {
	p.mu.Lock()
	n := p.nodes[pod.Node]
	p.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	info := &zdsapi.WorkloadInfo{Name: pod.Name, Namespace: app.Namespace, ServiceAccount: ServiceAccount(pod)}
	if err := n.agent.addPod(actx, workloadUID(app.Namespace, pod.Name), pod.NetNS, info); err != nil {
		return fmt.Errorf("hand netns to ztunnel on %s: %w", pod.Node, err)
	}
	p.mu.Lock()
	p.enrolled[pod.Name] = pod
	p.mu.Unlock()
	if out, err := sub.Exec(ctx, pod, strings.NewReader(InPodRules()), "iptables-restore", "--noflush", "--wait"); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	p.mu.Lock()
	p.rules[pod.Name] = pod
	p.mu.Unlock()
	for _, argv := range routeUp {
		if out, err := sub.Exec(ctx, pod, nil, argv...); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Uninstall removes the in-pod rules, stops every ztunnel and the control plane and
// removes the ZDS sockets, continuing past errors.
func (p *Profile) Uninstall(ctx context.Context, sub substrate.Substrate) error {
	p.mu.Lock()
	rules := p.rules
	nodes := p.nodes
	cp := p.cp
	wp := p.waypoint
	p.rules, p.nodes, p.cp, p.enrolled, p.waypoint = nil, nil, nil, nil, nil
	p.ca = caAccess{}
	p.mu.Unlock()
	var errs []error
	for _, pod := range rules {
		if out, err := sub.Exec(ctx, pod, strings.NewReader(RemoveInPodRules()), "iptables-restore", "--noflush", "--wait"); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: remove rules: %w: %s", pod.Name, err, strings.TrimSpace(string(out))))
		}
		for _, argv := range routeDown {
			_, _ = sub.Exec(ctx, pod, nil, argv...) // absent when enrollment stopped half-way
		}
	}
	for _, n := range nodes {
		if n.proc != nil {
			if err := n.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: stop ztunnel: %w", n.node, err))
			}
		}
		if err := n.agent.close(); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.node, err))
		}
	}
	if wp != nil && wp.proc != nil {
		if err := wp.proc.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop waypoint: %w", err))
		}
	}
	if cp != nil {
		if err := cp.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop control plane: %w", err))
		}
	}
	return errors.Join(errs...)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
