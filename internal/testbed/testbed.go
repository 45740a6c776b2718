// Package testbed is the local substrate: it runs an application on one Linux machine
// without containers. Every pod is a network namespace with its own address, the pods of
// a node hang off that node's bridge, and the nodes are joined by a fabric bridge that
// lives in a namespace of its own, so the host network namespace is never changed.
// Services get a virtual IP that kube-proxy-style iptables DNAT rules spread over their
// endpoints. The package owns run state under /run/meshmark/<id>, the namespaces
// mm-<id>-*, the /etc/netns/mm-<id>-* name-resolution files, and their cleanup
// (Close for a live run, Clean for leftovers of killed runs).
package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/owner"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/vishvananda/netlink"
)

// Directories the testbed writes to besides /run/netns.
const (
	// RunRoot holds one directory per testbed: configs, certificates, logs, the owner
	// pid file and the manifest.
	RunRoot = "/run/meshmark"
	// etcNetnsDir is where `ip netns exec` finds per-namespace /etc files.
	etcNetnsDir = "/etc/netns"
)

// Prefix starts the name of every namespace and /etc/netns entry a testbed creates.
const Prefix = "mm-"

// Address plan, all inside 198.18.0.0/15 (RFC 2544, reserved for benchmarking):
// 198.18.0.0/24 is the fabric (node i is 198.18.0.i+1), node i's pods use the /24 at
// 198.18.0.0 + (i+1)*256 with the node's bridge at .1, and service VIPs come from
// 198.19.128.0/17.
var (
	fabricPrefix = netip.MustParsePrefix("198.18.0.0/24")
	vipPrefix    = netip.MustParsePrefix("198.19.128.0/17")
)

// MaxNodes is the largest number of nodes a testbed can have (one fabric /24).
const MaxNodes = 254

// maxPodsPerNode is what fits in a node's /24 beside the network, gateway and broadcast.
const maxPodsPerNode = 253

// ServiceChain is the iptables nat chain that holds the service DNAT rules. It is jumped
// to from OUTPUT in every pod namespace and from PREROUTING and OUTPUT in every node
// namespace. A mesh profile that intercepts outbound traffic in a pod must put its
// rules before the jump (iptables -t nat -I OUTPUT 1 ...) or flush the pod's nat table;
// either way the node still applies the same DNAT to traffic that reaches it.
const ServiceChain = "MESHMARK-SERVICES"

// Options configure a testbed.
type Options struct {
	// Nodes is the number of nodes (default 1), named node0, node1, ...
	Nodes int
	// Namespace is the logical namespace of the app (default "default"); services
	// resolve as name, name.<ns>, name.<ns>.svc and name.<ns>.svc.cluster.local.
	Namespace string
	// TrustDomain for SPIFFE identities (default "cluster.local").
	TrustDomain string
	// LogDir, when set, receives process logs instead of the run directory, so they
	// survive Close.
	LogDir string
	// StartTimeout bounds how long Start waits for a process to become ready
	// (default 30s).
	StartTimeout time.Duration
	// StopGrace is how long Stop and Close wait after SIGTERM before SIGKILL
	// (default 2s).
	StopGrace time.Duration
	// MTU of every veth and bridge (default 1500).
	MTU int
}

