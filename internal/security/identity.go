package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/topology"
)

// MaxCertLifetime is the longest a workload certificate may live and still count as
// short-lived: Istio and Linkerd issue for 24 hours; a little slack covers
// backdating.
const MaxCertLifetime = 24*time.Hour + 10*time.Minute

// probeIdentity opens a TLS handshake with every meshed pod's proxy the way a mesh
// peer would (server name, ALPN) and reads the certificate it presents: it must carry
// the pod's identity, be short-lived and chain to the mesh's root. The handshake is
// from a caller without a certificate, so a strict proxy ends it after showing its
// own certificate; that is all the probe needs.
func probeIdentity(ctx context.Context, tgt Target, p mesh.Posture) results.SecurityProbe {
	r := results.SecurityProbe{Probe: results.ProbeIdentity, Promised: "each proxy presents its workload's identity, short-lived, chained to the mesh root"}
	if p.Identity == nil {
		return notApplicable(r.Probe, "the profile issues no workload certificates with these options")
	}
	roots := p.Identity.TrustRoots()
	if roots == nil {
		return notApplicable(r.Probe, "the mesh has no root of trust yet")
	}
	from, where, ok := outsider(tgt, p)
	if !ok {
		return notApplicable(r.Probe, "no pod outside the mesh to call from")
	}
	for _, s := range meshedServices(tgt, p) {
		for _, pod := range servicePods(s) {
			ep, ok := p.Identity.IdentityEndpoint(tgt.App, pod)
			if !ok {
				continue
			}
			c := results.SecurityCheck{Target: fmt.Sprintf("pod %s (%s)", pod.Name, ep.Addr)}
			chain, err := peerChain(ctx, tgt, from, ep)
			if len(chain) == 0 {
				c.Observed = fmt.Sprintf("no certificate from %s: %v", where, err)
			} else {
				c.Observed, c.Held = judgeCertificate(chain, roots, ep.Want, time.Now())
			}
			r.Checks = append(r.Checks, c)
		}
	}
	judge(&r, true, "right identity")
	return r
}

// peerChain handshakes and returns the chain the server sent, even when the
// handshake fails afterwards because the probe has no certificate of its own.
func peerChain(ctx context.Context, tgt Target, from topology.Pod, ep mesh.IdentityEndpoint) ([]*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
	defer cancel()
	raw, err := tgt.Sub.DialContext(ctx, from, "tcp", ep.Addr)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	var chain []*x509.Certificate
	conn := tls.Client(raw, &tls.Config{
		ServerName: ep.ServerName,
		NextProtos: ep.NextProtos,
		MinVersion: tls.VersionTLS12,
		// The chain is judged below against the mesh root and the expected identity;
		// here it is only kept, whatever it is.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			chain = cs.PeerCertificates
			return nil
		},
	})
	err = conn.HandshakeContext(ctx)
	if err == nil {
		// Under TLS 1.3 a server's refusal of a missing client certificate arrives
		// after the client's handshake is done: read once so it is seen and logged.
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		var b [1]byte
		_, err = conn.Read(b[:])
	}
	return chain, err
}

// judgeCertificate checks a presented chain: identity, lifetime, and chain of trust.
func judgeCertificate(chain []*x509.Certificate, roots *x509.CertPool, want string, now time.Time) (string, bool) {
	leaf := chain[0]
	var ids []string
	for _, u := range leaf.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, leaf.DNSNames...)
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, verr := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	var problems []string
	if !slices.Contains(ids, want) {
		problems = append(problems, fmt.Sprintf("identity %s, want %s", orNone(ids), want))
	}
	if life > MaxCertLifetime {
		problems = append(problems, fmt.Sprintf("lives %s, longer than %s", life.Round(time.Minute), MaxCertLifetime))
	}
	if verr != nil {
		problems = append(problems, "does not chain to the mesh root: "+verr.Error())
	}
	desc := fmt.Sprintf("%s, valid %s, expires %s, issuer %q", orNone(ids), life.Round(time.Minute), leaf.NotAfter.UTC().Format(time.RFC3339), leaf.Issuer.String())
	if len(problems) > 0 {
		return desc + ": " + strings.Join(problems, "; "), false
	}
	return desc + ", chains to the mesh root", true
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "(no identity)"
	}
	return strings.Join(ids, " ")
}
