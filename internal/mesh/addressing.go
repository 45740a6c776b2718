package mesh

import "github.com/meshmark/meshmark/internal/topology"

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
