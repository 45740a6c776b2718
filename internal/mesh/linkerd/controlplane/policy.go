package controlplane

import (
	"log"
	"net/netip"
	"time"

	"context"
	pbinbound "github.com/linkerd/linkerd2-proxy-api/go/inbound"
	pbmeta "github.com/linkerd/linkerd2-proxy-api/go/meta"
	pboutbound "github.com/linkerd/linkerd2-proxy-api/go/outbound"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// detectTimeout is Linkerd's protocol-detection timeout.
const detectTimeout = 10 * time.Second

type inboundServer struct {
	pbinbound.UnimplementedInboundServerPoliciesServer
	cfg *Config
}

// server is the inbound policy of every port: protocol detection, default routes (the
// proxy adds a catch-all route when none is given) and the authorizations.
func (s *inboundServer) server() *pbinbound.Server {
	everywhere := []*pbinbound.Network{
		{Net: ipNet(netip.MustParsePrefix("0.0.0.0/0"))},
		{Net: ipNet(netip.MustParsePrefix("::/0"))},
	}
	name, authn := "all-unauthenticated", &pbinbound.Authn{Permit: &pbinbound.Authn_Unauthenticated{Unauthenticated: &pbinbound.Authn_PermitUnauthenticated{}}}
	switch {
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
	return s.server(), nil
}

func (s *inboundServer) WatchPort(req *pbinbound.PortSpec, stream pbinbound.InboundServerPolicies_WatchPortServer) error {
	log.Printf("policy: WatchPort %s:%d", req.GetWorkload(), req.GetPort())
	if err := stream.Send(s.server()); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// outboundServer answers NotFound for every target, as Linkerd's policy controller does
// for an address it knows no Service for; the proxy then routes by the service profile
// (destination GetProfile), which carries the split.
type outboundServer struct {
	pboutbound.UnimplementedOutboundPoliciesServer
}

func (outboundServer) Get(context.Context, *pboutbound.TrafficSpec) (*pboutbound.OutboundPolicy, error) {
	return nil, status.Error(codes.NotFound, "meshmark routes by service profile")
}

func (outboundServer) Watch(*pboutbound.TrafficSpec, pboutbound.OutboundPolicies_WatchServer) error {
	return status.Error(codes.NotFound, "meshmark routes by service profile")
}
