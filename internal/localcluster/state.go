// Package localcluster owns `meshmark cluster up` and `meshmark cluster down`: a real
// Kubernetes cluster on one Linux machine, without Docker, for a user who wants to try a
// Kubernetes study before pointing it at a cluster of their own, and for meshmark's
// tests. Its parts are real: Debian's containerd and runc, etcd, the Kubernetes control
// plane, one kubelet and one containerd per node, bridge CNI, an nftables kube-proxy,
// CoreDNS, and the images meshmark and the meshes run, built locally and imported
// under the names their charts use.
//
// The cluster keeps off the host as the local testbed does. Each node is a network
// namespace of its own (mmkube-NAME.nodeI) joined to the others by a bridge in the
// cluster's fabric namespace (mmkube-NAME), all with addresses of 198.18.0.0/15 (nodes
// 198.19.64.0/24, pods 198.19.72.0/21, services 198.19.80.0/24); the host reaches only
// the API server, through a forwarder listening on a loopback port. Each node's
// containerd and kubelet also share a PID namespace, whose first process is the node's
// (what a node agent finds at /proc/1), and a private mount namespace in which /run,
// /var/lib, /var/log and /opt are the node's own and /etc is an overlay, so that the
// node finds the standard paths (/etc/cni/net.d, /opt/cni/bin, /var/lib/kubelet,
// /run/containerd) without a write to the host's, and the kernel tunables the kubelet
// insists on read as set without the host's being changed. Every process of the
// cluster, containers included, lives under one cgroup per hierarchy, so that down and
// clean kill them all.
// The package owns the cluster directories under StateRoot, the network namespaces
// mmkube-*, those cgroups, and the kubeconfig context it merged.
package localcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/meshmark/meshmark/internal/owner"
)

// StateRoot holds one directory per cluster: its state file, certificates, configs,
// etcd's data, the nodes' container storage, logs and images.
const StateRoot = "/var/lib/meshmark/clusters"

// DefaultName is the cluster `meshmark cluster up` makes unless told otherwise; its
// kubeconfig context has the same name.
const DefaultName = "meshmark-local"

// NodeLabel is on every node of a local cluster, with the cluster's name, so that
// meshmark knows a local cluster when it meets one (kube.LocalClusterLabel).
const NodeLabel = "meshmark.dev/cluster"

// NetNSPrefix starts the name of the network namespace of every cluster.
const NetNSPrefix = "mmkube-"

// MaxNodes is how many nodes fit the address plan (a /24 of pods each in a /21).
const MaxNodes = 8

// Address plan, inside 198.18.0.0/15 and apart from the local testbed's (198.18.0.0/16
// for its fabric and pods, 198.19.128.0/17 for its services) and from the paper-only
// test cluster's (198.19.0.0/18, 198.19.240.0/20).
var (
	nodePrefix    = netip.MustParsePrefix("198.19.64.0/24")
	podPrefix     = netip.MustParsePrefix("198.19.72.0/21")
	servicePrefix = netip.MustParsePrefix("198.19.80.0/24")
)

var namePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$`)

// Phase is how far a cluster's life has come.
type Phase string

const (
	PhaseStarting Phase = "starting" // up is bringing it up
	PhaseUp       Phase = "up"       // up finished; the cluster stays until down
	PhaseStopping Phase = "stopping" // down is taking it apart
)

// State is what a cluster's directory records about it, so that down and clean can
// take apart exactly what up made, even after a kill.
type State struct {
	Name  string    `json:"name"`
	Phase Phase     `json:"phase"`
	Nodes []Node    `json:"nodes"`
	Since time.Time `json:"since"`
	// Owner is the process whose cluster this is while it lives (a test binary); zero
	// for a cluster made by `meshmark cluster up`, which outlives its command.
	Owner owner.Owner `json:"owner"`
	// APIPort is the loopback port of the host on which the API server is reached.
	APIPort int `json:"api_port"`
	// Cgroup is the cluster's cgroup, the same path in every hierarchy; CreatedCgroups
	// are the directories up created to hold it, removed deepest first.
	Cgroup         string   `json:"cgroup"`
	CreatedCgroups []string `json:"created_cgroups"`
	// Kubeconfig is the file a context was merged into, and Context its name; empty
	// when none was.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Context    string `json:"context,omitempty"`
	// PIDs are the daemons up started, by name, so that down can stop them in order.
	PIDs map[string]int `json:"pids"`
}

// Node is one node of the cluster.
type Node struct {
	Name    string `json:"name"`
	NetNS   string `json:"netns"`
	Address string `json:"address"`
	PodCIDR string `json:"pod_cidr"`
	Bridge  string `json:"bridge"`
}

// Dir is the directory of the named cluster.
func Dir(name string) string { return filepath.Join(StateRoot, name) }

// NetNS is the named cluster's fabric namespace, the wire between its nodes.
func NetNS(name string) string { return NetNSPrefix + name }

func stateFile(name string) string { return filepath.Join(Dir(name), "state.json") }

// checkName refuses a name that cannot be a directory, a namespace and a context.
func checkName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("cluster name %q: use 1 to 32 lower-case letters, digits and '-', starting and ending with a letter or digit", name)
	}
	// The namespace's name must fit a network interface-like limit of iproute2's.
	return nil
}

// Load reads the named cluster's state; os.ErrNotExist when there is none.
func Load(name string) (*State, error) {
	b, err := os.ReadFile(stateFile(name))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", stateFile(name), err)
	}
	return &st, nil
}

// save writes the state atomically, so that a kill never leaves half a file.
func (st *State) save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	path := stateFile(st.Name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// List returns the names of every cluster with a directory under StateRoot.
func List() ([]string, error) {
	entries, err := os.ReadDir(StateRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && namePattern.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// nodeAddress is node i's address; the API server listens on node 0's.
func nodeAddress(i int) netip.Addr {
	b := nodePrefix.Addr().As4()
	b[3] = byte(10 + i)
	return netip.AddrFrom4(b)
}

// nodePodCIDR is node i's /24 of pods.
func nodePodCIDR(i int) netip.Prefix {
	b := podPrefix.Addr().As4()
	b[2] += byte(i)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// serviceAddress is the n-th address of the service range: 1 is the kubernetes
// Service's, 10 cluster DNS's.
func serviceAddress(n int) netip.Addr {
	b := servicePrefix.Addr().As4()
	b[3] = byte(n)
	return netip.AddrFrom4(b)
}

// DNSAddress is the cluster DNS Service's address, which every kubelet hands its pods.
var DNSAddress = serviceAddress(10)
