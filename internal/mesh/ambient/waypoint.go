package ambient

import (
	"fmt"
	"net/netip"
	"sort"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	internallistenerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/bootstrap/internal_listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/topology"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The waypoint is an Envoy that does what Istio's waypoint does for a namespace, built
// with go-control-plane's typed API as a static bootstrap:
//
//	connect_terminate (0.0.0.0:15008, mTLS, HTTP/2 CONNECT)
//	  -> per service, by the CONNECT authority (VIP:port), the internal listener
//	     main_internal|<svc>: HTTP routing with the service's version split per request
//	  -> per version cluster, whose endpoints are the internal listeners
//	     connect_originate|<pod ip>: TCP proxy tunnelling (HBONE) to <pod ip>:15008
//	     with the waypoint's own certificate, checking the pod's SPIFFE ID.
//
// Istio's waypoint routes through one internal listener with original-destination
// filter state; a listener per service and per pod is the same data path spelled out
// statically, which a static bootstrap needs.

// WaypointAdminPort is the waypoint's admin port on loopback of its namespace (ztunnel
// holds 15000 there).
const WaypointAdminPort = 15100

// WaypointServiceAccount is the waypoint's identity's service account.
const WaypointServiceAccount = "waypoint"

// WaypointFiles are the waypoint's certificate, key and the mesh root.
type WaypointFiles struct{ Cert, Key, CA string }

// waypointStatPrefix names the per-service HTTP stats: http.<prefix>.downstream_rq_total.
func waypointStatPrefix(svc string) string { return "waypoint_" + svc }

// hbone builds what an Envoy of the mesh (the waypoint, the ingress gateway) needs to
// carry requests to pods over HBONE: per pod an internal listener connect_originate|<ip>
// tunnelling to <ip>:15008 through the cluster hbone|<ip>, with the proxy's own
// certificate and the pod's SPIFFE ID checked; per service the L7 route that splits
// requests over its versions' pods.
type hbone struct {
	files    WaypointFiles
	bindIP   netip.Addr // where upstream connections leave from; zero: anywhere
	identity func(topology.Pod) string

	listeners  []*listenerv3.Listener
	clusters   []*clusterv3.Cluster
	originated map[string]bool
}

// tls is the proxy's TLS context toward a peer whose SPIFFE ID san matches.
func (h *hbone) tls(san *matcherv3.StringMatcher, alpn ...string) *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		// ztunnel speaks TLS 1.3 only (HBONE); Envoy's client default tops at 1.2.
		TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_3, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3},
		TlsCertificates: []*tlsv3.TlsCertificate{{
			CertificateChain: fileSource(h.files.Cert),
			PrivateKey:       fileSource(h.files.Key),
		}},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa:                 fileSource(h.files.CA),
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: san}},
		}},
		AlpnProtocols: alpn,
	}
}

// to returns the internal listener that tunnels to pod, adding it once.
func (h *hbone) to(pod topology.Pod) string {
	name := fmt.Sprintf("connect_originate|%s", pod.IP)
	if h.originated[name] {
		return name
	}
	if h.originated == nil {
		h.originated = map[string]bool{}
	}
	h.originated[name] = true
	cluster := fmt.Sprintf("hbone|%s", pod.IP)
	h.listeners = append(h.listeners, &listenerv3.Listener{
		Name:              name,
		ListenerSpecifier: &listenerv3.Listener_InternalListener{InternalListener: &listenerv3.Listener_InternalListenerConfig{}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.tcp_proxy",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
				StatPrefix:       name,
				ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
				TunnelingConfig:  &tcpproxyv3.TcpProxy_TunnelingConfig{Hostname: fmt.Sprintf("%s:%d", pod.IP, pod.Port)},
			})},
		}}}},
	})
	c := &clusterv3.Cluster{
		Name:                 cluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: cluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddr(pod.IP.String(), HBONEPort)}}}},
		}}},
		TransportSocket: tlsSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: h.tls(
			&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: h.identity(pod)}}, "h2")}),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpoptsv3.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
				}},
			}),
		},
	}
	if h.bindIP.IsValid() {
		c.UpstreamBindConfig = &corev3.BindConfig{SourceAddress: &corev3.SocketAddress{Address: h.bindIP.String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}
	}
	h.clusters = append(h.clusters, c)
	return name
}

