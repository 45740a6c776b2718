package ambient

import (
	"crypto/x509"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture is what ambient promises: ztunnels carry meshed pods' traffic to
// each other in HBONE (mTLS); strict refuses callers without an identity. The in-pod
// redirection does not exempt any uid (ztunnel runs outside the pod), so there is no
// excluded uid to try.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	return mesh.Posture{
		Meshed:           p.MeshedPods(app),
		Encrypts:         true,
		RefusesPlaintext: p.mode == mesh.MTLSStrict,
		Identity:         ztunnelIdentity{p},
	}
}

type ztunnelIdentity struct{ p *Profile }

// IdentityEndpoint: HBONE's port on the pod's address, where the node's ztunnel
// answers for the pod with the pod's own certificate; HBONE is HTTP/2, so h2.
func (z ztunnelIdentity) IdentityEndpoint(app *topology.App, pod topology.Pod) (mesh.IdentityEndpoint, bool) {
	if pod.Service == "" {
		return mesh.IdentityEndpoint{}, false
	}
	return mesh.IdentityEndpoint{Addr: mesh.Addr(pod.IP, HBONEPort), NextProtos: []string{"h2"}, Want: z.p.Identity(app, pod)}, true
}

func (z ztunnelIdentity) TrustRoots() *x509.CertPool {
	pem := z.p.RootCertPEM()
	if len(pem) == 0 {
		return nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil
	}
	return pool
}
