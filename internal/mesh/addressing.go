package mesh

import (
	"github.com/meshmark/meshmark/internal/topology"
	"github.com/meshmark/meshmark/internal/workload"
)

// Addressing is implemented by profiles whose callers address services by names of
// the mesh's own instead of the service's name and port: Traefik Mesh clients call
// <svc>.<ns>.traefik.mesh on a port of their node's proxy, a name its CoreDNS
// resolves. The runner asks it, after Install, for every caller (workload pods and
// the load generator) and every service, and gives the workload the answer
// (`meshmark service --callee` and `--resolve`), so the application really calls
// through the mesh's names.
type Addressing interface {
	// CalleeAddress says how a caller in pod from reaches service: the authority
	// (host:port) its URLs carry, and the ip:port that host resolves to for that
	// caller. ok is false when the caller uses the service's own name.
	CalleeAddress(from topology.Pod, service string) (authority, dial string, ok bool)
}

// Spreader is implemented by profiles whose callers balance requests themselves, with
// no proxy: the baseline with `balancing: per-request`. The runner gives every workload
// pod the endpoints of each service (`meshmark service --spread`), and the pod picks
// one per request by weight, as a mesh's proxy would, instead of calling the service
// address, which picks one per connection as kube-proxy does.
type Spreader interface {
	// Balancing is BalancePerRequest or BalancePerConnection; it is stored with the run so that
	// the report can say how the baseline balanced.
	Balancing() string
	// SpreadEndpoints lists the pods of service that take requests, as ip:port with
	// their weights (a version's weight shared among its pods); ok is false when
	// callers use the service address.
	SpreadEndpoints(app *topology.App, service string) (endpoints []workload.Endpoint, ok bool)
}

// The ways a Spreader's callers balance: a pod per request, by weight, or a pod per
// connection, as the service address does.
const (
	BalancePerRequest    = "per-request"
	BalancePerConnection = "per-connection"
)
