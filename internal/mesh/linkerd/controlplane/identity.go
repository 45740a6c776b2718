package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"log"
	"time"

	pbidentity "github.com/linkerd/linkerd2-proxy-api/go/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/meshmark/meshmark/internal/pki"
)

// Token is the bearer token a pod's proxy presents for identity: an HMAC of the identity
// under the control plane's key. It stands in for the Kubernetes service-account token
// Linkerd's identity controller reviews: only whoever wrote the pod's files knows it.
func Token(key []byte, identity string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(identity))
	return []byte(hex.EncodeToString(m.Sum(nil)))
}

type identityServer struct {
	pbidentity.UnimplementedIdentityServer
	ca       *pki.CA
	key      []byte
	validity time.Duration
	known    map[string]bool
}

// Certify signs a proxy's CSR when its token proves the identity it asks for.
func (s *identityServer) Certify(_ context.Context, req *pbidentity.CertifyRequest) (*pbidentity.CertifyResponse, error) {
	id := req.GetIdentity()
	if !s.known[id] {
		log.Printf("identity: refused %q: not a workload of this app", id)
		return nil, status.Errorf(codes.FailedPrecondition, "unknown identity %q", id)
	}
	if !hmac.Equal(req.GetToken(), Token(s.key, id)) {
		log.Printf("identity: refused %q: bad token", id)
		return nil, status.Errorf(codes.InvalidArgument, "token does not authenticate %q", id)
	}
	leaf, notAfter, err := s.ca.SignCSRForDNS(req.GetCertificateSigningRequest(), id, "", s.validity)
	if err != nil {
		log.Printf("identity: refused %q: %v", id, err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	log.Printf("identity: issued %s until %s", id, notAfter.UTC().Format(time.RFC3339))
	return &pbidentity.CertifyResponse{
		LeafCertificate: leaf,
		// meshmark's root signs leaves directly: no intermediate.
		ValidUntil: timestamppb.New(notAfter),
	}, nil
}
