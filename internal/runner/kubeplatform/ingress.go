package kubeplatform

import (
	"net"
	"strconv"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
)

// serviceHost is a Service's name in the cluster's DNS, which every pod resolves,
// whatever its resolver makes of search domains.
func serviceHost(service, namespace string) string {
	return service + "." + namespace + ".svc.cluster.local"
}

// needsIngress says whether an experiment of st takes the ingress path.
func needsIngress(st *study.Study) bool {
	for _, e := range st.Spec.Experiments {
		if e.Path == study.PathIngress {
			return true
		}
	}
	return false
}

// ingressGateway is the plain gateway (package gateway) the app in namespace gets in
// front of its entry service when an experiment of the study takes the ingress path, as
// on the local testbed: Envoy sending every request to the entry service by its name,
// enrolled by the mesh as the app's pods are. Nil when no experiment does.
func (r *run) ingressGateway(namespace string) (*kube.IngressGateway, error) {
	if !needsIngress(r.Study()) {
		return nil, nil
	}
	g := r.Graph()
	entry := g.Service(g.Entrypoint().Service)
	up := gateway.Upstream{Service: entry.Name, Protocol: entry.Protocol,
		Addr: net.JoinHostPort(serviceHost(kube.ServiceName(entry.Name), namespace), strconv.Itoa(entry.Port))}
	bootstrap, err := gateway.Bootstrap(gateway.PodHostname, up, gateway.Listen{})
	if err != nil {
		return nil, err
	}
	return &kube.IngressGateway{Image: gateway.Image, Envoy: gateway.ImageEnvoy, Bootstrap: bootstrap, Port: gateway.Port, Protocol: entry.Protocol}, nil
}
