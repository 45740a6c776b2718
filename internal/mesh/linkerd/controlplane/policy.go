package controlplane

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"log"
	"net"
	"net/netip"
	"strconv"
	"time"

	pbhttproute "github.com/linkerd/linkerd2-proxy-api/go/http_route"
	pbinbound "github.com/linkerd/linkerd2-proxy-api/go/inbound"
	pbmeta "github.com/linkerd/linkerd2-proxy-api/go/meta"
	pbnet "github.com/linkerd/linkerd2-proxy-api/go/net"
	pboutbound "github.com/linkerd/linkerd2-proxy-api/go/outbound"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// detectTimeout is Linkerd's protocol-detection timeout.
const detectTimeout = 10 * time.Second

type inboundServer struct {
	pbinbound.UnimplementedInboundServerPoliciesServer
	cfg    *Config
	policy *policyStore
}

// server is the inbound policy of a pod's ports: protocol detection, default routes
// (the proxy adds a catch-all route when none is given) and the authorizations: the
// running AuthzPolicy's for a pod it names, else the default.
func (s *inboundServer) server(pod string) *pbinbound.Server {
	everywhere := []*pbinbound.Network{
		{Net: ipNet(netip.MustParsePrefix("0.0.0.0/0"))},
		{Net: ipNet(netip.MustParsePrefix("::/0"))},
	}
	name, authn := "all-unauthenticated", &pbinbound.Authn{Permit: &pbinbound.Authn_Unauthenticated{Unauthenticated: &pbinbound.Authn_PermitUnauthenticated{}}}
	var running []string
	restricted := false
	if s.policy != nil {
		p, _ := s.policy.snapshot()
		running, restricted = p.Pods[pod]
	}
	switch {
	case restricted:
		ids := make([]*pbinbound.Identity, len(running))
		for i, id := range running {
			ids[i] = &pbinbound.Identity{Name: id}
		}
		name = "meshmark-authz-policy"
		authn = &pbinbound.Authn{Permit: &pbinbound.Authn_MeshTLS{MeshTLS: &pbinbound.Authn_PermitMeshTLS{
			Clients: &pbinbound.Authn_PermitMeshTLS_Identities{Identities: &pbinbound.Authn_PermitMeshTLS_PermitClientIdentities{Identities: ids}},
		}}}
	case len(s.cfg.Authz) > 0:
		ids := make([]*pbinbound.Identity, len(s.cfg.Authz))
		for i, id := range s.cfg.Authz {
			ids[i] = &pbinbound.Identity{Name: id}
		}
		name = "meshmark-authz"
		authn = &pbinbound.Authn{Permit: &pbinbound.Authn_MeshTLS{MeshTLS: &pbinbound.Authn_PermitMeshTLS{
			Clients: &pbinbound.Authn_PermitMeshTLS_Identities{Identities: &pbinbound.Authn_PermitMeshTLS_PermitClientIdentities{Identities: ids}},
		}}}
	case s.cfg.Strict:
		// Linkerd's all-authenticated: any client with a mesh identity (the empty
		// suffix matches every name).
		name = "all-authenticated"
		authn = &pbinbound.Authn{Permit: &pbinbound.Authn_MeshTLS{MeshTLS: &pbinbound.Authn_PermitMeshTLS{
			Clients: &pbinbound.Authn_PermitMeshTLS_Identities{Identities: &pbinbound.Authn_PermitMeshTLS_PermitClientIdentities{
				Suffixes: []*pbinbound.IdentitySuffix{{Parts: nil}},
			}},
		}}}
	}
	meta := &pbmeta.Metadata{Kind: &pbmeta.Metadata_Default{Default: name}}
	return &pbinbound.Server{
		Protocol: &pbinbound.ProxyProtocol{Kind: &pbinbound.ProxyProtocol_Detect_{Detect: &pbinbound.ProxyProtocol_Detect{
			Timeout: durationpb.New(detectTimeout),
		}}},
		Authorizations: []*pbinbound.Authz{{Networks: everywhere, Authentication: authn, Metadata: meta}},
		Labels:         map[string]string{"group": "", "kind": "default", "name": name},
	}
}

func (s *inboundServer) GetPort(_ context.Context, req *pbinbound.PortSpec) (*pbinbound.Server, error) {
	return s.server(workloadPod(req.GetWorkload())), nil
}

