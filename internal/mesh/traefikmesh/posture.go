package traefikmesh

import (
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture promises neither encryption nor refusal: Traefik Mesh's per-node
// proxies, which pods call by mesh names, speak plaintext to each other and to pods
// (Traefik Mesh has no mTLS), so the security probes show plaintext as expected, not
// as a failure.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	return mesh.Posture{Meshed: app.Pods()}
}
