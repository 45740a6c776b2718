package ambient

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"slices"
	"strconv"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshmark/meshmark/internal/mesh/ambient/workloadapi/security"
	"github.com/meshmark/meshmark/internal/mesh/policyfile"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// The xDS types ztunnel subscribes to (ztunnel src/xds/types.rs).
const (
	addressType       = "type.googleapis.com/istio.workload.Address"
	authorizationType = "type.googleapis.com/istio.security.Authorization"
)

// PolicyFile is the file in the control plane's directory the profile writes the
// authorization policies to (policyfile: the control plane marks a version applied
// once every ztunnel has acknowledged it).
const PolicyFile = "authorization.json"

// policyDoc is PolicyFile's content: a version and the policies as protojson.
type policyDoc struct {
	Version  int64             `json:"version"`
	Policies []json.RawMessage `json:"policies"`
}

// xdsServer is the part of istiod's xDS meshmark serves: the Authorization resources
// pushed to every ztunnel over delta ADS, so that a policy applied while the mesh runs
// reaches the proxies the way istiod sends it, without restarting them. Workloads and
// services come from ztunnel's local config file (which ztunnel reads once at start:
// they do not change during a study), so the Address type is answered empty.
type xdsServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	token string

	mu       sync.Mutex
	version  int64
	policies map[string]*anypb.Any // by resource name, namespace/name
	changed  chan struct{}         // closed and replaced on every change
	acked    map[int]int64         // per open stream that subscribed to Authorization: version acknowledged
	nextID   int
}

func newXDSServer(token string) *xdsServer {
	return &xdsServer{token: token, policies: map[string]*anypb.Any{}, changed: make(chan struct{}), acked: map[int]int64{}}
}

// set replaces every policy and returns once the change is visible to the streams.
func (s *xdsServer) set(version int64, policies []*security.Authorization) error {
	next := map[string]*anypb.Any{}
	for _, p := range policies {
		a, err := anypb.New(p)
		if err != nil {
			return err
		}
		next[p.GetNamespace()+"/"+p.GetName()] = a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version, s.policies = version, next
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// allAcked reports whether every open Authorization stream acknowledged version, and
// there is at least one (a ztunnel is ready only once it holds the policies, so every
// ready one has a stream).
func (s *xdsServer) allAcked(version int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.acked) == 0 {
		return false
	}
	for _, v := range s.acked {
		if v < version {
			return false
		}
	}
	return true
}

func (s *xdsServer) snapshot() (int64, map[string]*anypb.Any, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, s.policies, s.changed
}

// DeltaAggregatedResources serves one ztunnel: the full set of each type it subscribes
// to, then, for Authorization, every change as a delta (updated resources and the names
// removed). A NACK is logged; the version is then not counted as applied.
func (s *xdsServer) DeltaAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	if err := checkBearer(stream.Context(), s.token, "meshmark xDS"); err != nil {
		return err
	}
	requests := make(chan *discoveryv3.DeltaDiscoveryRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case requests <- req:
			case <-stream.Context().Done():
				return
			}
		}
	}()

	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.acked, id)
		s.mu.Unlock()
	}()

	var (
		nonce        int
		subscribed   bool            // to Authorization
		sent         map[string]bool // Authorization names the client holds
		sentVersion  int64
		nonceVersion = map[string]int64{}
	)
	send := func(typeURL string, version int64, res []*discoveryv3.Resource, removed []string) error {
		nonce++
		n := strconv.Itoa(nonce)
		if typeURL == authorizationType {
			nonceVersion[n] = version
		}
		return stream.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, SystemVersionInfo: strconv.FormatInt(version, 10),
			Resources: res, RemovedResources: removed, Nonce: n})
	}
	pushPolicies := func() error {
		version, policies, _ := s.snapshot()
		var res []*discoveryv3.Resource
		names := make([]string, 0, len(policies))
		for name := range policies {
			names = append(names, name)
		}
		slices.Sort(names)
		next := map[string]bool{}
		for _, name := range names {
			next[name] = true
			res = append(res, &discoveryv3.Resource{Name: name, Version: strconv.FormatInt(version, 10), Resource: policies[name]})
		}
		var removed []string
		for name := range sent {
			if !next[name] {
				removed = append(removed, name)
			}
		}
		slices.Sort(removed)
		sent, sentVersion = next, version
		return send(authorizationType, version, res, removed)
	}

	for {
		version, _, changed := s.snapshot()
		if subscribed && version != sentVersion {
			if err := pushPolicies(); err != nil {
				return err
			}
		}
		select {
		case err := <-recvErr:
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case <-stream.Context().Done():
			return nil
		case <-changed:
		case req := <-requests:
			if req.GetResponseNonce() != "" {
				v, ours := nonceVersion[req.GetResponseNonce()]
				delete(nonceVersion, req.GetResponseNonce())
				if req.GetErrorDetail() != nil {
					log.Printf("xds: %s rejected %s (nonce %s): %s", req.GetNode().GetId(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
				} else if ours {
					s.mu.Lock()
					if v > s.acked[id] {
						s.acked[id] = v
					}
					s.mu.Unlock()
				}
				continue
			}
			switch req.GetTypeUrl() {
			case authorizationType:
				if !subscribed {
					subscribed = true
					s.mu.Lock()
					s.acked[id] = -1
					s.mu.Unlock()
				}
				if err := pushPolicies(); err != nil {
					return err
				}
			case addressType:
				// the local config carries every workload and service
				if err := send(addressType, 0, nil, nil); err != nil {
					return err
				}
			default:
				log.Printf("xds: %s asked for %s, which meshmark does not serve", req.GetNode().GetId(), req.GetTypeUrl())
				if err := send(req.GetTypeUrl(), 0, nil, nil); err != nil {
					return err
				}
			}
		}
	}
}

// watchPolicies follows the policy file (policyfile.Follow): each new version goes to
// every ztunnel's stream, and is marked applied once each has acknowledged it.
func (s *xdsServer) watchPolicies(ctx context.Context, path string) {
	policyfile.Follow(ctx, path, func(b []byte, version int64) error {
		var doc policyDoc
		if err := json.Unmarshal(b, &doc); err != nil {
			return err
		}
		policies := make([]*security.Authorization, 0, len(doc.Policies))
		for i, raw := range doc.Policies {
			var p security.Authorization
			if err := protojson.Unmarshal(raw, &p); err != nil {
				return fmt.Errorf("policy %d: %w", i, err)
			}
			policies = append(policies, &p)
		}
		if err := s.set(version, policies); err != nil {
			return err
		}
		log.Printf("policy: version %d, %d authorization policies", version, len(policies))
		return nil
	}, s.allAcked)
}