// route is the L7 route action for s: its versions' split applied per request (as a
// waypoint or gateway does), each version's pods reached over HBONE.
func (h *hbone) route(s topology.Service) *routev3.RouteAction {
	var weighted []*routev3.WeightedCluster_ClusterWeight
	split := false
	if len(s.Versions) > 1 {
		for _, v := range s.Versions {
			split = split || v.Weight > 0
		}
	}
	var all []string
	for _, v := range s.Versions {
		var eps []string
		for _, pod := range v.Endpoints {
			name := h.to(pod)
			eps = append(eps, name)
			all = append(all, name)
		}
		if split && v.Weight > 0 {
			cname := s.Name + "|" + v.Name
			h.clusters = append(h.clusters, l7Cluster(internalCluster(cname, eps)))
			weighted = append(weighted, &routev3.WeightedCluster_ClusterWeight{Name: cname, Weight: wrapperspb.UInt32(uint32(v.Weight))})
		}
	}
	action := &routev3.RouteAction{Timeout: durationpb.New(0)}
	if len(weighted) > 0 {
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: weighted}}
	} else {
		h.clusters = append(h.clusters, l7Cluster(internalCluster(s.Name, all)))
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: s.Name}
	}
	return action
}

// bootstrap puts the listeners (front first) and clusters into a static bootstrap with
// internal listeners enabled.
func (h *hbone) bootstrap(node *corev3.Node, adminPort uint32, front ...*listenerv3.Listener) *bootstrapv3.Bootstrap {
	sort.SliceStable(h.clusters, func(i, j int) bool { return h.clusters[i].Name < h.clusters[j].Name })
	return &bootstrapv3.Bootstrap{
		Node:  node,
		Admin: &bootstrapv3.Admin{Address: socketAddr("127.0.0.1", adminPort)},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: append(front, h.listeners...),
			Clusters:  h.clusters,
		},
		BootstrapExtensions: []*corev3.TypedExtensionConfig{{
			Name:        "envoy.bootstrap.internal_listener",
			TypedConfig: mustAny(&internallistenerv3.InternalListener{}),
		}},
	}
}

// BuildWaypoint renders the waypoint bootstrap for app.
// Its upstream connections leave from ownIP, the address ztunnel knows it by.
func BuildWaypoint(app *topology.App, trustDomain string, ownIP netip.Addr, identity func(topology.Pod) string, f WaypointFiles) (*bootstrapv3.Bootstrap, error) {
	h := &hbone{files: f, bindIP: ownIP, identity: identity}
	var connectRoutes []*routev3.Route
	for _, s := range app.Services {
		if !s.VIP.IsValid() || s.Port == 0 {
			return nil, fmt.Errorf("service %s has no VIP or port", s.Name)
		}
		if s.Name == gateway.Service {
			continue // the ingress gateway is not behind the waypoint, as in Istio
		}
		mainName := "main_internal|" + s.Name
		connectRoutes = append(connectRoutes, &routev3.Route{
			Match: &routev3.RouteMatch{
				PathSpecifier: &routev3.RouteMatch_ConnectMatcher_{ConnectMatcher: &routev3.RouteMatch_ConnectMatcher{}},
				Headers: []*routev3.HeaderMatcher{{Name: ":authority", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
					StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: fmt.Sprintf("%s:%d", s.VIP, s.Port)}}}}},
			},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: mainName},
				UpgradeConfigs:   []*routev3.RouteAction_UpgradeConfig{{UpgradeType: "CONNECT", ConnectConfig: &routev3.RouteAction_UpgradeConfig_ConnectConfig{}}},
				Timeout:          durationpb.New(0),
			}},
		})
		h.clusters = append(h.clusters, internalCluster(mainName, []string{mainName}))
		action := h.route(s)
		h.listeners = append(h.listeners, &listenerv3.Listener{
			Name:              mainName,
			ListenerSpecifier: &listenerv3.Listener_InternalListener{InternalListener: &listenerv3.Listener_InternalListenerConfig{}},
			FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm(&hcmv3.HttpConnectionManager{
				StatPrefix: waypointStatPrefix(s.Name),
				CodecType:  hcmv3.HttpConnectionManager_AUTO,
				RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
					Name: s.Name,
					VirtualHosts: []*routev3.VirtualHost{{Name: s.Name, Domains: []string{"*"}, Routes: []*routev3.Route{{
						Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
						Action: &routev3.Route_Route{Route: action},
					}}}},
				}},
			})}}},
		})
	}
	terminate := &listenerv3.Listener{
		Name:    "connect_terminate",
		Address: socketAddr("0.0.0.0", HBONEPort),
		FilterChains: []*listenerv3.FilterChain{{
			TransportSocket: tlsSocket(&tlsv3.DownstreamTlsContext{
				RequireClientCertificate: wrapperspb.Bool(true),
				CommonTlsContext: h.tls(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
					Prefix: "spiffe://" + trustDomain + "/"}}, "h2"),
			}),
			Filters: []*listenerv3.Filter{hcm(&hcmv3.HttpConnectionManager{
				StatPrefix:           "connect_terminate",
				CodecType:            hcmv3.HttpConnectionManager_HTTP2,
				Http2ProtocolOptions: &corev3.Http2ProtocolOptions{AllowConnect: true},
				UpgradeConfigs:       []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "CONNECT"}},
				StreamIdleTimeout:    durationpb.New(0),
				RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
					Name:         "connect_terminate",
					VirtualHosts: []*routev3.VirtualHost{{Name: "connect", Domains: []string{"*"}, Routes: connectRoutes}},
				}},
			})},
		}},
	}
	return h.bootstrap(&corev3.Node{Id: "waypoint~" + app.Namespace, Cluster: "waypoint." + app.Namespace}, WaypointAdminPort, terminate), nil
}