func (o *Options) setDefaults() error {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 0 || o.Nodes > MaxNodes {
		return fmt.Errorf("testbed: Nodes=%d: must be between 1 and %d", o.Nodes, MaxNodes)
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if err := checkDNSLabel("Namespace", o.Namespace); err != nil {
		return err
	}
	if o.TrustDomain == "" {
		o.TrustDomain = "cluster.local"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.StopGrace == 0 {
		o.StopGrace = 2 * time.Second
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	return nil
}

// Testbed is a running local substrate. It implements substrate.Substrate. All methods
// are safe for concurrent use.
type Testbed struct {
	id     string
	runDir string
	opts   Options

	mu       sync.Mutex
	closed   bool
	fabric   *netNS
	nodes    []*node
	pods     map[string]*pod // by pod name
	podOrder []string
	services []*service
	procs    []*Proc
	manifest manifest

	closeOnce sync.Once
	closeErr  error
}

var _ substrate.Substrate = (*Testbed)(nil)

// netNS is one namespace the testbed created, with the descriptors kept open so that
// entering it costs one setns and no path lookup.
type netNS struct {
	name string
	file *os.File
	nlMu sync.Mutex // a netlink.Handle must not be used concurrently
	nl   *netlink.Handle
	// jumpInstalled records that the jumps into ServiceChain exist in this namespace.
	jumpInstalled bool
}

func (n *netNS) fd() int { return int(n.file.Fd()) }

type node struct {
	name    string
	index   int
	ns      *netNS
	uplink  netip.Addr   // address on the fabric
	subnet  netip.Prefix // pod addresses
	gateway netip.Addr   // the node bridge's address, pods' default route
	nextPod int          // next host number in subnet
}

type pod struct {
	topo topology.Pod
	ns   *netNS
	node *node
	dir  string
}

type service struct {
	name      string
	vip       netip.Addr
	port      int
	endpoints []topology.Pod
}

// New creates the run directory, the fabric and the nodes. The caller must Close the
// testbed, also when New's caller fails later; New itself cleans up if it fails.
func New(ctx context.Context, opts Options) (*Testbed, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("testbed: needs root (network namespaces, iptables)")
	}
	tb := &Testbed{opts: opts, pods: map[string]*pod{}}
	if err := tb.createRunDir(); err != nil {
		return nil, err
	}
	if err := tb.buildFabric(ctx); err != nil {
		return nil, errors.Join(err, tb.Close())
	}
	return tb, nil
}

// ID is the run id, the part after "mm-" in every object's name.
func (tb *Testbed) ID() string { return tb.id }

// RunDir is /run/meshmark/<id>.
func (tb *Testbed) RunDir() string { return tb.runDir }

// Namespace is the logical namespace of the app.
func (tb *Testbed) Namespace() string { return tb.opts.Namespace }

// NetNSName returns the network namespace name the testbed uses for an object name
// (a pod, a node or "fabric").
func (tb *Testbed) NetNSName(name string) string { return Prefix + tb.id + "-" + name }

// Nodes returns the node names in order.
func (tb *Testbed) Nodes() []string {
	out := make([]string, len(tb.nodes))
	for i, n := range tb.nodes {
		out[i] = n.name
	}
	return out
}

// NodePod returns a pseudo-pod for a node's own namespace (where the node bridge, the
// node's routes and the node-level service rules live), for per-node proxies: Exec,
// Start, WriteFile and DialContext accept it.
func (tb *Testbed) NodePod(nodeName string) (topology.Pod, error) {
	n, err := tb.nodeByName(nodeName)
	if err != nil {
		return topology.Pod{}, err
	}
	return topology.Pod{Name: n.name, Node: n.name, NetNS: n.ns.name, IP: n.gateway}, nil
}

// WireTaps are the node bridges: every pod hangs off its node's bridge, so captured
// there (in promiscuous mode) every frame a pod sends or receives is seen, traffic
// between nodes on both nodes' bridges (see substrate.WireTapper).
func (tb *Testbed) WireTaps() []substrate.WireTap {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	out := make([]substrate.WireTap, 0, len(tb.nodes))
	for _, n := range tb.nodes {
		out = append(out, substrate.WireTap{Node: n.name, NetNSPath: filepath.Join(netnsDir, n.ns.name), Interface: nodeBridge})
	}
	return out
}

func (tb *Testbed) nodeByName(name string) (*node, error) {
	for _, n := range tb.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("testbed: no node %q (have %v)", name, tb.Nodes())
}

// NewRunID returns 6 random hex characters: a run's id, as its objects are named.
func NewRunID() string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// createRunDir claims a fresh run id. The directory appears under its final name only
// once it holds the owner file (rename is atomic), so `meshmark clean` never sees a run
// directory without an owner.
func (tb *Testbed) createRunDir() error {
	if err := os.MkdirAll(RunRoot, 0o755); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	self, err := owner.Current()
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	for attempt := 0; attempt < 20; attempt++ {
		id := NewRunID()
		if leftoverNamesExist(id) {
			continue
		}
		tmp, err := os.MkdirTemp(RunRoot, ".new-")
		if err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
		if err := os.Chmod(tmp, 0o755); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("testbed: %w", err)
		}
		if err := os.WriteFile(filepath.Join(tmp, ownerFile), []byte(self.String()), 0o644); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("testbed: %w", err)
		}
		final := filepath.Join(RunRoot, id)
		// rename refuses to replace a non-empty directory, so two processes that drew
		// the same id cannot both claim it.
		if err := os.Rename(tmp, final); err != nil {
			os.RemoveAll(tmp)
			continue
		}
		tb.id, tb.runDir = id, final
		tb.manifest = manifest{ID: id, Owner: self, Created: time.Now().UTC()}
		for _, d := range []string{"pods", "logs"} {
			if err := os.Mkdir(filepath.Join(final, d), 0o755); err != nil {
				os.RemoveAll(final)
				return fmt.Errorf("testbed: %w", err)
			}
		}
		if err := tb.saveManifest(); err != nil {
			os.RemoveAll(final)
			return err
		}
		return nil
	}
	return errors.New("testbed: could not find a free run id")
}

