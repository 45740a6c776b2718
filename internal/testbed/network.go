package testbed

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Interface names. They live inside our namespaces, so they never collide with the
// host's or another testbed's.
const (
	fabricBridge = "fabric0"
	nodeBridge   = "br0"
	nodeUplink   = "uplink"
	podIface     = "eth0"
)

// addrAdd returns the address n positions after a.
func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// fixedMAC gives bridges a stable, locally administered address; a bridge without one
// takes the lowest port MAC and changes it whenever a port is added, which breaks the
// neighbours' ARP caches mid-run.
func fixedMAC(kind, index int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x6d, 0x6d, byte(kind), byte(index >> 8), byte(index)}
}

// newNetNS creates and records a namespace. The manifest on disk is updated once per
// batch (a rename on /run's disk costs a millisecond); Clean finds namespaces by
// prefix, so a kill before the update loses nothing.
func (tb *Testbed) newNetNS(name string) (*netNS, error) {
	full := tb.NetNSName(name)
	tb.mu.Lock()
	if err := tb.checkOpen(); err != nil {
		tb.mu.Unlock()
		return nil, err
	}
	tb.manifest.Namespaces = append(tb.manifest.Namespaces, full)
	tb.mu.Unlock()
	f, err := createNamedNetNS(full)
	if err != nil {
		return nil, fmt.Errorf("testbed: namespace %s: %w", full, err)
	}
	tb.mu.Lock()
	closed := tb.closed
	tb.mu.Unlock()
	if closed { // Close may have run before the namespace existed
		f.Close()
		removeNamedNetNS(full)
		return nil, fmt.Errorf("testbed %s is closed", tb.id)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		f.Close()
		removeNamedNetNS(full)
		return nil, fmt.Errorf("testbed: netlink in %s: %w", full, err)
	}
	ns := &netNS{name: full, file: f, nl: h}
	if err := ns.linkUp("lo"); err != nil {
		ns.close()
		removeNamedNetNS(full)
		return nil, err
	}
	return ns, nil
}

func (ns *netNS) close() {
	ns.nl.Close()
	ns.file.Close()
}

func (ns *netNS) linkUp(name string) error {
	ns.nlMu.Lock()
	defer ns.nlMu.Unlock()
	l, err := ns.nl.LinkByName(name)
	if err == nil {
		err = ns.nl.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("testbed: %s: link %s up: %w", ns.name, name, err)
	}
	return nil
}

// addBridge creates an up bridge with a fixed MAC and, when addr is valid, an address.
func (ns *netNS) addBridge(name string, mac net.HardwareAddr, mtu int, addr netip.Addr, bits int) error {
	ns.nlMu.Lock()
	defer ns.nlMu.Unlock()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac, MTU: mtu}}
	if err := ns.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("testbed: %s: add bridge %s: %w", ns.name, name, err)
	}
	if addr.IsValid() {
		if err := ns.nl.AddrAdd(br, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
			return fmt.Errorf("testbed: %s: address %s on %s: %w", ns.name, addr, name, err)
		}
	}
	if err := ns.nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("testbed: %s: bridge %s up: %w", ns.name, name, err)
	}
	return nil
}

// addVeth creates a veth pair: inner in ns (addressed, up), outer directly in the
// namespace of bridgeNS and enslaved to its bridge. Neither end ever exists on the host.
func addVeth(ns *netNS, inner string, addr netip.Addr, bits int, bridgeNS *netNS, outer, bridge string, mtu int) error {
	ns.nlMu.Lock()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: inner, MTU: mtu},
		PeerName:      outer,
		PeerMTU:       uint32(mtu),
		PeerNamespace: netlink.NsFd(bridgeNS.fd()),
	}
	err := ns.nl.LinkAdd(veth)
	if err == nil {
		err = ns.nl.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(addr, bits)})
	}
	if err == nil {
		err = ns.nl.LinkSetUp(veth)
	}
	ns.nlMu.Unlock()
	if err != nil {
		return fmt.Errorf("testbed: %s: veth %s: %w", ns.name, inner, err)
	}
	bridgeNS.nlMu.Lock()
	defer bridgeNS.nlMu.Unlock()
	peer, err := bridgeNS.nl.LinkByName(outer)
	if err == nil {
		var br netlink.Link
		if br, err = bridgeNS.nl.LinkByName(bridge); err == nil {
			err = bridgeNS.nl.LinkSetMaster(peer, br)
		}
	}
	if err == nil {
		err = bridgeNS.nl.LinkSetUp(peer)
	}
	if err != nil {
		return fmt.Errorf("testbed: %s: attach %s to %s: %w", bridgeNS.name, outer, bridge, err)
	}
	return nil
}

