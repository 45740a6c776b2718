package envoysidecar

import (
	"fmt"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbacfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	streamlogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	origdstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/topology"
)

// Istio's sidecar port conventions.
const (
	OutboundPort = 15001
	InboundPort  = 15006
	AdminPort    = 15000
	// InboundPassthroughSource is the address the sidecar dials the local app from. The
	// interception rules return traffic from it on lo untouched; without it the proxy's
	// own connection to the pod IP would be redirected back into the inbound listener.
	InboundPassthroughSource = "127.0.0.6"
)

// Cluster names follow Istio's so configs read alike.
const (
	PassthroughCluster        = "PassthroughCluster"
	InboundPassthroughCluster = "InboundPassthroughCluster"
)

// CertPaths are where the sidecar reads its workload certificate, key and trusted root.
type CertPaths struct {
	CA, Cert, Key string
}

// layout places the listeners. The production layout is Istio's; tests without network
// namespaces move listeners onto spare loopback addresses and bind the per-port
// outbound listeners, because nothing redirects to 15001 there.
type layout struct {
	outboundAddr string
	outboundPort uint32
	inboundAddr  string
	inboundPort  uint32
	adminAddr    string
	adminPort    uint32
	// bindVirtualAt, when set, binds the per-port outbound listeners on this address
	// instead of leaving them as original-destination targets.
	bindVirtualAt string
	// appAddr, when set, is where the inbound side reaches the local app instead of
	// the pod IP (tests put the app and the inbound listener on different addresses).
	appAddr string
	// outboundOnly leaves out the inbound side: a proxy that carries other pods'
	// outgoing traffic (a per-node proxy) serves no app of its own.
	outboundOnly bool
	// ingress makes the proxy an ingress gateway: callers come from outside the mesh,
	// so it trusts none of their forwarding headers (use_remote_address).
	ingress bool
}

var istioLayout = layout{
	outboundAddr: "0.0.0.0", outboundPort: OutboundPort,
	inboundAddr: "0.0.0.0", inboundPort: InboundPort,
	adminAddr: "127.0.0.1", adminPort: AdminPort,
}

// Resources are the xDS resources of one sidecar. Routes are inline in the listeners'
// connection managers, so an xDS server can serve Listeners over LDS and Clusters over
// CDS unchanged; the static bootstrap embeds the same values.
type Resources struct {
	Listeners []*listenerv3.Listener
	Clusters  []*clusterv3.Cluster
}

// generator builds the resources of one pod's sidecar.
type generator struct {
	app   *topology.App
	pod   topology.Pod
	opts  mesh.Options
	mode  mesh.MTLSMode
	certs CertPaths
	lay   layout
	// allow, when not nil, restricts the inbound side to callers presenting one of
	// these identities (Istio's ALLOW AuthorizationPolicy, as an RBAC filter).
	allow []string
}

// BuildResources generates the sidecar resources for pod in app under options (mode
// already resolved).
func BuildResources(app *topology.App, pod topology.Pod, opts mesh.Options, mode mesh.MTLSMode, certs CertPaths) (Resources, error) {
	return generator{app: app, pod: pod, opts: opts, mode: mode, certs: certs, lay: istioLayout}.resources()
}

// BuildBootstrap generates the complete static bootstrap for pod's sidecar.
func BuildBootstrap(app *topology.App, pod topology.Pod, opts mesh.Options, mode mesh.MTLSMode, certs CertPaths) (*bootstrapv3.Bootstrap, error) {
	return BuildBootstrapAllowing(app, pod, opts, mode, certs, nil)
}

// BuildBootstrapAllowing is BuildBootstrap with an authorization policy on the
// inbound side: only callers whose mTLS identity is in allow get through (nil: no
// policy). What Istio makes of an ALLOW AuthorizationPolicy with principals: an RBAC
// filter before the router, whose denial is 403 "RBAC: access denied".
func BuildBootstrapAllowing(app *topology.App, pod topology.Pod, opts mesh.Options, mode mesh.MTLSMode, certs CertPaths, allow []string) (*bootstrapv3.Bootstrap, error) {
	return generator{app: app, pod: pod, opts: opts, mode: mode, certs: certs, lay: istioLayout, allow: allow}.bootstrap()
}