// BuildIngressGateway renders Istio's ingress gateway in ambient mode for app: an Envoy
// in pod (outside ambient capture, as Istio's gateways are) with a plaintext HTTP
// listener on gateway.Port whose route splits requests over the entry service's
// versions and carries each to its pod over HBONE, with the gateway's own certificate,
// as Istio's gateways do toward ambient workloads. Every response names the gateway in
// gateway.HopHeader.
func BuildIngressGateway(app *topology.App, entry string, pod topology.Pod, identity func(topology.Pod) string, f WaypointFiles) (*bootstrapv3.Bootstrap, error) {
	s := app.Service(entry)
	if s == nil {
		return nil, fmt.Errorf("%s ingress gateway: the app has no entry service %q", Name, entry)
	}
	h := &hbone{files: f, identity: identity}
	action := h.route(*s)
	name := fmt.Sprintf("0.0.0.0_%d", gateway.Port)
	front := &listenerv3.Listener{
		Name:    name,
		Address: socketAddr("0.0.0.0", gateway.Port),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{hcm(&hcmv3.HttpConnectionManager{
			StatPrefix:        "outbound_" + name,
			CodecType:         hcmv3.HttpConnectionManager_AUTO,
			StreamIdleTimeout: durationpb.New(0),
			UseRemoteAddress:  wrapperspb.Bool(true), // callers come from outside the mesh
			RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
				Name: fmt.Sprintf("http.%d", gateway.Port),
				VirtualHosts: []*routev3.VirtualHost{{
					Name: fmt.Sprintf("*:%d", gateway.Port), Domains: []string{"*"},
					Routes: []*routev3.Route{{
						Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
						Action: &routev3.Route_Route{Route: action},
					}},
					ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: gateway.HopHeader, Value: pod.Name}}},
				}},
			}},
		})}}},
	}
	node := &corev3.Node{Id: fmt.Sprintf("router~%s~%s.%s~%s.svc.cluster.local", pod.IP, pod.Name, app.Namespace, app.Namespace), Cluster: gateway.Service + "." + app.Namespace}
	return h.bootstrap(node, gateway.AdminPort, front), nil
}

// MarshalWaypoint renders the bootstrap as JSON.
func MarshalWaypoint(b *bootstrapv3.Bootstrap) ([]byte, error) {
	return protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(b)
}

func hcm(h *hcmv3.HttpConnectionManager) *listenerv3.Filter {
	h.HttpFilters = []*hcmv3.HttpFilter{{
		Name:       "envoy.filters.http.router",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
	}}
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(h)}}
}

// internalCluster balances over Envoy internal listeners.
func internalCluster(name string, listenerNames []string) *clusterv3.Cluster {
	var eps []*endpointv3.LbEndpoint
	for _, l := range listenerNames {
		eps = append(eps, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_EnvoyInternalAddress{EnvoyInternalAddress: &corev3.EnvoyInternalAddress{
				AddressNameSpecifier: &corev3.EnvoyInternalAddress_ServerListenerName{ServerListenerName: l},
			}}},
		}}})
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LoadAssignment:       &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}},
	}
}

func fileSource(path string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}}
}

func tlsSocket(ctx proto.Message) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
}

func socketAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

// l7Cluster makes the waypoint speak to the pod in the protocol the caller used
// (HTTP/1.1, or HTTP/2 for h2c and gRPC services), instead of Envoy's HTTP/1.1 default.
func l7Cluster(c *clusterv3.Cluster) *clusterv3.Cluster {
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpoptsv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpoptsv3.HttpProtocolOptions_UseDownstreamProtocolConfig{UseDownstreamProtocolConfig: &httpoptsv3.HttpProtocolOptions_UseDownstreamHttpConfig{
				HttpProtocolOptions:  &corev3.Http1ProtocolOptions{},
				Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
			}},
		}),
	}
	return c
}
