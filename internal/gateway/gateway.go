// Package gateway owns the ingress gateway studies put in front of an app when they
// measure the path users take from outside (`path: ingress`): one pod holding a plain
// Envoy reverse proxy that sends every request to the entry service by its virtual IP,
// speaking the service's protocol. The gateway knows nothing of any mesh: each mesh
// profile enrolls the gateway pod as it enrolls the app's pods, which is how Linkerd
// meshes an ingress controller. A mesh with a gateway of its own (Istio's, which
// originates mTLS itself) runs that one in the pod instead (mesh.IngressGateway), to
// the same contract: Port, AdminPort and HopHeader.
package gateway

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpoptsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Service is the gateway as the app sees it: a service of its own, so that every mesh
// profile enrolls its pod like the app's.
const Service = "ingress-gateway"

// Port is where the gateway listens (the service port); AdminPort is its Envoy admin,
// on the pod's loopback, clear of the ports sidecars and node proxies use in a pod.
const (
	Port      = 8080
	AdminPort = 15900
)

// HopHeader is added to every response that crossed the gateway, naming its pod, so a
// client can tell the ingress path from the internal one.
const HopHeader = "x-meshmark-gateway"

// Upstream is where the gateway sends traffic.
type Upstream struct {
	Service string
	// Addr is the service's virtual ip:port, or its DNS name and port on a cluster,
	// which the gateway resolves (to the Service's ClusterIP) as a client would.
	Addr     string
	Protocol string // "http", "http2" or "grpc", as the workload graph says
	// Host is the Host header toward the service; empty means Service. A mesh whose
	// clients use its own names (traefik-mesh) sets it, with Addr its proxy.
	Host string
}

// Listen says where the gateway listens; the zero value is Port on every address and
// AdminPort on loopback, as in a gateway pod.
type Listen struct {
	Addr      string
	Port      uint32
	AdminPort uint32
}

// PodHostname, as Bootstrap's pod, names in HopHeader the pod the gateway runs in by
// its hostname (Envoy's %HOSTNAME%), which is the pod's name on Kubernetes, where a
// Deployment's pods are named only when they are created.
const PodHostname = "%HOSTNAME%"

// Bootstrap is the gateway Envoy's whole configuration, as JSON.
func Bootstrap(pod string, up Upstream, at Listen) ([]byte, error) {
	if at.Addr == "" {
		at.Addr = "0.0.0.0"
	}
	if at.Port == 0 {
		at.Port = Port
	}
	if at.AdminPort == 0 {
		at.AdminPort = AdminPort
	}
	host, portStr, err := net.SplitHostPort(up.Addr)
	if err != nil {
		return nil, fmt.Errorf("gateway upstream %q: %w", up.Addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("gateway upstream %q: %w", up.Addr, err)
	}
	cluster := &clusterv3.Cluster{
		Name:                 up.Service,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: up.Service, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddr(host, uint32(port)),
			}}}},
		}}},
	}
	if net.ParseIP(host) == nil {
		// A name: its addresses are the name's as DNS gives them, kept fresh.
		cluster.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
		cluster.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
	}
	if up.Protocol == "http2" || up.Protocol == "grpc" {
		cluster.TypedExtensionProtocolOptions = map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpoptsv3.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
				}},
			}),
		}
	}
	routes := &routev3.RouteConfiguration{
		Name: "ingress",
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "ingress",
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: up.Service},
					Timeout:          durationpb.New(0), // the load generator owns timeouts
					// Callees are addressed by name, as a gateway's route rewrites the host.
					HostRewriteSpecifier: &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: cmp.Or(up.Host, up.Service)},
				}},
			}},
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: HopHeader, Value: pod}}},
		}},
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:        "ingress",
		CodecType:         hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier:    &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: routes},
		StreamIdleTimeout: durationpb.New(0),
		// An ingress does not trust what callers say about themselves.
		UseRemoteAddress: wrapperspb.Bool(true),
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	b := &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "gateway", Cluster: Service},
		Admin: &bootstrapv3.Admin{Address: socketAddr("127.0.0.1", at.AdminPort)},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{{
				Name:    "ingress",
				Address: socketAddr(at.Addr, at.Port),
				FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
				}}}},
			}},
			Clusters: []*clusterv3.Cluster{cluster},
		},
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("gateway bootstrap: %w", err)
	}
	return protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(b)
}

func socketAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// mustAny packs a message; it only fails for nil, which is a programming error here.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}
