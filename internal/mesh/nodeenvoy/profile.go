// Package nodeenvoy is the cilium-envoy mesh profile: the per-node L7 proxy of
// Cilium's design (one Envoy per node, shared by every pod on it, doing the L7 routing
// and the weighted splits), reproduced on the netns testbed. It is not Cilium's eBPF
// datapath: steering is done with iptables. Each pod stops translating service VIPs
// itself (the testbed's per-pod kube-proxy-style DNAT stands in for Cilium's socket
// load balancing), so its service connections leave for its node still addressed to
// the VIP; in the node's namespace they are REDIRECTed to the node's Envoy, which
// routes them by Host to the service's endpoints (the outbound half of
// envoysidecar's generated config). With l7: off no proxy runs and the node's own
// netfilter translates the VIP, the path Cilium takes when no L7 policy applies.
// Cilium's transparent encryption is WireGuard (or IPsec) between nodes, not mTLS;
// this kernel has no WireGuard, so every mtls mode but off is refused.
package nodeenvoy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "cilium-envoy"

// Ports of the node proxy inside its node's namespace: Istio's numbers, since the
// listeners are envoysidecar's.
const (
	ProxyPort = envoysidecar.OutboundPort
	AdminPort = envoysidecar.AdminPort
)

// noWireGuard is why mTLS is refused.
const noWireGuard = "Cilium encrypts traffic between nodes with WireGuard (or IPsec), not with mTLS between proxies, and this kernel has no WireGuard, so neither can be reproduced here; use mtls: off"

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:    Name,
		Summary: "Cilium's per-node L7 Envoy (not its eBPF datapath): one Envoy per node, pods' service traffic steered to it with iptables; no encryption",
		New:     New,
		Own: map[string]string{
			"l7": "on (default: the node's Envoy routes every service request, splits included) | off (no proxy: the node's netfilter translates the service address, as Cilium without L7 policy)",
		},
		Unsupported: map[string]string{
			"mesh_clients": "a node proxy carries every pod on its node, the load generator's too; there is no per-pod opt-out",
			"trust_domain": "no workload identities: " + noWireGuard,
		},
		Needs: []string{"envoy"},
		Stands: []published.Stand{{For: "cilium",
			Unlike: "our Cilium here is Cilium's per-node Envoy steered by iptables, without Cilium's eBPF datapath or its WireGuard encryption"}},
	})
}

var _ mesh.Telemetry = (*Profile)(nil)

// Profile is one cilium-envoy configuration.
type Profile struct {
	opts mesh.Options
	l7   bool

	mu      sync.Mutex
	configs map[string][]byte
	nodes   map[string]*nodeProxy // by node name
	pods    []topology.Pod        // pods whose VIP translation is turned off
}

// nodeProxy is what Install put on one node.
type nodeProxy struct {
	node  topology.Pod // the node's namespace
	proc  substrate.Process
	rules string // set once applied
}

// New builds the profile from parsed options.
func New(o mesh.Options) (mesh.Profile, error) {
	if m := o.EffectiveMTLS(mesh.MTLSOff); m != mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: fmt.Sprintf("%s is not available: %s", m, noWireGuard)}
	}
	l7, err := o.OwnWord("l7", "on", "on", "off")
	if err != nil {
		return nil, err
	}
	return &Profile{opts: o, l7: l7 == "on"}, nil
}

func (p *Profile) Name() string { return Name }

// L7 says whether node Envoys run (l7: on).
func (p *Profile) L7() bool { return p.l7 }

