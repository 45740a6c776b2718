package mesh

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Secured is implemented by profiles that make security promises: the security
// experiment (internal/security) asks it, after Install and Check, what this profile
// with these options promises, and then tries each promise on the wire. A profile that
// does not implement it promises nothing, and every probe is not applicable to it.
type Secured interface {
	SecurityPosture(app *topology.App) Posture
}

// Posture is what a profile, with its options, promises about the app it carries.
type Posture struct {
	// Meshed are the pods the profile enrolls; traffic between two of them is mesh
	// traffic.
	Meshed []topology.Pod
	// Encrypts: every byte of application traffic between two meshed pods is inside
	// mTLS on the wire (TLS or HBONE).
	Encrypts bool
	// RefusesPlaintext: a caller without a mesh identity is refused by every meshed
	// service, on its service address and on the pod's own address and port.
	RefusesPlaintext bool
	// ExcludedUIDs are the uids whose outbound traffic interception deliberately skips
	// (the proxy's own); a workload running as one of them leaves the pod unproxied.
	ExcludedUIDs []int
	// ExcludedInboundPorts are the ports whose inbound connections the interception
	// deliberately lets reach the pod without the proxy (Istio's 15090, 15021, ...,
	// Linkerd's 4190 and 4191): whatever listens there is outside the mesh's
	// protection, by the mesh's own design.
	ExcludedInboundPorts []int
	// Identity says how to see the certificate a meshed pod presents; nil when the
	// profile issues no workload certificates.
	Identity IdentityProber
}

// IdentityProber lets the identity probe ask a meshed pod's proxy for its certificate.
type IdentityProber interface {
	// IdentityEndpoint is where pod's proxy terminates mesh TLS (ip:port), the TLS
	// server name and ALPN a mesh peer would send (Linkerd selects by SNI, HBONE wants
	// h2), and the identity the certificate must carry (a SPIFFE ID, or for Linkerd the
	// DNS-like name in its DNS SAN). ok is false for pods the profile does not enroll.
	IdentityEndpoint(app *topology.App, pod topology.Pod) (ep IdentityEndpoint, ok bool)
	// TrustRoots is the mesh's root of trust (nil before Install).
	TrustRoots() *x509.CertPool
}

// IdentityEndpoint is one pod's answer to IdentityProber.
type IdentityEndpoint struct {
	Addr       string
	ServerName string
	NextProtos []string
	Want       string
}

// Authorizer is implemented by profiles that can enforce which callers reach a
// service, the way the mesh's own policy API does it (Istio AuthorizationPolicy,
// Linkerd AuthorizationPolicy/Server, ztunnel's authorization).
type Authorizer interface {
	// Authorize restricts every service named in allowed to the caller services listed
	// for it (by the callers' mesh identity); services not named stay open. Calling it
	// again replaces the policy; a nil map removes it. It returns once the proxies
	// enforce the new policy.
	Authorize(ctx context.Context, sub substrate.Substrate, app *topology.App, allowed map[string][]string) error
}

// CallerPods checks an Authorizer's allow-list against the app and returns, for each
// callee it names, the pods of the caller services it admits (an empty list: nobody),
// which each profile turns into the identities or addresses its proxies match.
func CallerPods(app *topology.App, allowed map[string][]string) (map[string][]topology.Pod, error) {
	out := make(map[string][]topology.Pod, len(allowed))
	for callee, callers := range allowed {
		if app.Service(callee) == nil {
			return nil, fmt.Errorf("authorize: no service %q", callee)
		}
		pods := []topology.Pod{}
		for _, c := range callers {
			cs := app.Service(c)
			if cs == nil {
				return nil, fmt.Errorf("authorize %s: no caller service %q", callee, c)
			}
			for _, v := range cs.Versions {
				pods = append(pods, v.Endpoints...)
			}
		}
		out[callee] = pods
	}
	return out, nil
}
