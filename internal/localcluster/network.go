package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Each node is a network namespace of its own (NodeNetNS), as each node of a real
// cluster is a host of its own: its address on eth0, its pods' bridge, its kube-proxy's
// rules, its istio-cni's or Cilium's host-side rules. The nodes' eth0s hang off one
// bridge in the cluster's fabric namespace (NetNS), the wire between the nodes, where
// traffic between two nodes can be seen. Node 0 also runs the control plane.

// fabricBridge joins the nodes in the fabric namespace.
const fabricBridge = "mmk-fabric"

// NodeNetNS is the network namespace of node i of the named cluster.
func NodeNetNS(cluster string, i int) string {
	return fmt.Sprintf("%s%s.node%d", NetNSPrefix, cluster, i)
}

// netnsPath is where iproute2 pins a named network namespace.
func netnsPath(ns string) string { return filepath.Join("/run/netns", ns) }

// run runs a short command and returns its error with its output.
func run(ctx context.Context, argv ...string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// inNetNS is argv run inside a network namespace by nsenter, which, unlike `ip netns
// exec`, leaves /sys alone (containerd and the kubelet read cgroups there).
func inNetNS(ns string, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + netnsPath(ns), "--"}, argv...)
}

// makeNetwork creates the fabric and every node's namespace, the veths between them,
// the nodes' addresses and the routes to each other's pods. Each node's pod bridge is
// made later by the bridge CNI plugin, inside its namespace.
func makeNetwork(ctx context.Context, st *State) error {
	fabric := NetNS(st.Name)
	for _, ns := range clusterNetNS(st.Name, len(st.Nodes)) {
		if _, err := os.Stat(netnsPath(ns)); err == nil {
			return fmt.Errorf("network namespace %s already exists: a cluster named %s is up or was left behind (meshmark cluster down --name %s, or meshmark clean)", ns, st.Name, st.Name)
		}
	}
	steps := [][]string{
		{"ip", "netns", "add", fabric},
		{"ip", "-n", fabric, "link", "set", "lo", "up"},
		{"ip", "-n", fabric, "link", "add", fabricBridge, "type", "bridge"},
		{"ip", "-n", fabric, "link", "set", fabricBridge, "up"},
	}
	for i, n := range st.Nodes {
		port := fmt.Sprintf("node%d", i)
		steps = append(steps,
			[]string{"ip", "netns", "add", n.NetNS},
			[]string{"ip", "-n", n.NetNS, "link", "set", "lo", "up"},
			[]string{"ip", "-n", fabric, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.NetNS},
			[]string{"ip", "-n", fabric, "link", "set", port, "master", fabricBridge},
			[]string{"ip", "-n", fabric, "link", "set", port, "up"},
			[]string{"ip", "-n", n.NetNS, "addr", "add", n.Address + "/" + fmt.Sprint(nodePrefix.Bits()), "dev", "eth0"},
			[]string{"ip", "-n", n.NetNS, "link", "set", "eth0", "up"},
			// Nothing leaves the cluster; the kubelet and kube-proxy want a default
			// interface all the same.
			[]string{"ip", "-n", n.NetNS, "route", "add", "default", "dev", "eth0"},
			// The node routes its pods' traffic, and traffic bridged between two
			// pods of the node must pass kube-proxy's rules too, or a reply to a
			// pod that called a Service's address comes back from the wrong one.
			// Both settings are the node's namespace's own.
			inNetNS(n.NetNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"),
		)
		for j, other := range st.Nodes {
			if j != i {
				steps = append(steps, []string{"ip", "-n", n.NetNS, "route", "add", other.PodCIDR, "via", other.Address, "dev", "eth0"})
			}
		}
	}
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// clusterNetNS are the names of a cluster's namespaces: its fabric and its nodes'.
func clusterNetNS(name string, nodes int) []string {
	out := []string{NetNS(name)}
	for i := range nodes {
		out = append(out, NodeNetNS(name, i))
	}
	return out
}

// netnsOf finds the namespaces a cluster left under /run/netns, whatever its number
// of nodes.
func netnsOf(name string) []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if e.Name() == NetNS(name) || strings.HasPrefix(e.Name(), NetNS(name)+".node") {
			out = append(out, e.Name())
		}
	}
	return out
}

// removeNetwork deletes the cluster's namespaces; the bridges, veths and netfilter
// tables inside go with them.
func removeNetwork(ctx context.Context, name string) error {
	var errs []error
	for _, ns := range netnsOf(name) {
		if err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
