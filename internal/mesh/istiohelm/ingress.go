package istiohelm

import (
	"fmt"
	"strconv"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	gatewayapicrds "github.com/meshmark/meshmark/third_party/gateway-api-crds"
)

// IngressGatewayName is the Gateway of Istio's ingress on a cluster; istiod names the
// Deployment and the Service it makes for it IngressGatewayName-istio.
const IngressGatewayName = "ingress-gateway"

// Ingress is Istio's own ingress gateway on a cluster, as Istio's ingress documentation
// deploys it with the Kubernetes Gateway API: a Gateway of class istio listening for
// HTTP on port, which istiod turns into a Deployment of istio-proxy in router mode (no
// sidecar beside it, originating the mesh's mTLS itself) and a Service. The Service is
// a ClusterIP one (networking.istio.io/service-type): a load balancer's address is
// not what the load generators, inside the cluster, need, and a cluster without one
// would never see the Gateway Programmed. The Gateway API's CRDs come first, from
// meshmark's copy of the release Istio is built against.
func Ingress(port int) (*meshkube.IngressInstall, error) {
	dir, err := gatewayapicrds.Dir()
	if err != nil {
		return nil, fmt.Errorf("istio's ingress gateway: %w", err)
	}
	manifest := `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: ` + IngressGatewayName + `
  annotations:
    networking.istio.io/service-type: ClusterIP
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: ` + strconv.Itoa(port) + `
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Same
`
	return &meshkube.IngressInstall{
		Gateway: meshkube.AppGateway{Manifest: manifest, Deployment: IngressGatewayName + "-istio"},
		Port:    port,
		Charts:  []meshkube.HelmChart{{Release: gatewayapicrds.Chart, Namespace: Namespace, Chart: dir}},
	}, nil
}