// WatchPort sends the port's policy, and again whenever the running AuthzPolicy
// changes, until the proxy goes away.
func (s *inboundServer) WatchPort(req *pbinbound.PortSpec, stream pbinbound.InboundServerPolicies_WatchPortServer) error {
	log.Printf("policy: WatchPort %s:%d", req.GetWorkload(), req.GetPort())
	pod := workloadPod(req.GetWorkload())
	if s.policy == nil {
		if err := stream.Send(s.server(pod)); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	id := s.policy.register()
	defer s.policy.unregister(id)
	for {
		p, changed := s.policy.snapshot()
		if err := stream.Send(s.server(pod)); err != nil {
			return err
		}
		s.policy.sent(id, p.Version)
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// workloadPod reads the pod name out of the workload a proxy names in its policy
// requests (LINKERD2_PROXY_POLICY_WORKLOAD: {"ns":..., "pod":...}).
func workloadPod(workload string) string {
	var w struct {
		Pod string `json:"pod"`
	}
	if json.Unmarshal([]byte(workload), &w) == nil && w.Pod != "" {
		return w.Pod
	}
	return workload
}

// outboundServer serves Linkerd's outbound policy for a service address: protocol
// detection, and for HTTP/1, HTTP/2 and opaque traffic one route to the service's
// endpoints, split by version weight where the service has a split, with the backend
// queue and load balancer Linkerd's policy controller configures. Any other address
// is NotFound, as for Linkerd an address outside every Service: the proxy forwards it.
// Where a service profile has dst_overrides (GetProfile), the proxy routes by those;
// both carry the same split.
type outboundServer struct {
	pboutbound.UnimplementedOutboundPoliciesServer
	cfg *Config
}

// Values of Linkerd's policy controller.
const (
	queueCapacity   = 100
	failfastTimeout = 3 * time.Second
	ewmaDefaultRTT  = 30 * time.Millisecond
	ewmaDecay       = 10 * time.Second
)

func (s *outboundServer) policy(spec *pboutbound.TrafficSpec) (*pboutbound.OutboundPolicy, error) {
	addr := spec.GetAddr()
	if addr == nil {
		return nil, status.Error(codes.NotFound, "only address targets are served")
	}
	ip := netipOf(addr.GetIp())
	var svc *Service
	for i := range s.cfg.Services {
		c := &s.cfg.Services[i]
		if c.VIP != "" && c.VIP == ip && c.Port == int(addr.GetPort()) {
			svc = c
		}
	}
	if svc == nil {
		return nil, status.Errorf(codes.NotFound, "%s:%d is not a service address", ip, addr.GetPort())
	}
	resource := func(name string) *pbmeta.Metadata {
		return &pbmeta.Metadata{Kind: &pbmeta.Metadata_Resource{Resource: &pbmeta.Resource{
			Group: "core", Kind: "Service", Name: name, Namespace: s.cfg.Namespace, Port: uint32(svc.Port),
		}}}
	}
	backend := func(name string) *pboutbound.Backend {
		return &pboutbound.Backend{
			Metadata: resource(name),
			Kind: &pboutbound.Backend_Balancer{Balancer: &pboutbound.Backend_BalanceP2C{
				Discovery: &pboutbound.Backend_EndpointDiscovery{Kind: &pboutbound.Backend_EndpointDiscovery_Dst{
					Dst: &pboutbound.Backend_EndpointDiscovery_DestinationGet{Path: net.JoinHostPort(s.cfg.Authority(name), strconv.Itoa(svc.Port))},
				}},
				Load: &pboutbound.Backend_BalanceP2C_PeakEwma_{PeakEwma: &pboutbound.Backend_BalanceP2C_PeakEwma{
					DefaultRtt: durationpb.New(ewmaDefaultRTT), Decay: durationpb.New(ewmaDecay),
				}},
			}},
			Queue: &pboutbound.Queue{Capacity: queueCapacity, FailfastTimeout: durationpb.New(failfastTimeout)},
		}
	}
	// The split: version backends by weight, or the whole service.
	type weighted struct {
		name   string
		weight uint32
	}
	var backends []weighted
	if len(svc.Versions) > 1 {
		for _, v := range svc.Versions {
			if v.Weight > 0 {
				backends = append(backends, weighted{svc.Name + "-" + v.Name, uint32(v.Weight)})
			}
		}
	}
	if len(backends) == 0 {
		backends = []weighted{{svc.Name, 1}}
	}
	httpDist := &pboutbound.HttpRoute_Distribution{}
	opaqDist := &pboutbound.OpaqueRoute_Distribution{}
	if len(backends) == 1 {
		httpDist.Kind = &pboutbound.HttpRoute_Distribution_FirstAvailable_{FirstAvailable: &pboutbound.HttpRoute_Distribution_FirstAvailable{
			Backends: []*pboutbound.HttpRoute_RouteBackend{{Backend: backend(backends[0].name)}},
		}}
		opaqDist.Kind = &pboutbound.OpaqueRoute_Distribution_FirstAvailable_{FirstAvailable: &pboutbound.OpaqueRoute_Distribution_FirstAvailable{
			Backends: []*pboutbound.OpaqueRoute_RouteBackend{{Backend: backend(backends[0].name)}},
		}}
	} else {
		var hb []*pboutbound.HttpRoute_WeightedRouteBackend
		var ob []*pboutbound.OpaqueRoute_WeightedRouteBackend
		for _, b := range backends {
			hb = append(hb, &pboutbound.HttpRoute_WeightedRouteBackend{Backend: &pboutbound.HttpRoute_RouteBackend{Backend: backend(b.name)}, Weight: b.weight})
			ob = append(ob, &pboutbound.OpaqueRoute_WeightedRouteBackend{Backend: &pboutbound.OpaqueRoute_RouteBackend{Backend: backend(b.name)}, Weight: b.weight})
		}
		httpDist.Kind = &pboutbound.HttpRoute_Distribution_RandomAvailable_{RandomAvailable: &pboutbound.HttpRoute_Distribution_RandomAvailable{Backends: hb}}
		opaqDist.Kind = &pboutbound.OpaqueRoute_Distribution_RandomAvailable_{RandomAvailable: &pboutbound.OpaqueRoute_Distribution_RandomAvailable{Backends: ob}}
	}
	httpRoutes := []*pboutbound.HttpRoute{{
		Metadata: &pbmeta.Metadata{Kind: &pbmeta.Metadata_Default{Default: "http"}},
		Rules: []*pboutbound.HttpRoute_Rule{{
			Matches:  []*pbhttproute.HttpRouteMatch{{Path: &pbhttproute.PathMatch{Kind: &pbhttproute.PathMatch_Prefix{Prefix: "/"}}}},
			Backends: httpDist,
		}},
	}}
	return &pboutbound.OutboundPolicy{
		Metadata: resource(svc.Name),
		Protocol: &pboutbound.ProxyProtocol{Kind: &pboutbound.ProxyProtocol_Detect_{Detect: &pboutbound.ProxyProtocol_Detect{
			Timeout: durationpb.New(detectTimeout),
			Opaque: &pboutbound.ProxyProtocol_Opaque{Routes: []*pboutbound.OpaqueRoute{{
				Metadata: &pbmeta.Metadata{Kind: &pbmeta.Metadata_Default{Default: "opaq"}},
				Rules:    []*pboutbound.OpaqueRoute_Rule{{Backends: opaqDist}},
			}}},
			Http1: &pboutbound.ProxyProtocol_Http1{Routes: httpRoutes},
			Http2: &pboutbound.ProxyProtocol_Http2{Routes: httpRoutes},
		}}},
	}, nil
}

func (s *outboundServer) Get(_ context.Context, spec *pboutbound.TrafficSpec) (*pboutbound.OutboundPolicy, error) {
	return s.policy(spec)
}

func (s *outboundServer) Watch(spec *pboutbound.TrafficSpec, stream pboutbound.OutboundPolicies_WatchServer) error {
	pol, err := s.policy(spec)
	if err != nil {
		log.Printf("policy: outbound Watch: %v", err)
		return err
	}
	log.Printf("policy: outbound Watch %s:%d", netipOf(spec.GetAddr().GetIp()), spec.GetAddr().GetPort())
	if err := stream.Send(pol); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// netipOf renders a proto address as text ("" when unset).
func netipOf(a *pbnet.IPAddress) string {
	switch {
	case a == nil:
		return ""
	case a.GetIpv6() != nil:
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], a.GetIpv6().GetFirst())
		binary.BigEndian.PutUint64(b[8:], a.GetIpv6().GetLast())
		return netip.AddrFrom16(b).String()
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a.GetIpv4())
	return netip.AddrFrom4(b).String()
}
