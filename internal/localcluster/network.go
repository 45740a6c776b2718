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

// nodesLink is the interface inside the cluster's namespace that holds the nodes'
// addresses: one end of a veth pair whose other end is in the namespace too (the
// kernel here has no dummy interfaces). Nothing leaves through it: the default route
// points at it only because the kubelet and kube-proxy want a default interface.
const nodesLink = "mmk-nodes"

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

// inNetNS is argv run inside the cluster's network namespace by nsenter, which, unlike
// `ip netns exec`, leaves /sys alone (containerd and the kubelet read cgroups there).
func inNetNS(ns string, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + netnsPath(ns), "--"}, argv...)
}

// makeNetwork creates the cluster's network namespace with the nodes' addresses. Each
// node's bridge is made later by the bridge CNI plugin, inside this namespace.
func makeNetwork(ctx context.Context, st *State) error {
	ns := NetNS(st.Name)
	if _, err := os.Stat(netnsPath(ns)); err == nil {
		return fmt.Errorf("network namespace %s already exists: a cluster named %s is up or was left behind (meshmark cluster down --name %s, or meshmark clean)", ns, st.Name, st.Name)
	}
	steps := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "link", "add", nodesLink, "type", "veth", "peer", "name", nodesLink + "-end"},
		{"ip", "-n", ns, "link", "set", nodesLink + "-end", "up"},
		{"ip", "-n", ns, "link", "set", nodesLink, "up"},
	}
	for _, n := range st.Nodes {
		steps = append(steps, []string{"ip", "-n", ns, "addr", "add", n.Address + "/" + fmt.Sprint(nodePrefix.Bits()), "dev", nodesLink})
	}
	steps = append(steps,
		[]string{"ip", "-n", ns, "route", "add", "default", "dev", nodesLink},
		// Pods reach services on other nodes' bridges and the API server through this
		// namespace's routing; bridged traffic between two pods of one node must pass
		// kube-proxy's rules too, or a reply to a pod that called a Service's address
		// comes back from the wrong address. Both settings belong to this namespace.
		inNetNS(ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"),
	)
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// removeNetwork deletes the cluster's namespace; the bridges, veths and netfilter
// tables inside go with it.
func removeNetwork(ctx context.Context, name string) error {
	ns := NetNS(name)
	if _, err := os.Stat(netnsPath(ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return run(ctx, "ip", "netns", "del", ns)
}
