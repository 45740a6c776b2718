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

// BuildWaypoint renders the waypoint bootstrap for app.
// Its upstream connections leave from ownIP, the address ztunnel knows it by.
func BuildWaypoint(app *topology.App, trustDomain string, ownIP netip.Addr, identity func(topology.Pod) string, f WaypointFiles) (*bootstrapv3.Bootstrap, error) {
	tlsCommon := func(san *matcherv3.StringMatcher, alpn ...string) *tlsv3.CommonTlsContext {
		return &tlsv3.CommonTlsContext{
			// ztunnel speaks TLS 1.3 only (HBONE); Envoy's client default tops at 1.2.
			TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_3, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3},
			TlsCertificates: []*tlsv3.TlsCertificate{{
				CertificateChain: fileSource(f.Cert),
				PrivateKey:       fileSource(f.Key),
			}},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa:                 fileSource(f.CA),
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: tlsv3.SubjectAltNameMatcher_URI, Matcher: san}},
			}},
			AlpnProtocols: alpn,
		}
	}
	var listeners []*listenerv3.Listener
	var clusters []*clusterv3.Cluster
	var connectRoutes []*routev3.Route
	originated := map[string]bool{}

	for _, s := range app.Services {
		if !s.VIP.IsValid() || s.Port == 0 {
			return nil, fmt.Errorf("service %s has no VIP or port", s.Name)
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
		clusters = append(clusters, internalCluster(mainName, []string{mainName}))

		// The L7 split, per request.
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
				name := fmt.Sprintf("connect_originate|%s", pod.IP)
				eps = append(eps, name)
				all = append(all, name)
				if originated[name] {
					continue
				}
				originated[name] = true
				hbone := fmt.Sprintf("hbone|%s", pod.IP)
				listeners = append(listeners, &listenerv3.Listener{
					Name:              name,
					ListenerSpecifier: &listenerv3.Listener_InternalListener{InternalListener: &listenerv3.Listener_InternalListenerConfig{}},
					FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
						Name: "envoy.filters.network.tcp_proxy",
						ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
							StatPrefix:       name,
							ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: hbone},
							TunnelingConfig:  &tcpproxyv3.TcpProxy_TunnelingConfig{Hostname: fmt.Sprintf("%s:%d", pod.IP, pod.Port)},
						})},
					}}}},
				})
				c := &clusterv3.Cluster{
					Name:                 hbone,
					ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
					ConnectTimeout:       durationpb.New(10 * time.Second),
					UpstreamBindConfig:   &corev3.BindConfig{SourceAddress: &corev3.SocketAddress{Address: ownIP.String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}},
					LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: hbone, Endpoints: []*endpointv3.LocalityLbEndpoints{{
						LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
							Address: socketAddr(pod.IP.String(), HBONEPort)}}}},
					}}},
					TransportSocket: tlsSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: tlsCommon(
						&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: identity(pod)}}, "h2")}),
					TypedExtensionProtocolOptions: map[string]*anypb.Any{
						"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpoptsv3.HttpProtocolOptions{
							UpstreamProtocolOptions: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig{
								ProtocolConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
							}},
						}),
					},
				}
				clusters = append(clusters, c)
			}
			if split && v.Weight > 0 {
				cname := s.Name + "|" + v.Name
				clusters = append(clusters, l7Cluster(internalCluster(cname, eps)))
				weighted = append(weighted, &routev3.WeightedCluster_ClusterWeight{Name: cname, Weight: wrapperspb.UInt32(uint32(v.Weight))})
			}
		}
		action := &routev3.RouteAction{Timeout: durationpb.New(0)}
		if len(weighted) > 0 {
			action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: weighted}}
		} else {
			clusters = append(clusters, l7Cluster(internalCluster(s.Name, all)))
			action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: s.Name}
		}
		listeners = append(listeners, &listenerv3.Listener{
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

	listeners = append([]*listenerv3.Listener{{
		Name:    "connect_terminate",
		Address: socketAddr("0.0.0.0", HBONEPort),
		FilterChains: []*listenerv3.FilterChain{{
			TransportSocket: tlsSocket(&tlsv3.DownstreamTlsContext{
				RequireClientCertificate: wrapperspb.Bool(true),
				CommonTlsContext: tlsCommon(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
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
	}}, listeners...)
	sort.SliceStable(clusters, func(i, j int) bool { return clusters[i].Name < clusters[j].Name })

	return &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: "waypoint~" + app.Namespace, Cluster: "waypoint." + app.Namespace},
		Admin: &bootstrapv3.Admin{Address: socketAddr("127.0.0.1", WaypointAdminPort)},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: listeners,
			Clusters:  clusters,
		},
		BootstrapExtensions: []*corev3.TypedExtensionConfig{{
			Name:        "envoy.bootstrap.internal_listener",
			TypedConfig: mustAny(&internallistenerv3.InternalListener{}),
		}},
	}, nil
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
