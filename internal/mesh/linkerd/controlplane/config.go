// Package controlplane is meshmark's minimal Linkerd control plane: the gRPC APIs a real
// linkerd2-proxy needs, served from one process (`meshmark linkerd-controlplane`), with
// no Kubernetes behind them. The mesh profile (package linkerd) writes the app's
// topology into a Config; this package answers from it:
//
//   - identity (Certify): checks the proxy's token, signs its CSR with meshmark's CA
//     (internal/pki) for its Linkerd identity name, short-lived, as Linkerd's identity
//     controller does;
//   - destination (Get, GetProfile): endpoints with their TLS identity, weight and the
//     HTTP/2 protocol hint Linkerd gives meshed endpoints; service profiles whose
//     weighted dst_overrides carry a service's version split;
//   - policy: inbound (GetPort/WatchPort) Linkerd's default policy (all-unauthenticated,
//     or all-authenticated under strict mTLS), or only named client identities when the
//     study sets authz; outbound (Get/Watch) a service address's routes with the same
//     split, NotFound for any other address, as Linkerd's policy controller answers.
//
// Every API keeps its streams open after the first message, so a proxy notices when the
// control plane goes away and keeps serving from what it last received.
package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"
)

// Names Linkerd gives its own components; the proxies verify the control plane's
// certificates against them.
const (
	ControlNamespace   = "linkerd"
	IdentityAccount    = "linkerd-identity"
	DestinationAccount = "linkerd-destination"
)

// IdentityName is Linkerd's identity for a service account:
// <sa>.<ns>.serviceaccount.identity.linkerd.<trust domain>.
func IdentityName(serviceAccount, namespace, trustDomain string) string {
	return serviceAccount + "." + namespace + ".serviceaccount.identity.linkerd." + trustDomain
}

// Config is everything the control plane serves, written by the profile as JSON.
type Config struct {
	Namespace   string `json:"namespace"`
	TrustDomain string `json:"trust_domain"`
	// Listen addresses (ip:port) of the three APIs.
	IdentityAddr    string `json:"identity_addr"`
	DestinationAddr string `json:"destination_addr"`
	PolicyAddr      string `json:"policy_addr"`
	// CACert and CAKey are files holding meshmark's CA (PEM); the key file is 0600.
	CACert string `json:"ca_cert"`
	CAKey  string `json:"ca_key"`
	// TokenKey is a file holding the secret that proxy tokens are HMACs under (see Token).
	TokenKey string `json:"token_key"`
	// CertValidity is how long an issued proxy certificate lives (Linkerd: 24h).
	CertValidity Duration `json:"cert_validity"`
	// Strict makes the default inbound policy all-authenticated.
	Strict bool `json:"strict,omitempty"`
	// Authz, when set, admits only these client identities (plus localhost) inbound.
	Authz []string `json:"authz,omitempty"`
	// PolicyFile, when set, is where an AuthzPolicy is read from while running.
	PolicyFile string    `json:"policy_file,omitempty"`
	Services   []Service `json:"services"`
	// Workloads are the meshed pods; only their identities are certified.
	Workloads []Workload `json:"workloads"`
}

// Service is one service's address and versions.
type Service struct {
	Name     string    `json:"name"`
	VIP      string    `json:"vip,omitempty"`
	Port     int       `json:"port"`
	Versions []Version `json:"versions"`
}

// Version is a subset of a service's endpoints with its share of traffic.
type Version struct {
	Name      string     `json:"name"`
	Weight    int        `json:"weight"`
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one pod serving a service.
type Endpoint struct {
	Pod  string `json:"pod"`
	IP   string `json:"ip"`
	Port int    `json:"port"`
	// Identity is the Linkerd identity of the pod's proxy; empty when unmeshed.
	Identity string `json:"identity,omitempty"`
}

// Workload is one meshed pod: the identity its proxy may ask for.
type Workload struct {
	Pod      string `json:"pod"`
	Identity string `json:"identity"`
}

// Duration is a time.Duration written as "24h".
type Duration struct{ time.Duration }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// LoadConfig reads and checks a config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// Validate checks the fields the servers rely on.
func (c *Config) Validate() error {
	var errs []error
	if c.Namespace == "" || c.TrustDomain == "" {
		errs = append(errs, errors.New("namespace and trust_domain are required"))
	}
	for field, a := range map[string]string{"identity_addr": c.IdentityAddr, "destination_addr": c.DestinationAddr, "policy_addr": c.PolicyAddr} {
		if _, err := netip.ParseAddrPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	if c.CACert == "" || c.CAKey == "" || c.TokenKey == "" {
		errs = append(errs, errors.New("ca_cert, ca_key and token_key are required"))
	}
	for _, s := range c.Services {
		if s.VIP != "" {
			if _, err := netip.ParseAddr(s.VIP); err != nil {
				errs = append(errs, fmt.Errorf("service %s: vip: %w", s.Name, err))
			}
		}
		for _, v := range s.Versions {
			for _, e := range v.Endpoints {
				if _, err := netip.ParseAddr(e.IP); err != nil {
					errs = append(errs, fmt.Errorf("service %s endpoint %s: ip: %w", s.Name, e.Pod, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Authority is the DNS name a service (or one version of it, "<svc>-<version>") has
// in Linkerd's destination API: <name>.<ns>.svc.cluster.local.
func (c *Config) Authority(name string) string {
	return name + "." + c.Namespace + ".svc." + c.TrustDomain
}
