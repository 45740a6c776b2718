package controlplane

import (
	"encoding/binary"

	"log"
	"net"
	"net/netip"
	"strconv"
	"strings"

	pbdest "github.com/linkerd/linkerd2-proxy-api/go/destination"
	pbnet "github.com/linkerd/linkerd2-proxy-api/go/net"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endpointWeight is the weight of every endpoint within one address set (Linkerd's
// destination controller uses 10000 for all).
const endpointWeight = 10000

type destinationServer struct {
	pbdest.UnimplementedDestinationServer
	cfg *Config
}

// lookup finds what a destination path names: "<authority>:<port>" of a service or
// of one version ("<svc>-<version>"), or "<ip>:<port>" of a VIP or a pod.
type target struct {
	svc     *Service
	version *Version  // set when the path names one version
	pod     *Endpoint // set when the path is a pod address
}

func (s *destinationServer) lookup(path string) (target, bool) {
	host, portStr, err := net.SplitHostPort(path)
	if err != nil {
		return target{}, false
	}
	port, _ := strconv.Atoi(portStr)
	host = strings.TrimSuffix(host, ".")
	for i := range s.cfg.Services {
		svc := &s.cfg.Services[i]
		if svc.Port == port && (host == svc.VIP || host == s.cfg.Authority(svc.Name)) {
			return target{svc: svc}, true
		}
		for j := range svc.Versions {
			v := &svc.Versions[j]
			if svc.Port == port && host == s.cfg.Authority(svc.Name+"-"+v.Name) {
				return target{svc: svc, version: v}, true
			}
			for k := range v.Endpoints {
				e := &v.Endpoints[k]
				if host == e.IP && port == e.Port {
					return target{svc: svc, version: v, pod: e}, true
				}
			}
		}
	}
	return target{}, false
}

// Get streams the endpoints of a service or version, then holds the stream open.
func (s *destinationServer) Get(req *pbdest.GetDestination, stream pbdest.Destination_GetServer) error {
	t, ok := s.lookup(req.GetPath())
	if !ok || t.pod != nil {
		log.Printf("destination: Get %q: not a service", req.GetPath())
		return status.Errorf(codes.InvalidArgument, "%q is not a service of this mesh", req.GetPath())
	}
	var addrs []*pbdest.WeightedAddr
	for _, v := range t.svc.Versions {
		if t.version != nil && v.Name != t.version.Name {
			continue
		}
		for _, e := range v.Endpoints {
			addrs = append(addrs, weightedAddr(t.svc, v, e))
		}
	}
	log.Printf("destination: Get %q: %d endpoints", req.GetPath(), len(addrs))
	var up *pbdest.Update
	if len(addrs) == 0 {
		up = &pbdest.Update{Update: &pbdest.Update_NoEndpoints{NoEndpoints: &pbdest.NoEndpoints{Exists: true}}}
	} else {
		up = &pbdest.Update{Update: &pbdest.Update_Add{Add: &pbdest.WeightedAddrSet{
			Addrs:        addrs,
			MetricLabels: map[string]string{"namespace": s.cfg.Namespace, "service": t.svc.Name},
		}}}
	}
	if err := stream.Send(up); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func weightedAddr(svc *Service, v Version, e Endpoint) *pbdest.WeightedAddr {
	wa := &pbdest.WeightedAddr{
		Addr:         tcpAddr(e.IP, e.Port),
		Weight:       endpointWeight,
		MetricLabels: map[string]string{"pod": e.Pod, "version": v.Name},
	}
	if e.Identity != "" {
		wa.TlsIdentity = &pbdest.TlsIdentity{
			Strategy:   &pbdest.TlsIdentity_DnsLikeIdentity_{DnsLikeIdentity: &pbdest.TlsIdentity_DnsLikeIdentity{Name: e.Identity}},
			ServerName: &pbdest.TlsIdentity_DnsLikeIdentity{Name: e.Identity},
		}
		// Linkerd upgrades HTTP/1 between meshed proxies to HTTP/2.
		wa.ProtocolHint = &pbdest.ProtocolHint{Protocol: &pbdest.ProtocolHint_H2_{H2: &pbdest.ProtocolHint_H2{}}}
	}
	return wa
}

// GetProfile answers with the service's profile: its name and the version split as
// weighted dst_overrides. A pod address gets the pod as its endpoint; anything else an
// empty profile, which makes the proxy forward to the original destination.
func (s *destinationServer) GetProfile(req *pbdest.GetDestination, stream pbdest.Destination_GetProfileServer) error {
	prof := &pbdest.DestinationProfile{}
	t, ok := s.lookup(req.GetPath())
	switch {
	case !ok:
	case t.pod != nil:
		prof.Endpoint = weightedAddr(t.svc, *t.version, *t.pod)
	default:
		prof.FullyQualifiedName = s.cfg.Authority(t.svc.Name)
		prof.DstOverrides = s.overrides(t)
	}
	log.Printf("destination: GetProfile %q: %s %d overrides", req.GetPath(), prof.FullyQualifiedName, len(prof.DstOverrides))
	if err := stream.Send(prof); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// overrides routes a service to its versions by weight when it has a split, else to
// the whole service (an override is what makes the proxy balance over the service's
// endpoints with their identities rather than forward to the VIP).
func (s *destinationServer) overrides(t target) []*pbdest.WeightedDst {
	port := strconv.Itoa(t.svc.Port)
	if t.version == nil && len(t.svc.Versions) > 1 {
		var out []*pbdest.WeightedDst
		for _, v := range t.svc.Versions {
			if v.Weight > 0 {
				out = append(out, &pbdest.WeightedDst{
					Authority: net.JoinHostPort(s.cfg.Authority(t.svc.Name+"-"+v.Name), port),
					Weight:    uint32(v.Weight),
				})
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	name := t.svc.Name
	if t.version != nil {
		name += "-" + t.version.Name
	}
	return []*pbdest.WeightedDst{{Authority: net.JoinHostPort(s.cfg.Authority(name), port), Weight: 1}}
}

func tcpAddr(ip string, port int) *pbnet.TcpAddress {
	return &pbnet.TcpAddress{Ip: ipAddr(netip.MustParseAddr(ip)), Port: uint32(port)}
}

func ipAddr(a netip.Addr) *pbnet.IPAddress {
	if a.Is4() {
		b := a.As4()
		return &pbnet.IPAddress{Ip: &pbnet.IPAddress_Ipv4{Ipv4: binary.BigEndian.Uint32(b[:])}}
	}
	b := a.As16()
	return &pbnet.IPAddress{Ip: &pbnet.IPAddress_Ipv6{Ipv6: &pbnet.IPv6{
		First: binary.BigEndian.Uint64(b[:8]), Last: binary.BigEndian.Uint64(b[8:]),
	}}}
}

func ipNet(p netip.Prefix) *pbnet.IPNetwork {
	return &pbnet.IPNetwork{Ip: ipAddr(p.Addr()), PrefixLen: uint32(p.Bits())}
}