// BuildOutboundBootstrap generates the outbound half of a sidecar for a proxy that
// carries the outgoing traffic of other pods (a per-node proxy running in node's
// namespace): the 15001 original-destination listener, one Host-routed listener per
// service port with the weighted splits, and the service clusters, without mTLS and
// without an inbound side. With telemetry off it still keeps every cluster's
// upstream_rq_total, the per-service count the node proxy is checked by.
func BuildOutboundBootstrap(app *topology.App, node topology.Pod, opts mesh.Options) (*bootstrapv3.Bootstrap, error) {
	lay := istioLayout
	lay.outboundOnly = true
	return generator{app: app, pod: node, opts: opts, mode: mesh.MTLSOff, lay: lay}.bootstrap()
}

// MarshalBootstrap renders a bootstrap as the JSON Envoy reads with -c.
func MarshalBootstrap(b *bootstrapv3.Bootstrap) ([]byte, error) {
	return protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(b)
}

func (g generator) bootstrap() (*bootstrapv3.Bootstrap, error) {
	res, err := g.resources()
	if err != nil {
		return nil, err
	}
	return g.wrap(res), nil
}

// wrap puts resources into a static bootstrap with the node, admin and stats settings
// of the proxy g generates for.
func (g generator) wrap(res Resources) *bootstrapv3.Bootstrap {
	kind := "sidecar"
	if g.lay.outboundOnly {
		kind = "router"
	}
	b := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{
			Id:      fmt.Sprintf("%s~%s~%s.%s~%s.svc.cluster.local", kind, g.pod.IP, g.pod.Name, g.app.Namespace, g.app.Namespace),
			Cluster: strings.TrimPrefix(g.pod.Service+"."+g.app.Namespace, "."),
		},
		Admin: &bootstrapv3.Admin{Address: socketAddr(g.lay.adminAddr, g.lay.adminPort)},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: res.Listeners,
			Clusters:  res.Clusters,
		},
	}
	if !g.opts.Telemetry {
		// Keep only what the enrollment check and liveness need; everything else is
		// the telemetry cost being switched off.
		keep := []*matcherv3.StringMatcher{
			{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "server."}},
			{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{
				Regex: `^http\.(inbound|outbound)_.*\.downstream_rq_total$`}}},
			{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{
				Regex: `^listener\..*\.ssl\.(handshake|connection_error|fail_verify_no_cert)$`}}},
			{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{
				Regex: `^cluster\.inbound\|[0-9]+\|\|\.upstream_rq_completed$|^cluster\.outbound\|.*\.upstream_rq_retry$`}}},
		}
		if g.lay.outboundOnly {
			keep = append(keep, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{
				Regex: `^cluster\.outbound\|.*\.upstream_rq_total$`}}})
		}
		b.StatsConfig = &metricsv3.StatsConfig{StatsMatcher: &metricsv3.StatsMatcher{
			StatsMatcher: &metricsv3.StatsMatcher_InclusionList{InclusionList: &matcherv3.ListStringMatcher{
				Patterns: keep,
			}},
		}}
	}
	return b
}

