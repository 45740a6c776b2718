// Package substrate defines what a mesh profile and the study runner may ask of the place
// an application runs: run commands and long-lived processes in a pod's network
// namespace, put files where those processes can read them, and open connections from
// inside a pod. The local netns testbed implements it today; a Kubernetes substrate
// will implement the same interface later.
package substrate

import (
	"context"
	"io"
	"net"

	"github.com/meshmark/meshmark/internal/topology"
)

// Well-known user ids. Istio's data plane excludes the proxy's own traffic from
// interception by uid, so proxies must run under ProxyUID and nothing else may.
const (
	ProxyUID    = 1337
	WorkloadUID = 2000
	// LinkerdProxyUID is the uid Linkerd runs linkerd2-proxy as; linkerd2-proxy-init
	// excludes it from interception the way istio-iptables excludes ProxyUID.
	LinkerdProxyUID = 2102
)

// Role says what a process is for; the resource sampler aggregates by it.
type Role string

const (
	RoleWorkload     Role = "workload"
	RoleSidecar      Role = "sidecar"
	RoleNodeProxy    Role = "node-proxy"
	RoleGateway      Role = "gateway"
	RoleControlPlane Role = "control-plane"
	RoleLoadGen      Role = "load-generator"
)

// ProcessSpec describes a long-running process to start inside a pod.
type ProcessSpec struct {
	Name string // short, unique within the pod, e.g. "envoy" or "app"
	Role Role
	Argv []string
	Env  []string
	UID  int // 0 means root; use ProxyUID or WorkloadUID
	// Ready, when set, is polled until it returns nil (or the start times out).
	Ready func(ctx context.Context) error
}

// Process is a started process.
type Process interface {
	PID() int
	Spec() ProcessSpec
	Pod() string
	// LogPath is the file that receives the process's stdout and stderr.
	LogPath() string
	// Stop terminates the process (SIGTERM, then SIGKILL after a grace period).
	Stop() error
}

// Exiting is implemented by processes whose end the substrate observes (the local
// testbed's do). The study runner watches every process of the system under test
// through it during a trial: a proxy or service that exits or restarts mid-trial makes
// the trial measure something else. Processes of a substrate without it are not
// watched.
type Exiting interface {
	// Done is closed when the process has exited.
	Done() <-chan struct{}
	// Err is how it ended; it blocks until Done is closed.
	Err() error
}

// Substrate is a running environment of pods.
type Substrate interface {
	// Exec runs a short command as root in the pod's network namespace, feeding stdin
	// when non-nil, and returns its combined output.
	Exec(ctx context.Context, pod topology.Pod, stdin io.Reader, argv ...string) ([]byte, error)
	// Start starts a long-running process in the pod's network namespace.
	Start(ctx context.Context, pod topology.Pod, spec ProcessSpec) (Process, error)
	// WriteFile stores a file for the pod (configs, certificates) readable by the
	// pod's processes, and returns its absolute path.
	WriteFile(pod topology.Pod, name string, data []byte, mode uint32) (string, error)
	// DialContext opens a connection from inside the pod's network namespace.
	DialContext(ctx context.Context, pod topology.Pod, network, addr string) (net.Conn, error)
	// Processes lists every process started so far, for the resource sampler.
	Processes() []Process
}

// UIDDialer is implemented by substrates that can open a connection from a pod the way
// a process running under a given uid would (the local testbed can). Interception
// rules exclude the proxy's own uid by the socket's owner, so the security probes use
// it to try a workload that runs as the proxy's uid.
type UIDDialer interface {
	DialContextAs(ctx context.Context, pod topology.Pod, uid int, network, addr string) (net.Conn, error)
}

// PodListener is implemented by substrates that can open a listening socket inside a
// pod, as a process of the pod would (the local testbed can). The security probes use
// it to stand in for an application that opens a port beside its service port.
type PodListener interface {
	ListenIn(pod topology.Pod, network, addr string) (net.Listener, error)
}

// WireTapper is implemented by substrates whose pods' traffic can be captured: the
// local testbed's node bridges. The security experiment's encryption probe reads the
// wire through it; a substrate without it cannot show what crosses its network.
type WireTapper interface {
	WireTaps() []WireTap
}

// WireTap is one place to capture: an interface inside a network namespace, named by
// the path of its pin (for example /run/netns/NAME).
type WireTap struct {
	Node      string
	NetNSPath string
	Interface string
}
