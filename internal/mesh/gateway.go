package mesh

import (
	"context"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// IngressGateway is implemented by profiles whose mesh has an ingress gateway of its
// own: Istio's is an Envoy in router mode, in a pod without a sidecar, that its control
// plane configures with the mesh's routes and that originates the mesh's mTLS itself.
// For a study's ingress path the runner then runs that gateway in the gateway pod
// instead of the plain proxy (package gateway) that other profiles enroll like an app
// pod, which is how Linkerd meshes an ingress controller. The profile leaves the
// gateway pod out of its sidecars and its callers send it what they send a pod without
// a sidecar.
type IngressGateway interface {
	// IngressGatewayConfig writes what the gateway in pod needs (its certificate) and
	// returns its Envoy bootstrap: listening on the gateway port (gateway.Port) on every
	// address with its admin on gateway.AdminPort on loopback, sending every request to
	// the entry service, and naming pod in the gateway.HopHeader of every response. The
	// runner starts it as the proxy uid, called after Install.
	IngressGatewayConfig(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod, entry string) ([]byte, error)
}