func (g generator) resources() (Resources, error) {
	if err := g.validate(); err != nil {
		return Resources{}, err
	}
	var res Resources
	res.Clusters = append(res.Clusters, g.passthroughClusters()...)

	// Outbound: one cluster per service and one per version, then one virtual
	// listener per port whose route table is keyed by Host.
	byPort := map[int][]topology.Service{}
	for _, s := range g.app.Services {
		byPort[s.Port] = append(byPort[s.Port], s)
		res.Clusters = append(res.Clusters, g.outboundCluster(s, "", allEndpoints(s)))
		if len(s.Versions) > 1 {
			for _, v := range s.Versions {
				res.Clusters = append(res.Clusters, g.outboundCluster(s, v.Name, v.Endpoints))
			}
		}
	}
	ports := make([]int, 0, len(byPort))
	for p := range byPort {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	res.Listeners = append(res.Listeners, g.virtualOutbound())
	for _, p := range ports {
		l, err := g.outboundPortListener(p, byPort[p])
		if err != nil {
			return Resources{}, err
		}
		res.Listeners = append(res.Listeners, l)
	}

	if g.lay.outboundOnly {
		return res, nil
	}
	// Inbound: the pod's own port, if it serves one.
	in, inClusters := g.virtualInbound()
	res.Listeners = append(res.Listeners, in)
	res.Clusters = append(res.Clusters, inClusters...)
	return res, nil
}

func (g generator) validate() error {
	if g.app == nil {
		return fmt.Errorf("envoy-sidecar: no app")
	}
	if g.mode != mesh.MTLSOff && (g.certs.CA == "" || g.certs.Cert == "" || g.certs.Key == "") {
		return fmt.Errorf("envoy-sidecar: mtls %s needs certificate paths for pod %s", g.mode, g.pod.Name)
	}
	seen := map[string]string{}
	for _, s := range g.app.Services {
		if s.Port <= 0 || s.Port > 65535 {
			return fmt.Errorf("envoy-sidecar: service %s: port %d out of range", s.Name, s.Port)
		}
		for _, d := range serviceDomains(g.app.Namespace, s) {
			if other, dup := seen[d]; dup {
				return fmt.Errorf("envoy-sidecar: services %s and %s both answer to %q", other, s.Name, d)
			}
			seen[d] = s.Name
		}
		for _, v := range s.Versions {
			if v.Weight < 0 {
				return fmt.Errorf("envoy-sidecar: service %s version %s: negative weight %d", s.Name, v.Name, v.Weight)
			}
			for _, ep := range v.Endpoints {
				if !ep.IP.IsValid() || ep.Port <= 0 || ep.Port > 65535 {
					return fmt.Errorf("envoy-sidecar: service %s pod %s: bad endpoint %s:%d", s.Name, ep.Name, ep.IP, ep.Port)
				}
			}
		}
	}
	return nil
}

// ClusterName is Istio's outbound cluster naming: outbound|port|subset|fqdn.
func ClusterName(ns string, s topology.Service, version string) string {
	return fmt.Sprintf("outbound|%d|%s|%s", s.Port, version, fqdn(ns, s.Name))
}

func fqdn(ns, svc string) string { return svc + "." + ns + ".svc.cluster.local" }

// serviceDomains are the Host header values that reach a service, as Istio lists them.
func serviceDomains(ns string, s topology.Service) []string {
	names := []string{s.Name, s.Name + "." + ns, s.Name + "." + ns + ".svc", fqdn(ns, s.Name)}
	if s.VIP.IsValid() {
		names = append(names, s.VIP.String())
	}
	var out []string
	for _, n := range names {
		out = append(out, n, fmt.Sprintf("%s:%d", n, s.Port))
	}
	return out
}

func allEndpoints(s topology.Service) []topology.Pod {
	var out []topology.Pod
	for _, v := range s.Versions {
		out = append(out, v.Endpoints...)
	}
	return out
}

func (g generator) outboundCluster(s topology.Service, version string, eps []topology.Pod) *clusterv3.Cluster {
	name := ClusterName(g.app.Namespace, s, version)
	var lbEndpoints []*endpointv3.LbEndpoint
	for _, ep := range eps {
		lbEndpoints = append(lbEndpoints, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddr(ep.IP.String(), uint32(ep.Port)),
			}},
		})
	}
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbEndpoints}},
		},
		CircuitBreakers: g.circuitBreakers(),
	}
	c.TypedExtensionProtocolOptions = upstreamProtocol(s.Protocol)
	// Istio's auto-mTLS: inside the mesh, send mTLS whenever the mesh has it at all.
	if g.mode != mesh.MTLSOff && !g.plaintextService(s.Name) && len(eps) > 0 {
		want := eps[0].Identity
		if want == "" {
			want = topology.SPIFFEID(g.opts.TrustDomain, g.app.Namespace, s.Name)
		}
		c.TransportSocket = tlsSocket(&tlsv3.UpstreamTlsContext{
			CommonTlsContext: g.commonTLS(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: want}}),
			Sni:              "outbound_." + fmt.Sprint(s.Port) + "_." + version + "_." + fqdn(g.app.Namespace, s.Name),
		})
	}
	return c
}

