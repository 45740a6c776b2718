package ambient

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

var _ mesh.IngressGateway = (*Profile)(nil)

// IngressGatewayConfig is Istio's ingress gateway in pod (mesh.IngressGateway): a
// certificate for the gateway's identity from the control plane's CA, asked for from
// the gateway pod as Istio's gateway agent does, then its bootstrap (BuildIngressGateway).
func (p *Profile) IngressGatewayConfig(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod, entry string) ([]byte, error) {
	p.mu.Lock()
	ca := p.ca
	p.mu.Unlock()
	if ca.addr == "" {
		return nil, errors.New("istio-ambient ingress gateway: the mesh is not installed")
	}
	id := p.Identity(app, pod)
	certPEM, keyPEM, err := requestCertificate(ctx, sub, pod, ca.addr, ca.root, ca.token, id)
	if err != nil {
		return nil, fmt.Errorf("%s ingress gateway: %w", Name, err)
	}
	var files WaypointFiles
	for _, f := range []struct {
		name string
		data []byte
		mode uint32
		dst  *string
	}{{"gateway/root-cert.pem", ca.root, 0o644, &files.CA}, {"gateway/cert-chain.pem", certPEM, 0o644, &files.Cert}, {"gateway/key.pem", keyPEM, 0o600, &files.Key}} {
		path, err := sub.WriteFile(pod, f.name, f.data, f.mode)
		if err != nil {
			return nil, err
		}
		*f.dst = path
	}
	b, err := BuildIngressGateway(app, entry, pod, func(to topology.Pod) string { return p.Identity(app, to) }, files)
	if err != nil {
		return nil, err
	}
	js, err := MarshalWaypoint(b)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.configs["gateway/envoy.json"] = js
	p.mu.Unlock()
	return js, nil
}
