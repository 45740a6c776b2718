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
	files, err := proxyCertificate(ctx, sub, pod, "gateway", ca, p.Identity(app, pod))
	if err != nil {
		return nil, fmt.Errorf("%s ingress gateway: %w", Name, err)
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