// upstreamProtocol makes a cluster speak HTTP/2 to services that expect it (gRPC
// included); HTTP/1.1 is Envoy's default and needs nothing.
func upstreamProtocol(protocol string) map[string]*anypb.Any {
	if protocol != "http2" && protocol != "grpc" {
		return nil
	}
	return map[string]*anypb.Any{
		"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpoptsv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpoptsv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
			}},
		}),
	}
}

func (g generator) circuitBreakers() *clusterv3.CircuitBreakers {
	if g.opts.CircuitBreakers == mesh.CircuitBreakersProxyDefault {
		return nil
	}
	unlimited := wrapperspb.UInt32(math.MaxUint32)
	return &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
		Priority:           corev3.RoutingPriority_DEFAULT,
		MaxConnections:     unlimited,
		MaxPendingRequests: unlimited,
		MaxRequests:        unlimited,
		MaxRetries:         unlimited,
	}}}
}

// commonTLS is the workload certificate plus validation against the mesh root, with
// the peer's SPIFFE ID checked by san.
func (g generator) commonTLS(san *matcherv3.StringMatcher) *tlsv3.CommonTlsContext {
	return &tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2},
		TlsCertificates: []*tlsv3.TlsCertificate{{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: g.certs.Cert}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: g.certs.Key}},
		}},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: g.certs.CA}},
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
				SanType: tlsv3.SubjectAltNameMatcher_URI,
				Matcher: san,
			}},
		}},
	}
}

func (g generator) passthroughClusters() []*clusterv3.Cluster {
	return []*clusterv3.Cluster{
		{
			Name:                 PassthroughCluster,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
			ConnectTimeout:       durationpb.New(10 * time.Second),
			LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
			CircuitBreakers:      g.circuitBreakers(),
		},
		{
			Name:                 InboundPassthroughCluster,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
			ConnectTimeout:       durationpb.New(10 * time.Second),
			LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
			CircuitBreakers:      g.circuitBreakers(),
			UpstreamBindConfig:   &corev3.BindConfig{SourceAddress: socketAddr(InboundPassthroughSource, 0).GetSocketAddress()},
		},
	}
}

// virtualOutbound is the 15001 listener every outbound connection is redirected to; it
// hands each connection to the listener for its original destination port, or passes
// it through untouched.
func (g generator) virtualOutbound() *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:             "virtualOutbound",
		Address:          socketAddr(g.lay.outboundAddr, g.lay.outboundPort),
		UseOriginalDst:   wrapperspb.Bool(true),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		ListenerFilters:  []*listenerv3.ListenerFilter{originalDst()},
		DefaultFilterChain: &listenerv3.FilterChain{
			Name:    "PassthroughFilterChain",
			Filters: []*listenerv3.Filter{tcpProxy(PassthroughCluster, PassthroughCluster)},
		},
	}
}

