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

// Run serves the three APIs until ctx ends. Each listens with TLS under the identity
// Linkerd gives that component, issued from the CA at start; destination and policy
// verify the client certificate of a proxy that presents one, as they sit behind
// Linkerd's own mTLS.
func Run(ctx context.Context, cfg *Config) error {
	caCert, err := os.ReadFile(cfg.CACert)
	if err != nil {
		return err
	}
	caKey, err := os.ReadFile(cfg.CAKey)
	if err != nil {
		return err
	}
	ca, err := pki.LoadCA(caCert, caKey)
	if err != nil {
		return err
	}
	tokenKey, err := os.ReadFile(cfg.TokenKey)
	if err != nil {
		return err
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
		return err
	}
	destTLS, err := serverTLS(ca, IdentityName(DestinationAccount, ControlNamespace, cfg.TrustDomain), tls.VerifyClientCertIfGiven)
	if err != nil {
		return err
	}

	idSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(identityTLS)))
	pbidentity.RegisterIdentityServer(idSrv, &identityServer{ca: ca, key: tokenKey, validity: validity, known: known, cfg: cfg})
	destSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(destTLS)))
	pbdest.RegisterDestinationServer(destSrv, &destinationServer{cfg: cfg})
	polSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(destTLS)))
	pbinbound.RegisterInboundServerPoliciesServer(polSrv, &inboundServer{cfg: cfg})
	pboutbound.RegisterOutboundPoliciesServer(polSrv, outboundServer{})

	servers := []struct {
		name string
		addr string
		srv  *grpc.Server
	}{{"identity", cfg.IdentityAddr, idSrv}, {"destination", cfg.DestinationAddr, destSrv}, {"policy", cfg.PolicyAddr, polSrv}}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			for _, o := range servers {
				o.srv.Stop()
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
		log.Printf("%s API on %s", s.name, s.addr)
		go func() { errc <- s.srv.Serve(ln) }()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, s := range servers {
		s.srv.Stop()
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