func (ns *netNS) addRoute(dst netip.Prefix, via netip.Addr) error {
	ns.nlMu.Lock()
	defer ns.nlMu.Unlock()
	r := &netlink.Route{Gw: via.AsSlice()}
	if dst.Bits() > 0 {
		r.Dst = ipNet(dst.Addr(), dst.Bits())
	}
	if err := ns.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("testbed: %s: route %s via %s: %w", ns.name, dst, via, err)
	}
	return nil
}

// buildFabric creates the fabric namespace and bridge and every node: a namespace with
// a bridge for its pods, an uplink into the fabric, forwarding on, and a route to each
// other node's pod subnet.
func (tb *Testbed) buildFabric(ctx context.Context) error {
	fabric, err := tb.newNetNS("fabric")
	if err != nil {
		return err
	}
	tb.fabric = fabric
	if err := fabric.addBridge(fabricBridge, fixedMAC(0, 0), tb.opts.MTU, netip.Addr{}, 0); err != nil {
		return err
	}
	if err := bridgesWithoutNetfilter(fabric); err != nil {
		return err
	}
	for i := 0; i < tb.opts.Nodes; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := fmt.Sprintf("node%d", i)
		ns, err := tb.newNetNS(name)
		if err != nil {
			return err
		}
		n := &node{
			name:    name,
			index:   i,
			ns:      ns,
			uplink:  addrAdd(fabricPrefix.Addr(), i+1),
			subnet:  netip.PrefixFrom(addrAdd(fabricPrefix.Addr(), (i+1)*256), 24),
			nextPod: 2,
		}
		n.gateway = addrAdd(n.subnet.Addr(), 1)
		// Node-level processes (per-node proxies) get a directory like pods do.
		if err := os.MkdirAll(filepath.Join(tb.runDir, "pods", name), 0o755); err != nil {
			ns.close()
			return fmt.Errorf("testbed: %w", err)
		}
		tb.mu.Lock()
		tb.nodes = append(tb.nodes, n)
		tb.mu.Unlock()
		if err := ns.addBridge(nodeBridge, fixedMAC(1, i), tb.opts.MTU, n.gateway, 24); err != nil {
			return err
		}
		if err := addVeth(ns, nodeUplink, n.uplink, fabricPrefix.Bits(), fabric, name, fabricBridge, tb.opts.MTU); err != nil {
			return err
		}
		err = writeSysctl(ns.fd(), map[string]string{
			"net.ipv4.ip_forward": "1",
			// Hairpinned service traffic leaves br0 the way it came in; a redirect
			// would tell the client to bypass the VIP translation.
			"net.ipv4.conf.all.send_redirects": "0",
			"net.ipv4.conf.br0.send_redirects": "0",
		})
		if err != nil {
			return fmt.Errorf("testbed: %s: %w", ns.name, err)
		}
		if err := bridgesWithoutNetfilter(ns); err != nil {
			return err
		}
		if err := tb.writeHosts(ns.name, n.gateway, n.name); err != nil {
			return err
		}
	}
	for _, n := range tb.nodes {
		for _, other := range tb.nodes {
			if other != n {
				if err := n.ns.addRoute(other.subnet, other.uplink); err != nil {
					return err
				}
			}
		}
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.saveManifest()
}

// dnsLabel is what Kubernetes accepts for pod and service names.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func checkDNSLabel(field, value string) error {
	if len(value) > 63 || !dnsLabel.MatchString(value) {
		return fmt.Errorf("testbed: %s %q: must be a DNS label (lower-case letters, digits and '-', at most 63 characters)", field, value)
	}
	return nil
}