func (g generator) outboundPortListener(port int, services []topology.Service) (*listenerv3.Listener, error) {
	addr, bind := "0.0.0.0", false
	if g.lay.bindVirtualAt != "" {
		addr, bind = g.lay.bindVirtualAt, true
	}
	rc := &routev3.RouteConfiguration{Name: fmt.Sprint(port), ValidateClusters: wrapperspb.Bool(false)}
	for _, s := range services {
		r, err := g.serviceRoute(s)
		if err != nil {
			return nil, err
		}
		rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
			Name:    fmt.Sprintf("%s:%d", fqdn(g.app.Namespace, s.Name), port),
			Domains: serviceDomains(g.app.Namespace, s),
			Routes:  []*routev3.Route{r},
		})
	}
	// Unknown hosts on a mesh port go where the caller dialled, like Istio's allow_any.
	rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
		Name:    "allow_any",
		Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Name:   "allow_any",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: PassthroughCluster}, Timeout: durationpb.New(0)}},
		}},
	})
	name := fmt.Sprintf("0.0.0.0_%d", port)
	return &listenerv3.Listener{
		Name:             name,
		Address:          socketAddr(addr, uint32(port)),
		BindToPort:       wrapperspb.Bool(bind),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{g.hcm("outbound_"+name, rc, false)},
		}},
	}, nil
}

// serviceRoute sends a service's traffic to its versions by weight (Istio
// VirtualService weights), or to all its pods when no split is configured.
func (g generator) serviceRoute(s topology.Service) (*routev3.Route, error) {
	action := &routev3.RouteAction{
		Timeout: durationpb.New(0), // Istio disables the route timeout by default
		RetryPolicy: &routev3.RetryPolicy{ // Istio's default retry policy; dropped below when off
			RetryOn:              "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
			NumRetries:           wrapperspb.UInt32(2),
			RetriableStatusCodes: []uint32{503},
			RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
				Name:       "envoy.retry_host_predicates.previous_hosts",
				ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: mustAny(&previoushostsv3.PreviousHostsPredicate{})},
			}},
			HostSelectionRetryMaxAttempts: 5,
		},
	}
	if !g.opts.Retries {
		action.RetryPolicy = nil
	}
	var weighted []*routev3.WeightedCluster_ClusterWeight
	if len(s.Versions) > 1 {
		for _, v := range s.Versions {
			if v.Weight > 0 {
				weighted = append(weighted, &routev3.WeightedCluster_ClusterWeight{
					Name:   ClusterName(g.app.Namespace, s, v.Name),
					Weight: wrapperspb.UInt32(uint32(v.Weight)),
				})
			}
		}
	}
	switch {
	case len(weighted) > 1:
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: weighted}}
	case len(weighted) == 1:
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: weighted[0].Name}
	default:
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: ClusterName(g.app.Namespace, s, "")}
	}
	return &routev3.Route{
		Name:   "default",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: action},
	}, nil
}

