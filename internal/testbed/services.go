package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/meshmark/meshmark/internal/topology"
)

// PodSpec describes a pod to add.
type PodSpec struct {
	Name    string // DNS label, unique in the testbed, e.g. "reviews-v2-0"
	Node    string // e.g. "node0"
	Service string // owning service; empty for clients such as the load generator
	Version string
	Port    int // the port the workload listens on; 0 for clients
	// ServiceAccount defaults to Service (or to Name for clients).
	ServiceAccount string
}

func (s PodSpec) topologyPod(tb *Testbed, ip netip.Addr) topology.Pod {
	sa := s.ServiceAccount
	if sa == "" {
		sa = s.Service
	}
	if sa == "" {
		sa = s.Name
	}
	return topology.Pod{
		Name:           s.Name,
		Service:        s.Service,
		Version:        s.Version,
		Node:           s.Node,
		NetNS:          tb.NetNSName(s.Name),
		IP:             ip,
		Port:           s.Port,
		Identity:       topology.SPIFFEID(tb.opts.TrustDomain, tb.opts.Namespace, sa),
		ServiceAccount: sa,
	}
}

// AddPod creates a pod: a namespace on the node's bridge with the next free address,
// loopback up, a default route via the node, the service rules and the hosts file.
func (tb *Testbed) AddPod(ctx context.Context, spec PodSpec) (topology.Pod, error) {
	p, err := tb.createPodNetwork(spec)
	if err != nil {
		return topology.Pod{}, err
	}
	if err := tb.writeHosts(p.ns.name, p.topo.IP, spec.Name); err != nil {
		return topology.Pod{}, err
	}
	if err := tb.syncRules(ctx, []*netNS{p.ns}); err != nil {
		return topology.Pod{}, err
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return p.topo, tb.saveManifest()
}

// ServiceSpec describes a service to add.
type ServiceSpec struct {
	Name      string
	Port      int
	Endpoints []topology.Pod
}

// AddService gives a service a virtual IP and spreads connections to VIP:port over the
// endpoints (each endpoint's own Port), the way kube-proxy does, in every node and pod.
func (tb *Testbed) AddService(ctx context.Context, name string, port int, endpoints []topology.Pod) (netip.Addr, error) {
	vips, err := tb.AddServices(ctx, []ServiceSpec{{Name: name, Port: port, Endpoints: endpoints}})
	if err != nil {
		return netip.Addr{}, err
	}
	return vips[0], nil
}

// AddServices adds several services and rewrites the rules of every namespace once.
func (tb *Testbed) AddServices(ctx context.Context, specs []ServiceSpec) ([]netip.Addr, error) {
	tb.mu.Lock()
	if err := tb.checkOpen(); err != nil {
		tb.mu.Unlock()
		return nil, err
	}
	var vips []netip.Addr
	var added []*service
	for _, spec := range specs {
		if err := tb.checkServiceLocked(spec, added); err != nil {
			tb.mu.Unlock()
			return nil, err
		}
		vip := addrAdd(vipPrefix.Addr(), len(tb.services)+len(added)+1)
		if !vipPrefix.Contains(vip) {
			tb.mu.Unlock()
			return nil, fmt.Errorf("testbed: service %s: out of virtual IPs", spec.Name)
		}
		added = append(added, &service{name: spec.Name, vip: vip, port: spec.Port, endpoints: append([]topology.Pod(nil), spec.Endpoints...)})
		vips = append(vips, vip)
	}
	tb.services = append(tb.services, added...)
	all := tb.allNetNSLocked()
	tb.mu.Unlock()

	if err := tb.syncHosts(); err != nil {
		return nil, err
	}
	if err := tb.syncRules(ctx, all); err != nil {
		return nil, err
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return vips, tb.saveManifest()
}

func (tb *Testbed) checkServiceLocked(spec ServiceSpec, pending []*service) error {
	if err := checkDNSLabel("service name", spec.Name); err != nil {
		return err
	}
	if spec.Port < 1 || spec.Port > 65535 {
		return fmt.Errorf("testbed: service %s: port %d out of range", spec.Name, spec.Port)
	}
	for _, s := range append(append([]*service(nil), tb.services...), pending...) {
		if s.name == spec.Name {
			return fmt.Errorf("testbed: service %s already exists", spec.Name)
		}
	}
	for _, ep := range spec.Endpoints {
		p, ok := tb.pods[ep.Name]
		if !ok || p.topo.IP != ep.IP {
			return fmt.Errorf("testbed: service %s: endpoint %q is not a pod of this testbed", spec.Name, ep.Name)
		}
		if ep.Port < 1 || ep.Port > 65535 {
			return fmt.Errorf("testbed: service %s: endpoint %s has no port", spec.Name, ep.Name)
		}
	}
	return nil
}

// ServiceVIP returns the virtual IP of a service.
func (tb *Testbed) ServiceVIP(name string) (netip.Addr, bool) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, s := range tb.services {
		if s.name == name {
			return s.vip, true
		}
	}
	return netip.Addr{}, false
}

// allNetNSLocked lists node and pod namespaces (the fabric routes nothing).
func (tb *Testbed) allNetNSLocked() []*netNS {
	var out []*netNS
	for _, n := range tb.nodes {
		out = append(out, n.ns)
	}
	for _, name := range tb.podOrder {
		if ns := tb.pods[name].ns; ns != nil {
			out = append(out, ns)
		}
	}
	return out
}

// serviceChainName is short (iptables allows 28 characters) and stable for a service.
func serviceChainName(svc string) string {
	h := fnv.New32a()
	h.Write([]byte(svc))
	return fmt.Sprintf("MM-SVC-%08X", h.Sum32())
}

// renderServiceRules writes an iptables-restore --noflush input that rebuilds the
// service chains. Declaring a chain flushes it, so the input is idempotent apart from
// the jumps, which are added only on the first sync of a namespace.
func renderServiceRules(services []*service, jumpFrom []string, hairpinSubnet netip.Prefix) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n", ServiceChain)
	for _, s := range services {
		fmt.Fprintf(&b, ":%s - [0:0]\n", serviceChainName(s.name))
	}
	for _, chain := range jumpFrom {
		fmt.Fprintf(&b, "-A %s -j %s\n", chain, ServiceChain)
	}
	if hairpinSubnet.IsValid() {
		// A pod calling a VIP that lands on a pod of the same bridge would get the reply
		// straight from the endpoint's address; masquerading makes it return through
		// the node, as kube-proxy does for hairpin traffic.
		fmt.Fprintf(&b, "-A POSTROUTING -s %s -d %s -m conntrack --ctstate DNAT -j MASQUERADE\n", hairpinSubnet, hairpinSubnet)
	}
	for _, s := range services {
		chain := serviceChainName(s.name)
		fmt.Fprintf(&b, "-A %s -d %s/32 -p tcp -m tcp --dport %d -m comment --comment \"service %s\" -j %s\n",
			ServiceChain, s.vip, s.port, s.name, chain)
		n := len(s.endpoints)
		for i, ep := range s.endpoints {
			fmt.Fprintf(&b, "-A %s", chain)
			if left := n - i; left > 1 {
				fmt.Fprintf(&b, " -m statistic --mode random --probability %.10f", 1/float64(left))
			}
			fmt.Fprintf(&b, " -p tcp -m tcp -j DNAT --to-destination %s:%d\n", ep.IP, ep.Port)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// syncRules rewrites the service rules in the given namespaces, several at a time.
func (tb *Testbed) syncRules(ctx context.Context, targets []*netNS) error {
	tb.mu.Lock()
	services := append([]*service(nil), tb.services...)
	nodeOf := map[*netNS]*node{}
	for _, n := range tb.nodes {
		nodeOf[n.ns] = n
	}
	tb.mu.Unlock()

	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	errs := make([]error, len(targets))
	for i, ns := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var jumps []string
			var hairpin netip.Prefix
			ns.nlMu.Lock()
			first := !ns.jumpInstalled
			ns.nlMu.Unlock()
			if n, isNode := nodeOf[ns]; isNode {
				if first {
					jumps = []string{"PREROUTING", "OUTPUT"}
					hairpin = n.subnet
				}
			} else if first {
				jumps = []string{"OUTPUT"}
			}
			rules := renderServiceRules(services, jumps, hairpin)
			if err := iptablesRestore(ctx, ns, rules); err != nil {
				errs[i] = err
				return
			}
			ns.nlMu.Lock()
			ns.jumpInstalled = true
			ns.nlMu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// iptablesRestore applies rules without flushing the tables, forked straight into the
// namespace (iptables needs no /etc/hosts, so `ip netns exec` would only add cost).
func iptablesRestore(ctx context.Context, ns *netNS, rules string) error {
	cmd := exec.CommandContext(ctx, "iptables-restore", "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(rules)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := startInNetNS(ns.fd(), cmd); err != nil {
		return fmt.Errorf("testbed: %s: iptables-restore: %w", ns.name, err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("testbed: %s: iptables-restore: %w: %s\ninput:\n%s", ns.name, err, strings.TrimSpace(out.String()), rules)
	}
	return nil
}

// hostsFile renders /etc/hosts for a namespace: localhost, the namespace's own name,
// and every service under its short and cluster names.
func (tb *Testbed) hostsFile(selfIP netip.Addr, selfName string) []byte {
	var b bytes.Buffer
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	fmt.Fprintf(&b, "%s\t%s\n", selfIP, selfName)
	tb.mu.Lock()
	services := append([]*service(nil), tb.services...)
	tb.mu.Unlock()
	sort.Slice(services, func(i, j int) bool { return services[i].name < services[j].name })
	ns := tb.opts.Namespace
	for _, s := range services {
		fmt.Fprintf(&b, "%s\t%s %s.%s %s.%s.svc %s.%s.svc.cluster.local\n", s.vip, s.name, s.name, ns, s.name, ns, s.name, ns)
	}
	return b.Bytes()
}

// writeHosts writes /etc/netns/<ns>/hosts, which `ip netns exec` bind-mounts over /etc/hosts.
func (tb *Testbed) writeHosts(nsName string, selfIP netip.Addr, selfName string) error {
	dir := filepath.Join(etcNetnsDir, nsName)
	tb.mu.Lock()
	if !slices.Contains(tb.manifest.EtcNetns, dir) {
		tb.manifest.EtcNetns = append(tb.manifest.EtcNetns, dir)
	}
	tb.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	// Written in place, not renamed: a running process sees /etc/hosts through a bind
	// mount of this inode, and must see services added after it started.
	if err := os.WriteFile(filepath.Join(dir, "hosts"), tb.hostsFile(selfIP, selfName), 0o644); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	return nil
}

// syncHosts rewrites every hosts file after the set of services changed.
func (tb *Testbed) syncHosts() error {
	type target struct {
		ns   string
		ip   netip.Addr
		name string
	}
	tb.mu.Lock()
	var targets []target
	for _, n := range tb.nodes {
		targets = append(targets, target{n.ns.name, n.gateway, n.name})
	}
	for _, name := range tb.podOrder {
		p := tb.pods[name]
		if p.ns != nil {
			targets = append(targets, target{p.ns.name, p.topo.IP, name})
		}
	}
	tb.mu.Unlock()
	for _, t := range targets {
		if err := tb.writeHosts(t.ns, t.ip, t.name); err != nil {
			return err
		}
	}
	return nil
}

// writeFileAtomic replaces path so that readers see the old or the new content only.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), mode)); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}
