package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	pbdest "github.com/linkerd/linkerd2-proxy-api/go/destination"
	pbidentity "github.com/linkerd/linkerd2-proxy-api/go/identity"
	pbinbound "github.com/linkerd/linkerd2-proxy-api/go/inbound"
	pboutbound "github.com/linkerd/linkerd2-proxy-api/go/outbound"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshmark/meshmark/internal/pki"
)

// Server is the control plane with its three listeners open.
type Server struct {
	servers    []namedServer
	policy     *policyStore
	policyFile string
}

type namedServer struct {
	name string
	ln   net.Listener
	srv  *grpc.Server
}

// Run serves the three APIs until ctx ends.
func Run(ctx context.Context, cfg *Config) error {
	s, err := Listen(cfg)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen loads the CA and opens the three listeners. Each API speaks TLS under the
// identity Linkerd gives that component, issued from the CA at start; destination and
// policy verify the client certificate of a proxy that presents one, as they sit
// behind Linkerd's own mTLS.
func Listen(cfg *Config) (*Server, error) {
	caCert, err := os.ReadFile(cfg.CACert)
	if err != nil {
		return nil, err
	}
	caKey, err := os.ReadFile(cfg.CAKey)
	if err != nil {
		return nil, err
	}
	ca, err := pki.LoadCA(caCert, caKey)
	if err != nil {
		return nil, err
	}
	tokenKey, err := os.ReadFile(cfg.TokenKey)
	if err != nil {
		return nil, err
	}
	validity := cfg.CertValidity.Duration
	if validity <= 0 {
		validity = 24 * time.Hour
	}
	known := map[string]bool{}
	for _, w := range cfg.Workloads {
		known[w.Identity] = true
	}

	identityTLS, err := serverTLS(ca, IdentityName(IdentityAccount, ControlNamespace, cfg.TrustDomain), tls.NoClientCert)
	if err != nil {
		return nil, err
	}
	destTLS, err := serverTLS(ca, IdentityName(DestinationAccount, ControlNamespace, cfg.TrustDomain), tls.VerifyClientCertIfGiven)
	if err != nil {
		return nil, err
	}

	idSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(identityTLS)))
	pbidentity.RegisterIdentityServer(idSrv, &identityServer{ca: ca, key: tokenKey, validity: validity, known: known})
	destSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(destTLS)))
	pbdest.RegisterDestinationServer(destSrv, &destinationServer{cfg: cfg})
	polSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(destTLS)))
	inbound := &inboundServer{cfg: cfg}
	if cfg.PolicyFile != "" {
		inbound.policy = newPolicyStore()
	}
	pbinbound.RegisterInboundServerPoliciesServer(polSrv, inbound)
	pboutbound.RegisterOutboundPoliciesServer(polSrv, &outboundServer{cfg: cfg})

	s := &Server{policy: inbound.policy, policyFile: cfg.PolicyFile}
	for _, c := range []struct {
		name, addr string
		srv        *grpc.Server
	}{{"identity", cfg.IdentityAddr, idSrv}, {"destination", cfg.DestinationAddr, destSrv}, {"policy", cfg.PolicyAddr, polSrv}} {
		ln, err := net.Listen("tcp", c.addr)
		if err != nil {
			for _, o := range s.servers {
				o.ln.Close()
			}
			return nil, fmt.Errorf("%s API: %w", c.name, err)
		}
		log.Printf("%s API on %s", c.name, c.addr)
		s.servers = append(s.servers, namedServer{c.name, ln, c.srv})
	}
	return s, nil
}

// Serve answers until ctx ends or a listener fails.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, len(s.servers))
	if s.policy != nil {
		go s.policy.watchFile(ctx, s.policyFile)
	}
	for _, ns := range s.servers {
		go func() { errc <- ns.srv.Serve(ns.ln) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, ns := range s.servers {
		ns.srv.Stop()
	}
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

func serverTLS(ca *pki.CA, name string, auth tls.ClientAuthType) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, _, err := ca.SignPublicKey(&key.PublicKey, []string{name}, "", 0)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth:   auth,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}, nil
}