// leftoverNamesExist reports whether objects of a run id already exist (an id of a
// killed run that was not cleaned yet must not be reused).
func leftoverNamesExist(id string) bool {
	if _, err := os.Stat(filepath.Join(RunRoot, id)); err == nil {
		return true
	}
	for _, dir := range []string{netnsDir, etcNetnsDir} {
		matches, _ := filepath.Glob(filepath.Join(dir, Prefix+id+"-*"))
		if len(matches) > 0 {
			return true
		}
	}
	return false
}

// Close stops every process, deletes the namespaces, the /etc/netns entries and the
// run directory. It is idempotent and safe to call from a deferred path after errors
// or cancellation; it does not take a context because it must run after the caller's
// context was cancelled.
func (tb *Testbed) Close() error {
	tb.closeOnce.Do(func() {
		tb.mu.Lock()
		tb.closed = true
		procs := append([]*Proc(nil), tb.procs...)
		var all []*netNS
		if tb.fabric != nil {
			all = append(all, tb.fabric)
		}
		for _, n := range tb.nodes {
			all = append(all, n.ns)
		}
		for _, name := range tb.podOrder {
			if ns := tb.pods[name].ns; ns != nil {
				all = append(all, ns)
			}
		}
		// The manifest also lists namespaces whose creation was interrupted.
		names := append([]string(nil), tb.manifest.Namespaces...)
		tb.mu.Unlock()

		var errs []error
		stopAll(procs, tb.opts.StopGrace)
		// Processes nobody tracked (started through Exec, or children that left the
		// process group) would keep a namespace alive.
		if err := killNetNSProcesses(names, tb.opts.StopGrace); err != nil {
			errs = append(errs, err)
		}
		for _, ns := range all {
			if ns.nl != nil {
				ns.nl.Close()
			}
			ns.file.Close()
		}
		errs = append(errs, removeNamespaces(names)...)
		if tb.runDir != "" {
			if err := os.RemoveAll(tb.runDir); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			tb.closeErr = fmt.Errorf("testbed %s: close: %w", tb.id, err)
		}
	})
	return tb.closeErr
}

// removeNamespaces deletes namespaces and their /etc/netns directories.
func removeNamespaces(names []string) []error {
	var errs []error
	for _, name := range names {
		if err := removeNamedNetNS(name); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(filepath.Join(etcNetnsDir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (tb *Testbed) checkOpen() error {
	if tb.closed {
		return fmt.Errorf("testbed %s is closed", tb.id)
	}
	return nil
}
