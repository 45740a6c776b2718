package ambient

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient/workloadapi/security"
	"github.com/meshmark/meshmark/internal/mesh/policyfile"
	"github.com/meshmark/meshmark/internal/topology"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The control plane's xDS as ztunnel uses it (delta ADS over TLS with the bearer
// token): both types answered on subscription, a new policy version pushed as a delta
// with the removed names, and the version marked applied only once every stream has
// acknowledged it. A real ztunnel enforcing what it is sent is in the security tests.
func TestControlPlaneServesAuthorizationOverXDS(t *testing.T) {
	dir := t.TempDir()
	policyPath := filepath.Join(dir, PolicyFile)
	conn := startControlPlane(t, dir, []string{"spiffe://cluster.local/ns/x/sa/y"}, policyPath)
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()

	bad, err := ads.DeltaAggregatedResources(metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer wrong"))
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("wrong token: %v, want Unauthenticated", err)
	}

	stream, err := ads.DeltaAggregatedResources(metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "ztunnel~198.18.0.1~ztunnel-n0.istio-system~istio-system.svc.cluster.local"}
	for _, typ := range []string{addressType, authorizationType} {
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typ, Node: node}); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ack := func(r *discoveryv3.DeltaDiscoveryResponse, nack string) {
		t.Helper()
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}
		if nack != "" {
			req.ErrorDetail = &rpcstatus.Status{Message: nack}
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		r := recv()
		if len(r.Resources) != 0 || r.Nonce == "" {
			t.Errorf("initial %s: %d resources, nonce %q; want none yet, with a nonce", r.TypeUrl, len(r.Resources), r.Nonce)
		}
		ack(r, "")
	}

	// A policy for two services, through the file as the profile writes it.
	app := &topology.App{Namespace: "bookinfo", Services: []topology.Service{
		{Name: "productpage", Versions: []topology.Version{{Name: "v1", Endpoints: []topology.Pod{{Name: "pp-0", Service: "productpage", IP: netip.MustParseAddr("198.18.1.2")}}}}},
		{Name: "reviews", Versions: []topology.Version{{Name: "v1", Endpoints: []topology.Pod{{Name: "rv1-0", Service: "reviews", IP: netip.MustParseAddr("198.18.1.3")}}}}},
		{Name: "details", Versions: []topology.Version{{Name: "v1", Endpoints: []topology.Pod{{Name: "dt-0", Service: "details", IP: netip.MustParseAddr("198.18.1.4")}}}}},
	}}
	p := &Profile{opts: mesh.Options{TrustDomain: "cluster.local"}}
	write := func(version int64, allowed map[string][]string) {
		t.Helper()
		pols, err := p.AuthorizationPolicies(app, allowed)
		if err != nil {
			t.Fatal(err)
		}
		doc := policyDoc{Version: version, Policies: []json.RawMessage{}}
		for _, pol := range pols {
			b, _ := protojson.Marshal(pol)
			doc.Policies = append(doc.Policies, b)
		}
		b, _ := json.Marshal(doc)
		if err := os.WriteFile(policyPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	applied := func() int64 {
		b, _ := os.ReadFile(policyPath + policyfile.AppliedSuffix)
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v
	}

	write(1, map[string][]string{"reviews": {"productpage"}, "details": {"productpage"}})
	r := recv()
	if r.TypeUrl != authorizationType || len(r.Resources) != 2 || len(r.RemovedResources) != 0 {
		t.Fatalf("push of version 1: %s, %d resources, removed %v", r.TypeUrl, len(r.Resources), r.RemovedResources)
	}
	var got security.Authorization
	if err := r.Resources[1].Resource.UnmarshalTo(&got); err != nil {
		t.Fatal(err)
	}
	want := &security.Authorization{Name: "meshmark-allow-reviews", Namespace: "bookinfo", Scope: security.Scope_NAMESPACE, Action: security.Action_DENY,
		Rules: []*security.Rule{{Clauses: []*security.Clause{{Matches: []*security.Match{{
			DestinationIps: []*security.Address{{Address: []byte{198, 18, 1, 3}, Length: 32}},
			NotPrincipals:  []*security.StringMatch{{MatchType: &security.StringMatch_Exact{Exact: "cluster.local/ns/bookinfo/sa/productpage"}}},
		}}}}}}}
	if r.Resources[1].Name != "bookinfo/meshmark-allow-reviews" || !proto.Equal(&got, want) {
		t.Errorf("pushed %s: %v\nwant %v", r.Resources[1].Name, &got, want)
	}
	time.Sleep(300 * time.Millisecond)
	if v := applied(); v != 0 {
		t.Fatalf("version %d marked applied before the stream acknowledged it", v)
	}
	ack(r, "")
	for deadline := time.Now().Add(3 * time.Second); applied() != 1 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	if v := applied(); v != 1 {
		t.Fatalf("applied %d after the ack, want 1", v)
	}

	// Version 2 drops details' policy: it goes out as a removed name. A NACK leaves it
	// unapplied.
	write(2, map[string][]string{"reviews": {}})
	r = recv()
	if len(r.Resources) != 1 || r.Resources[0].Name != "bookinfo/meshmark-allow-reviews" || len(r.RemovedResources) != 1 || r.RemovedResources[0] != "bookinfo/meshmark-allow-details" {
		t.Fatalf("push of version 2: %d resources, removed %v", len(r.Resources), r.RemovedResources)
	}
	if err := r.Resources[0].Resource.UnmarshalTo(&got); err != nil || len(got.Rules[0].Clauses[0].Matches[0].NotPrincipals) != 0 {
		t.Errorf("a service allowing nobody still admits %v (%v)", got.Rules[0].Clauses[0].Matches[0].NotPrincipals, err)
	}
	ack(r, "rejected for the test")
	time.Sleep(500 * time.Millisecond)
	if v := applied(); v != 1 {
		t.Errorf("a rejected version marked applied: %d", v)
	}
}