// virtualInbound is the 15006 listener inbound connections are redirected to. Under
// permissive mTLS it serves TLS and plaintext on the app port (told apart by
// tls_inspector); under strict only TLS with a client certificate from the mesh CA.
// Connections to the pod's other ports (every inbound port is captured, as in Istio)
// pass through to the app, mTLS terminated first when they carry it; under strict a
// plaintext one is refused, as STRICT applies to every port of the workload.
func (g generator) virtualInbound() (*listenerv3.Listener, []*clusterv3.Cluster) {
	l := &listenerv3.Listener{
		Name:    "virtualInbound",
		Address: socketAddr(g.lay.inboundAddr, g.lay.inboundPort),
		// No use_original_dst here: handing inbound connections to the listener for
		// their original destination would give them to the outbound 0.0.0.0_<port>
		// listener and loop. The original_dst filter only restores the address so the
		// filter chains can match on the destination port.
		TrafficDirection: corev3.TrafficDirection_INBOUND,
		ListenerFilters:  []*listenerv3.ListenerFilter{originalDst()},
		DefaultFilterChain: &listenerv3.FilterChain{
			Name:    "InboundPassthroughFilterChain",
			Filters: []*listenerv3.Filter{tcpProxy(InboundPassthroughCluster, InboundPassthroughCluster)},
		},
	}
	mode := g.inboundMode()
	if mode != mesh.MTLSOff {
		l.ListenerFilters = append(l.ListenerFilters, &listenerv3.ListenerFilter{
			Name:       "envoy.filters.listener.tls_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspectorv3.TlsInspector{})},
		})
	}
	if mode != mesh.MTLSOff {
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:             "virtualInbound-catchall-tls",
			FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "tls"},
			Filters:          []*listenerv3.Filter{tcpProxy(InboundPassthroughCluster, InboundPassthroughCluster)},
			TransportSocket: tlsSocket(&tlsv3.DownstreamTlsContext{
				CommonTlsContext: g.commonTLS(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
					Prefix: "spiffe://" + g.opts.TrustDomain + "/"}}),
				RequireClientCertificate: wrapperspb.Bool(true),
			}),
		})
	}
	if mode == mesh.MTLSStrict {
		l.DefaultFilterChain = &listenerv3.FilterChain{
			Name:    "virtualInbound-blackhole",
			Filters: []*listenerv3.Filter{tcpProxy("refused_plaintext", "BlackHoleCluster")},
		}
	}
	if g.pod.Port <= 0 {
		if mode == mesh.MTLSStrict {
			return l, []*clusterv3.Cluster{blackHole()}
		}
		return l, nil
	}
	port := uint32(g.pod.Port)
	clusterName := fmt.Sprintf("inbound|%d||", port)
	appAddr := g.pod.IP.String()
	if g.lay.appAddr != "" {
		appAddr = g.lay.appAddr
	}
	local := &clusterv3.Cluster{
		Name:                 clusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		CircuitBreakers:      g.circuitBreakers(),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: clusterName,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: socketAddr(appAddr, port),
				}},
			}}}},
		},
		UpstreamBindConfig: &corev3.BindConfig{SourceAddress: socketAddr(InboundPassthroughSource, 0).GetSocketAddress()},
	}
	if own := g.app.Service(g.pod.Service); own != nil {
		local.TypedExtensionProtocolOptions = upstreamProtocol(own.Protocol)
	}
	route := func() *routev3.RouteConfiguration {
		return &routev3.RouteConfiguration{
			Name:             clusterName,
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound|http|" + fmt.Sprint(port),
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Name:   "default",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: clusterName}, Timeout: durationpb.New(0)}},
				}},
			}},
		}
	}
	prefix := fmt.Sprintf("inbound_0.0.0.0_%d", port)
	if mode != mesh.MTLSOff {
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:             fmt.Sprintf("0.0.0.0_%d_mtls", port),
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port), TransportProtocol: "tls"},
			Filters:          []*listenerv3.Filter{g.hcm(prefix+"_mtls", route(), true)},
			TransportSocket: tlsSocket(&tlsv3.DownstreamTlsContext{
				CommonTlsContext: g.commonTLS(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{
					Prefix: "spiffe://" + g.opts.TrustDomain + "/"}}),
				RequireClientCertificate: wrapperspb.Bool(true),
			}),
		})
	}
	if mode != mesh.MTLSStrict {
		match := &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port)}
		if mode == mesh.MTLSPermissive {
			match.TransportProtocol = "raw_buffer"
		}
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:             fmt.Sprintf("0.0.0.0_%d_plaintext", port),
			FilterChainMatch: match,
			Filters:          []*listenerv3.Filter{g.hcm(prefix+"_plaintext", route(), true)},
		})
	} else {
		// Strict: a plaintext connection to the app port must not fall through to the
		// passthrough default chain, so it gets a chain that closes it.
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name:             fmt.Sprintf("0.0.0.0_%d_refuse_plaintext", port),
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port), TransportProtocol: "raw_buffer"},
			Filters:          []*listenerv3.Filter{tcpProxy("refused_plaintext", "BlackHoleCluster")},
		})
	}
	return l, []*clusterv3.Cluster{local, blackHole()}
}

// blackHole has no endpoints, so a connection sent there is closed at once.
func blackHole() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 "BlackHoleCluster",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(10 * time.Second),
	}
}

