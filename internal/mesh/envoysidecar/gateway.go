package envoysidecar

import (
	"context"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

var _ mesh.IngressGateway = (*Profile)(nil)

// gatewayLayout places Istio's ingress gateway: no interception and no inbound side,
// one listener on the gateway port, and its admin where the runner looks for it.
var gatewayLayout = layout{
	adminAddr: "127.0.0.1", adminPort: gateway.AdminPort,
	outboundOnly: true, ingress: true,
}

// BuildGatewayBootstrap generates Istio's ingress gateway for app, as istiod configures
// istio-ingressgateway for a Gateway on port 8080 and a VirtualService sending every
// host to the entry service: an Envoy in router mode in pod, with a plaintext HTTP
// listener on gateway.Port whose route is the sidecars' route to entry (the versions'
// weights, retries as the options say), and clusters of the entry service's pods that
// originate the mesh's mTLS with the gateway's own certificate (certs) unless mode is
// off. Every response names the gateway in gateway.HopHeader.
func BuildGatewayBootstrap(app *topology.App, pod topology.Pod, entry string, opts mesh.Options, mode mesh.MTLSMode, certs CertPaths) (*bootstrapv3.Bootstrap, error) {
	g := generator{app: app, pod: pod, opts: opts, mode: mode, certs: certs, lay: gatewayLayout}
	if err := g.validate(); err != nil {
		return nil, err
	}
	s := app.Service(entry)
	if s == nil {
		return nil, fmt.Errorf("%s ingress gateway: the app has no entry service %q", Name, entry)
	}
	var res Resources
	res.Clusters = append(res.Clusters, g.outboundCluster(*s, "", allEndpoints(*s)))
	if len(s.Versions) > 1 {
		for _, v := range s.Versions {
			res.Clusters = append(res.Clusters, g.outboundCluster(*s, v.Name, v.Endpoints))
		}
	}
	route, err := g.serviceRoute(*s)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("0.0.0.0_%d", gateway.Port)
	rc := &routev3.RouteConfiguration{
		Name: fmt.Sprintf("http.%d", gateway.Port),
		VirtualHosts: []*routev3.VirtualHost{{
			Name:                 fmt.Sprintf("*:%d", gateway.Port),
			Domains:              []string{"*"},
			Routes:               []*routev3.Route{route},
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: gateway.HopHeader, Value: pod.Name}}},
		}},
	}
	res.Listeners = append(res.Listeners, &listenerv3.Listener{
		Name:             name,
		Address:          socketAddr("0.0.0.0", gateway.Port),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{g.hcm("outbound_"+name, rc, false)},
		}},
	})
	return g.wrap(res), nil
}

// IngressGatewayConfig is Istio's ingress gateway in pod (mesh.IngressGateway): its
// workload certificate for the gateway's own identity, then its bootstrap.
func (p *Profile) IngressGatewayConfig(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod, entry string) ([]byte, error) {
	certs, err := p.writeCerts(sub, pod, p.identity(app, pod))
	if err != nil {
		return nil, fmt.Errorf("%s ingress gateway: %w", Name, err)
	}
	b, err := BuildGatewayBootstrap(app, pod, entry, p.opts, p.mode, certs)
	if err != nil {
		return nil, err
	}
	js, err := MarshalBootstrap(b)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.configs[pod.Name+"/gateway.json"] = js
	p.mu.Unlock()
	return js, nil
}
