package ambient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
)

// requestCertificate asks the control plane for id's certificate the way Istio's
// waypoint agent does: a CSR over the CA service, authenticated with the token.
func requestCertificate(ctx context.Context, sub substrate.Substrate, from topology.Pod, caAddr string, root []byte, token, id string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(id)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(root) {
		return nil, nil, errors.New("control plane root is not PEM")
	}
	conn, err := grpc.NewClient("passthrough:///"+caAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: caHostname})),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return sub.DialContext(ctx, from, "tcp", addr)
		}))
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	md, err := structpb.NewStruct(map[string]any{impersonationKey: id})
	if err != nil {
		return nil, nil, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "clusterid", clusterID)
	resp, err := securityapi.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &securityapi.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})), ValidityDuration: 24 * 3600, Metadata: md,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("certificate for %s: %w", id, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return []byte(strings.Join(resp.CertChain, "")), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// proxyCertificate asks the CA for id's certificate from pod, as a proxy's agent does,
// and writes it, its key (for the proxy uid alone) and the root under dir in the pod.
func proxyCertificate(ctx context.Context, sub substrate.Substrate, pod topology.Pod, dir string, ca caAccess, id string) (WaypointFiles, error) {
	var files WaypointFiles
	certPEM, keyPEM, err := requestCertificate(ctx, sub, pod, ca.addr, ca.root, ca.token, id)
	if err != nil {
		return files, err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode uint32
		dst  *string
	}{{"root-cert.pem", ca.root, 0o644, &files.CA}, {"cert-chain.pem", certPEM, 0o644, &files.Cert}, {"key.pem", keyPEM, 0o600, &files.Key}} {
		path, err := sub.WriteFile(pod, dir+"/"+f.name, f.data, f.mode)
		if err != nil {
			return files, err
		}
		*f.dst = path
	}
	return files, nil
}

// startWaypoint runs the namespace's waypoint Envoy in the given node's namespace, with
// a certificate for the waypoint identity from the control plane.
func (p *Profile) startWaypoint(ctx context.Context, sub substrate.Substrate, app *topology.App, at topology.Pod, caAddr string, root []byte, token string) error {
	envoy, err := prereq.Envoy()
	if err != nil {
		return err
	}
	id := topology.SPIFFEID(p.opts.TrustDomain, app.Namespace, WaypointServiceAccount)
	files, err := proxyCertificate(ctx, sub, at, "waypoint", caAccess{addr: caAddr, root: root, token: token}, id)
	if err != nil {
		return err
	}
	b, err := BuildWaypoint(app, p.opts.TrustDomain, at.IP, func(pod topology.Pod) string { return p.Identity(app, pod) }, files)
	if err != nil {
		return err
	}
	js, err := MarshalWaypoint(b)
	if err != nil {
		return err
	}
	cfg, err := sub.WriteFile(at, "waypoint/envoy.json", js, 0o644)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs["waypoint/envoy.json"] = js
	p.mu.Unlock()
	admin := fmt.Sprintf("127.0.0.1:%d", WaypointAdminPort)
	proc, err := sub.Start(ctx, at, substrate.ProcessSpec{
		Name: "waypoint",
		Role: substrate.RoleGateway,
		Argv: []string{envoy, "-c", cfg, "--concurrency", fmt.Sprint(p.opts.Concurrency),
			"--disable-hot-restart", "--base-id", fmt.Sprint(20000 + mrand.IntN(10000)),
			"--drain-time-s", "1", "--log-level", "warning"},
		UID: substrate.ProxyUID,
		Ready: func(ctx context.Context) error {
			r, err := mesh.ProbeHTTP(ctx, sub, at, admin, "", "/ready")
			if err != nil {
				return err
			}
			if r.Status != 200 {
				return fmt.Errorf("waypoint /ready: HTTP %d", r.Status)
			}
			return nil
		},
	})
	if err != nil {
		return fmt.Errorf("start waypoint: %w", err)
	}
	p.mu.Lock()
	p.waypoint = &waypointProxy{pod: at, proc: proc}
	p.mu.Unlock()
	return nil
}