// Configs returns every node's bootstrap and every rule set.
func (p *Profile) Configs() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]byte, len(p.configs))
	for k, v := range p.configs {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// nodePodder is implemented by substrates that can run processes in a node's own
// namespace (the testbed).
type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// appNodes are the node namespaces that host a pod of app, sorted by name.
func appNodes(sub substrate.Substrate, app *topology.App) ([]topology.Pod, error) {
	np, ok := sub.(nodePodder)
	if !ok {
		return nil, fmt.Errorf("%s: the substrate cannot run processes on a node (no NodePod)", Name)
	}
	seen := map[string]bool{}
	var out []topology.Pod
	for _, pod := range app.Pods() {
		if pod.Node == "" {
			return nil, fmt.Errorf("%s: pod %s is on no node", Name, pod.Name)
		}
		if seen[pod.Node] {
			continue
		}
		seen[pod.Node] = true
		n, err := np.NodePod(pod.Node)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// baseIDs gives every Envoy this process starts its own --base-id.
var baseIDs atomic.Uint32

// Install starts an Envoy on every node that hosts a pod of app (l7: on), puts the
// node's steering rules in, and then turns off every pod's own VIP translation, so no
// connection is ever sent to a node that is not ready for it.
func (p *Profile) Install(ctx context.Context, sub substrate.Substrate, app *topology.App) error {
	var envoy string
	if p.l7 {
		var err error
		if envoy, err = prereq.Envoy(); err != nil {
			return fmt.Errorf("%s: %w", Name, err)
		}
	}
	nodes, err := appNodes(sub, app)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs = map[string][]byte{}
	p.nodes = map[string]*nodeProxy{}
	p.pods = nil
	p.mu.Unlock()
	fail := func(err error) error {
		_ = p.Uninstall(context.WithoutCancel(ctx), sub)
		return fmt.Errorf("%s install: %w", Name, err)
	}
	for _, n := range nodes {
		if err := p.installNode(ctx, sub, app, n, envoy); err != nil {
			return fail(fmt.Errorf("node %s: %w", n.Name, err))
		}
	}
	for _, pod := range app.Pods() {
		podRules := PodRules(app, pod, p.l7)
		p.mu.Lock()
		p.configs[pod.Name+"/iptables.rules"] = []byte(podRules)
		p.mu.Unlock()
		if out, err := sub.Exec(ctx, pod, strings.NewReader(podRules), "iptables-restore", "--noflush", "--wait"); err != nil {
			return fail(fmt.Errorf("pod %s: iptables-restore: %w: %s", pod.Name, err, strings.TrimSpace(string(out))))
		}
		p.mu.Lock()
		p.pods = append(p.pods, pod)
		p.mu.Unlock()
	}
	return nil
}

func (p *Profile) installNode(ctx context.Context, sub substrate.Substrate, app *topology.App, n topology.Pod, envoy string) error {
	np := &nodeProxy{node: n}
	p.mu.Lock()
	p.nodes[n.Name] = np
	p.mu.Unlock()
	if p.l7 {
		b, err := envoysidecar.BuildOutboundBootstrap(app, n, p.opts)
		if err != nil {
			return err
		}
		js, err := envoysidecar.MarshalBootstrap(b)
		if err != nil {
			return err
		}
		cfg, err := sub.WriteFile(n, "node-envoy.json", js, 0o644)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.configs[n.Name+"/envoy.json"] = js
		p.mu.Unlock()
		argv := []string{envoy, "-c", cfg,
			"--concurrency", fmt.Sprint(p.opts.Concurrency),
			"--disable-hot-restart", "--base-id", fmt.Sprint(baseIDs.Add(1) + 3000),
			"--drain-time-s", "1",
			"--service-cluster", "cilium-envoy",
			"--service-node", n.Name,
			"--log-level", "warning",
		}
		proc, err := sub.Start(ctx, n, substrate.ProcessSpec{
			Name:  "cilium-envoy",
			Role:  substrate.RoleNodeProxy,
			Argv:  argv,
			UID:   substrate.ProxyUID,
			Ready: func(ctx context.Context) error { return adminReady(ctx, sub, n) },
		})
		if err != nil {
			return fmt.Errorf("start envoy: %w", err)
		}
		p.mu.Lock()
		np.proc = proc
		p.mu.Unlock()
	}
	rules := NodeRules(app, p.l7)
	if out, err := sub.Exec(ctx, n, strings.NewReader(rules), "iptables-restore", "--noflush", "--wait"); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	p.mu.Lock()
	np.rules = rules
	p.configs[n.Name+"/iptables.rules"] = []byte(rules)
	p.mu.Unlock()
	return nil
}

// Uninstall gives the pods their own VIP translation back, then removes the node rules
// and stops the node proxies, continuing past errors.
func (p *Profile) Uninstall(ctx context.Context, sub substrate.Substrate) error {
	p.mu.Lock()
	pods := p.pods
	nodes := make([]*nodeProxy, 0, len(p.nodes))
	for _, n := range p.nodes {
		nodes = append(nodes, n)
	}
	p.pods, p.nodes = nil, map[string]*nodeProxy{}
	p.mu.Unlock()
	var errs []error
	for _, pod := range pods {
		if out, err := sub.Exec(ctx, pod, strings.NewReader(removeRules("OUTPUT")), "iptables-restore", "--noflush", "--wait"); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: remove rules: %w: %s", pod.Name, err, strings.TrimSpace(string(out))))
		}
	}
	for _, n := range nodes {
		if n.rules != "" {
			if out, err := sub.Exec(ctx, n.node, strings.NewReader(removeRules("PREROUTING")), "iptables-restore", "--noflush", "--wait"); err != nil {
				errs = append(errs, fmt.Errorf("node %s: remove rules: %w: %s", n.node.Name, err, strings.TrimSpace(string(out))))
			}
		}
		if n.proc != nil {
			if err := n.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("node %s: stop envoy: %w", n.node.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
