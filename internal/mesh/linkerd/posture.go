package linkerd

import (
	"crypto/x509"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture is what Linkerd promises: meshed proxies always speak mTLS to each
// other; callers without an identity are refused when the default inbound policy is
// all-authenticated (mtls strict, or an authz list); linkerd2-proxy-init lets the
// proxy's uid out unintercepted.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	return mesh.Posture{
		Meshed:               p.MeshedPods(app),
		Encrypts:             true,
		RefusesPlaintext:     p.mode == mesh.MTLSStrict || len(p.authz) > 0,
		ExcludedUIDs:         []int{substrate.LinkerdProxyUID},
		ExcludedInboundPorts: []int{ControlPort, AdminPort},
		Identity:             linkerdIdentity{p},
	}
}

type linkerdIdentity struct{ p *Profile }

// IdentityEndpoint: the pod's service port; the inbound proxy terminates TLS whose
// SNI is its own identity name (anything else it passes through as opaque), and the
// certificate carries that name as its DNS SAN.
func (l linkerdIdentity) IdentityEndpoint(app *topology.App, pod topology.Pod) (mesh.IdentityEndpoint, bool) {
	svc := app.Service(pod.Service)
	if svc == nil {
		return mesh.IdentityEndpoint{}, false
	}
	id := l.p.Identity(app, pod)
	return mesh.IdentityEndpoint{Addr: mesh.Addr(pod.IP, svc.Port), ServerName: id, Want: id}, true
}

func (l linkerdIdentity) TrustRoots() *x509.CertPool {
	if ca := l.p.CA(); ca != nil {
		return ca.Pool()
	}
	return nil
}
