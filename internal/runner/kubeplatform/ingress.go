package kubeplatform

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"sigs.k8s.io/yaml"
)

// serviceHost is a Service's name in the cluster's DNS, which every pod resolves,
// whatever its resolver makes of search domains.
func serviceHost(service, namespace string) string {
	return service + "." + namespace + ".svc.cluster.local"
}

// ingress is where an ingress path's requests go on a deployment: the plain gateway's
// Service, or the one the mesh's controller made for its own gateway.
type ingress struct {
	service string
	port    int
}

// planIngress readies the ingress path of a mesh in namespace, when an experiment of
// the study takes it: the mesh's own gateway (plan.Ingress: its charts added to the
// install, its Gateway to the app's, and a route from it to the entry service), else
// the plain gateway in front of the entry service, as on the local testbed.
func (r *run) planIngress(plan *meshkube.KubernetesInstall, spec *kube.AppSpec, namespace string) (*ingress, error) {
	if r.Study().IngressExperiment() < 0 {
		return nil, nil
	}
	if plan == nil || plan.Ingress == nil {
		g, err := r.ingressGateway(namespace)
		if err != nil {
			return nil, err
		}
		spec.Ingress = g
		return &ingress{service: g.Name, port: g.Port}, nil
	}
	own := plan.Ingress
	var gw struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(own.Gateway.Manifest), &gw); err != nil || gw.Metadata.Name == "" {
		return nil, fmt.Errorf("the mesh's ingress gateway: a Gateway without a name (%v)", err)
	}
	for _, ch := range own.Charts {
		if !slices.ContainsFunc(plan.Charts, func(have meshkube.HelmChart) bool { return have.Release == ch.Release }) {
			plan.Charts = slices.Insert(plan.Charts, min(1, len(plan.Charts)), ch)
		}
	}
	plan.Gateways = append(slices.Clip(plan.Gateways), own.Gateway)
	entry := r.Graph().Service(r.Graph().Entrypoint().Service)
	spec.IngressRoute = &kube.IngressRoute{Gateway: gw.Metadata.Name, Service: kube.ServiceName(entry.Name), Port: entry.Port}
	return &ingress{service: own.Gateway.Deployment, port: own.Port}, nil
}

// ingressGateway is the plain gateway (package gateway) the app in namespace gets in
// front of its entry service when an experiment of the study takes the ingress path, as
// on the local testbed: Envoy sending every request to the entry service by its name,
// enrolled by the mesh as the app's pods are.
func (r *run) ingressGateway(namespace string) (*kube.IngressGateway, error) {
	g := r.Graph()
	entry := g.Service(g.Entrypoint().Service)
	up := gateway.Upstream{Service: entry.Name, Protocol: entry.Protocol,
		Addr: net.JoinHostPort(serviceHost(kube.ServiceName(entry.Name), namespace), strconv.Itoa(entry.Port))}
	bootstrap, err := gateway.Bootstrap(gateway.PodHostname, up, gateway.Listen{})
	if err != nil {
		return nil, err
	}
	return &kube.IngressGateway{Name: gateway.Service, Image: gateway.Image, Envoy: gateway.ImageEnvoy, Bootstrap: bootstrap, Port: gateway.Port, Protocol: entry.Protocol}, nil
}
