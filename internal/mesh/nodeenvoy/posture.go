package nodeenvoy

import (
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture promises neither encryption nor refusal: Cilium's per-node Envoy
// carries pods' traffic in plaintext (Cilium's mutual authentication and WireGuard
// encryption are separate features this profile does not model), so the security
// probes show plaintext as expected, not as a failure.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	return mesh.Posture{Meshed: app.Pods()}
}