func (g generator) hcm(statPrefix string, rc *routev3.RouteConfiguration, inbound bool) *listenerv3.Filter {
	m := &hcmv3.HttpConnectionManager{
		StatPrefix:                   statPrefix,
		CodecType:                    hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier:               &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc},
		GenerateRequestId:            wrapperspb.Bool(g.opts.RequestID),
		UseRemoteAddress:             wrapperspb.Bool(g.lay.ingress),
		NormalizePath:                wrapperspb.Bool(true),
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_KEEP_UNCHANGED,
		UpgradeConfigs:               []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}},
		StreamIdleTimeout:            durationpb.New(0),
		HttpFilters: []*hcmv3.HttpFilter{{
			Name: "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{
				DynamicStats: wrapperspb.Bool(g.opts.Telemetry),
			})},
		}},
	}
	if inbound && g.allow != nil {
		m.HttpFilters = append([]*hcmv3.HttpFilter{g.rbacFilter()}, m.HttpFilters...)
	}
	if inbound && g.inboundMode() != mesh.MTLSOff {
		// As Istio: tell the app who called, from the verified client certificate.
		m.ForwardClientCertDetails = hcmv3.HttpConnectionManager_APPEND_FORWARD
		m.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
			Subject: wrapperspb.Bool(true), Dns: true, Uri: true,
		}
	}
	if g.opts.AccessLog {
		m.AccessLog = []*accesslogv3.AccessLog{{
			Name:       "envoy.access_loggers.stdout",
			ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: mustAny(&streamlogv3.StdoutAccessLog{})},
		}}
	}
	return &listenerv3.Filter{
		Name:       "envoy.filters.network.http_connection_manager",
		ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(m)},
	}
}

// plaintextService says whether the study exempts service from mTLS
// (PlaintextServicesOption): as a DestinationRule with tls mode DISABLE for its host,
// callers' sidecars send it plaintext.
func (g generator) plaintextService(service string) bool {
	if service == gateway.Service {
		// The mesh's ingress gateway has no sidecar, so auto-mTLS sends it plaintext,
		// as Istio does to a pod without its tlsMode label.
		return true
	}
	list, _ := g.opts.OwnStrings(PlaintextServicesOption) // checked by New
	return service != "" && slices.Contains(list, service)
}

// inboundMode is the pod's own inbound mTLS mode: the mesh's, or off for a service the
// study exempts (as a PeerAuthentication with mode DISABLE selecting its workloads).
func (g generator) inboundMode() mesh.MTLSMode {
	if g.plaintextService(g.pod.Service) {
		return mesh.MTLSOff
	}
	return g.mode
}

// rbacFilter allows the identities in g.allow and denies everyone else, including
// callers with no certificate at all.
func (g generator) rbacFilter() *hcmv3.HttpFilter {
	var principals []*rbacv3.Principal
	for _, id := range g.allow {
		principals = append(principals, &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{
			PrincipalName: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}},
		}}})
	}
	policies := map[string]*rbacv3.Policy{}
	if len(principals) > 0 {
		policies["meshmark-allowed-callers"] = &rbacv3.Policy{
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
			Principals:  principals,
		}
	}
	return &hcmv3.HttpFilter{
		Name: "envoy.filters.http.rbac",
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbacfilterv3.RBAC{
			Rules: &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW, Policies: policies},
		})},
	}
}

func tcpProxy(statPrefix, cluster string) *listenerv3.Filter {
	return &listenerv3.Filter{
		Name: "envoy.filters.network.tcp_proxy",
		ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxyv3.TcpProxy{
			StatPrefix:       statPrefix,
			ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: cluster},
		})},
	}
}

func originalDst() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{
		Name:       "envoy.filters.listener.original_dst",
		ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&origdstv3.OriginalDst{})},
	}
}

func tlsSocket(ctx proto.Message) *corev3.TransportSocket {
	return &corev3.TransportSocket{
		Name:       "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)},
	}
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