// createPodNetwork creates a pod's namespace on its node and wires it, without service
// rules and hosts file (the caller writes those, once for a whole batch).
func (tb *Testbed) createPodNetwork(spec PodSpec) (*pod, error) {
	if err := checkDNSLabel("pod name", spec.Name); err != nil {
		return nil, err
	}
	tb.mu.Lock()
	if err := tb.checkOpen(); err != nil {
		tb.mu.Unlock()
		return nil, err
	}
	if _, dup := tb.pods[spec.Name]; dup || spec.Name == "fabric" {
		tb.mu.Unlock()
		return nil, fmt.Errorf("testbed: pod name %q already used", spec.Name)
	}
	for _, n := range tb.nodes {
		if n.name == spec.Name {
			tb.mu.Unlock()
			return nil, fmt.Errorf("testbed: pod name %q is a node name", spec.Name)
		}
	}
	n, err := tb.nodeByName(spec.Node)
	if err != nil {
		tb.mu.Unlock()
		return nil, err
	}
	if n.nextPod-1 > maxPodsPerNode {
		tb.mu.Unlock()
		return nil, fmt.Errorf("testbed: node %s is full (%d pods)", n.name, maxPodsPerNode)
	}
	host := n.nextPod
	n.nextPod++
	p := &pod{node: n, dir: filepath.Join(tb.runDir, "pods", spec.Name)}
	p.topo = spec.topologyPod(tb, addrAdd(n.subnet.Addr(), host))
	// Reserve the name now so that concurrent AddPod calls cannot both take it.
	tb.pods[spec.Name] = p
	tb.podOrder = append(tb.podOrder, spec.Name)
	tb.mu.Unlock()

	fail := func(err error) (*pod, error) {
		// The half-built namespace stays registered, so Close removes it.
		return nil, err
	}
	ns, err := tb.newNetNS(spec.Name)
	if err != nil {
		tb.mu.Lock()
		delete(tb.pods, spec.Name)
		for i, name := range tb.podOrder {
			if name == spec.Name {
				tb.podOrder = append(tb.podOrder[:i], tb.podOrder[i+1:]...)
				break
			}
		}
		tb.mu.Unlock()
		return nil, err
	}
	tb.mu.Lock()
	p.ns = ns
	tb.mu.Unlock()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fail(fmt.Errorf("testbed: %w", err))
	}
	if err := addVeth(ns, podIface, p.topo.IP, n.subnet.Bits(), n.ns, fmt.Sprintf("veth%d", host), nodeBridge, tb.opts.MTU); err != nil {
		return fail(err)
	}
	if err := ns.addRoute(netip.Prefix{}, n.gateway); err != nil {
		return fail(err)
	}
	return p, nil
}

// WaitForwarding returns once every bridge port of the fabric and of every node is
// forwarding. The kernel reports a new veth's carrier through linkwatch, which batches
// such events for up to a second; until then the bridge keeps the port disabled and
// silently drops what it should flood, so the first connection across it would stall
// for a SYN retransmit (1 s) inside someone's measurement.
func (tb *Testbed) WaitForwarding(ctx context.Context) error {
	tb.mu.Lock()
	all := []*netNS{tb.fabric}
	for _, n := range tb.nodes {
		all = append(all, n.ns)
	}
	tb.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, ns := range all {
		for {
			pending, err := ns.portsNotForwarding()
			if err != nil {
				return err
			}
			if len(pending) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("testbed: %s: bridge ports %v not forwarding: %w", ns.name, pending, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// portsNotForwarding lists the bridge ports in the namespace whose carrier is not up yet.
func (ns *netNS) portsNotForwarding() ([]string, error) {
	ns.nlMu.Lock()
	defer ns.nlMu.Unlock()
	links, err := ns.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("testbed: %s: list links: %w", ns.name, err)
	}
	var pending []string
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != 0 && a.OperState != netlink.OperUp {
			pending = append(pending, a.Name)
		}
	}
	return pending, nil
}

// bridgesWithoutNetfilter keeps bridged frames out of the namespace's iptables. Once
// anything on the host loads br_netfilter (an iptables physdev match does), every new
// namespace defaults to sending bridged IPv4 through iptables and conntrack, which
// breaks the service DNAT and cross-node traffic of the testbed. The switch is per
// namespace, so this never touches the host's.
func bridgesWithoutNetfilter(ns *netNS) error {
	return inNetNS(ns.fd(), func() error {
		if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
			return nil // br_netfilter not loaded: bridged frames never see iptables
		}
		for _, key := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"} {
			if err := os.WriteFile("/proc/sys/net/bridge/"+key, []byte("0"), 0o644); err != nil {
				return fmt.Errorf("testbed: %s: sysctl net.bridge.%s=0: %w", ns.name, key, err)
			}
		}
		return nil
	})
}
