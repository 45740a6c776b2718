package traefikmesh

import (
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture promises neither encryption nor refusal: Traefik Mesh's per-node
// proxies, which pods call by mesh names, speak plaintext to each other and to pods
// (Traefik Mesh has no mTLS), so the security probes show plaintext as expected, not
// as a failure.
// The load generator's traffic passes a node proxy too, but it holds no identity in
// any mesh, so it is left outside: the probes call from it.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	var services []topology.Pod
	for _, pod := range app.Pods() {
		if pod.Service != "" {
			services = append(services, pod)
		}
	}
	return mesh.Posture{Meshed: services}
}
