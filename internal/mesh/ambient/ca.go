package ambient

import (
	"bufio"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/meshmark/meshmark/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"
)

// ControlPlaneCommand is the hidden meshmark subcommand that runs the CA and xDS as its
// own process, so the resource sampler sees the control plane's CPU and memory under
// the control-plane role instead of folding them into meshmark itself.
const ControlPlaneCommand = "ambient-controlplane"

// The profile starts the control plane by re-executing its own binary with
// ControlPlaneCommand as the first argument. Dispatching here, at package init, makes
// that work in every binary that links the profile: meshmark itself and the test
// binaries of every package that runs studies (the runner's, the CLI's), none of
// which take such an argument otherwise.
func init() {
	if len(os.Args) > 1 && os.Args[1] == ControlPlaneCommand {
		os.Exit(ControlPlaneMain(os.Args[2:]))
	}
}

// Files the control plane writes into its directory.
const (
	RootCertFile = "root-cert.pem" // the mesh root, for CA_ROOT_CA and verifiers
	IssuedFile   = "issued.log"    // one line per signed certificate: SPIFFE ID
)

// impersonationKey is the metadata field a shared-mode ztunnel sets on a certificate
// request to ask for a workload's identity instead of its own (caclient.rs).
const impersonationKey = "ImpersonatedIdentity"

// CAServer is Istio's IstioCertificateService backed by meshmark's CA. A caller proves
// it is a node proxy meshmark started with the bearer token meshmark gave it, and may
// then ask for any identity meshmark enrolled, as istiod lets a ztunnel impersonate the
// workloads on its node; anything else is refused.
type CAServer struct {
	securityapi.UnimplementedIstioCertificateServiceServer
	CA      *pki.CA
	Token   string
	Allowed map[string]bool
	// Issued, when set, receives one line per signed certificate.
	Issued io.Writer

	mu sync.Mutex
}

// CreateCertificate signs the CSR for the requested identity.
func (s *CAServer) CreateCertificate(ctx context.Context, req *securityapi.IstioCertificateRequest) (*securityapi.IstioCertificateResponse, error) {
	if err := checkBearer(ctx, s.Token, "meshmark CA"); err != nil {
		return nil, err
	}
	id := ""
	if m := req.GetMetadata(); m != nil {
		id = m.GetFields()[impersonationKey].GetStringValue()
	}
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "meshmark CA: request names no identity (metadata "+impersonationKey+")")
	}
	if !s.Allowed[id] {
		return nil, status.Errorf(codes.PermissionDenied, "meshmark CA: %s is not an identity meshmark enrolled", id)
	}
	block, _ := pem.Decode([]byte(req.GetCsr()))
	if block == nil {
		return nil, status.Error(codes.InvalidArgument, "meshmark CA: CSR is not PEM")
	}
	validity := time.Duration(req.GetValidityDuration()) * time.Second
	cert, _, err := s.CA.SignCSR(block.Bytes, id, validity)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.Issued != nil {
		s.mu.Lock()
		fmt.Fprintln(s.Issued, id)
		s.mu.Unlock()
	}
	return &securityapi.IstioCertificateResponse{CertChain: []string{string(cert), string(s.CA.CertPEM())}}, nil
}

// checkBearer admits a call carrying the bearer token meshmark gave its node proxies,
// as istiod checks a ztunnel's token on its CA and xDS services alike.
func checkBearer(ctx context.Context, token, service string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	tok, ok := strings.CutPrefix(strings.Join(md.Get("authorization"), ""), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(token)) != 1 {
		return status.Error(codes.Unauthenticated, service+": missing or wrong bearer token")
	}
	return nil
}

// ControlPlaneConfig is what the control-plane process needs.
type ControlPlaneConfig struct {
	Dir         string // writes RootCertFile and IssuedFile here
	TrustDomain string
	Listen      string   // e.g. 198.18.0.1:15012
	Hostnames   []string // DNS names in the serving certificate
	TokenFile   string
	Identities  []string
	// PolicyFile, when set, is watched for authorization policies to push to the
	// ztunnels over xDS (xds.go).
	PolicyFile string
}

// ServeControlPlane creates the CA, writes its root, and serves until ctx ends.
func ServeControlPlane(ctx context.Context, cfg ControlPlaneConfig) error {
	ca, err := pki.NewCA(cfg.TrustDomain, 0)
	if err != nil {
		return err
	}
	tok, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", cfg.Listen, err)
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = append(ips, ip)
	}
	serving, err := ca.IssueServer(cfg.Hostnames, ips, 0)
	if err != nil {
		return err
	}
	tc, err := serving.TLSCertificate()
	if err != nil {
		return err
	}
	issued, err := os.OpenFile(filepath.Join(cfg.Dir, IssuedFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer issued.Close()
	allowed := map[string]bool{}
	for _, id := range cfg.Identities {
		allowed[id] = true
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{tc}, MinVersion: tls.VersionTLS12})))
	securityapi.RegisterIstioCertificateServiceServer(srv, &CAServer{CA: ca, Token: strings.TrimSpace(string(tok)), Allowed: allowed, Issued: issued})
	xds := newXDSServer(strings.TrimSpace(string(tok)))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xds)
	if cfg.PolicyFile != "" {
		go xds.watchPolicies(ctx, cfg.PolicyFile)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	// The root goes out only once the port listens: its presence is the readiness signal,
	// so it appears whole, by a rename (written in place, a reader that saw it exist
	// could read it empty: "control plane root is not PEM", seen once in CI).
	root := filepath.Join(cfg.Dir, RootCertFile)
	if err := os.WriteFile(root+".tmp", ca.CertPEM(), 0o644); err != nil {
		ln.Close()
		return err
	}
	if err := os.Rename(root+".tmp", root); err != nil {
		ln.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ControlPlaneMain is the entry point of `meshmark ambient-controlplane`; it returns the
// exit code.
func ControlPlaneMain(args []string) int {
	fs := flag.NewFlagSet(ControlPlaneCommand, flag.ContinueOnError)
	var cfg ControlPlaneConfig
	var hosts, ids string
	fs.StringVar(&cfg.Dir, "dir", "", "directory for the root certificate and the issue log")
	fs.StringVar(&cfg.TrustDomain, "trust-domain", "cluster.local", "SPIFFE trust domain")
	fs.StringVar(&cfg.Listen, "listen", "", "address:port to serve the CA on")
	fs.StringVar(&hosts, "hostnames", caHostname, "comma-separated DNS names of the serving certificate")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the bearer token callers must present")
	fs.StringVar(&ids, "identities", "", "file of SPIFFE IDs that may be issued, one per line")
	fs.StringVar(&cfg.PolicyFile, "policy-file", "", "file of authorization policies to push to the ztunnels over xDS")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Dir == "" || cfg.Listen == "" || cfg.TokenFile == "" || ids == "" {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+": --dir, --listen, --token-file and --identities are required")
		return 2
	}
	cfg.Hostnames = strings.Split(hosts, ",")
	f, err := os.Open(ids)
	if err != nil {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+":", err)
		return 1
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			cfg.Identities = append(cfg.Identities, l)
		}
	}
	f.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := ServeControlPlane(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+":", err)
		return 1
	}
	return 0
}
