package envoysidecar

import (
	"crypto/x509"
	"fmt"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// SecurityPosture is what Istio's sidecars promise: with mTLS on at all, sidecars talk
// mTLS to each other (auto mTLS, permissive included); only strict refuses callers
// without an identity; istio-iptables lets the proxy's uid out unintercepted.
func (p *Profile) SecurityPosture(app *topology.App) mesh.Posture {
	pos := mesh.Posture{
		Meshed:               p.MeshedPods(app),
		Encrypts:             p.mode != mesh.MTLSOff,
		RefusesPlaintext:     p.mode == mesh.MTLSStrict,
		ExcludedUIDs:         []int{substrate.ProxyUID},
		ExcludedInboundPorts: IstioExcludedInboundPorts,
	}
	if p.mode != mesh.MTLSOff {
		pos.Identity = sidecarIdentity{p}
	}
	return pos
}

type sidecarIdentity struct{ p *Profile }

// IdentityEndpoint: the pod's service port, which istio-iptables hands to the
// sidecar's inbound listener; the SNI is the one a client sidecar sends.
func (s sidecarIdentity) IdentityEndpoint(app *topology.App, pod topology.Pod) (mesh.IdentityEndpoint, bool) {
	svc := app.Service(pod.Service)
	if svc == nil {
		return mesh.IdentityEndpoint{}, false
	}
	return mesh.IdentityEndpoint{
		Addr:       mesh.Addr(pod.IP, svc.Port),
		ServerName: fmt.Sprintf("outbound_.%d_.%s_.%s", svc.Port, pod.Version, fqdn(app.Namespace, svc.Name)),
		Want:       s.p.identity(app, pod),
	}, true
}

func (s sidecarIdentity) TrustRoots() *x509.CertPool {
	if ca := s.p.CA(); ca != nil {
		return ca.Pool()
	}
	return nil
}
