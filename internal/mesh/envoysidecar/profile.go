// Package envoysidecar is the envoy-sidecar mesh profile: Istio's sidecar data plane
// reproduced without Kubernetes. Every enrolled pod gets an Envoy running as the proxy
// uid beside its workload, istio-iptables-style REDIRECT rules in its network namespace
// (inbound app port to 15006, outbound TCP to 15001, the proxy's own traffic excluded
// by uid), a static bootstrap generated with go-control-plane's typed API, and, unless
// mTLS is off, a SPIFFE workload certificate from meshmark's own CA (internal/pki).
// Defaults mirror a stock Istio sidecar; options switch features off to attribute cost.
package envoysidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/istiohelm"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/telemetry"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "envoy-sidecar"

// DefaultMTLS is Istio's out-of-the-box mode: permissive, with auto-mTLS between
// sidecars.
const DefaultMTLS = mesh.MTLSPermissive

// ProbeServiceAccount is the identity the enrollment check uses when it talks mTLS.
const ProbeServiceAccount = "meshmark-probe"

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:        Name,
		Summary:     "Istio's sidecar data plane: Envoy in every pod, iptables REDIRECT, SPIFFE mTLS",
		New:         New,
		LocalImages: istiohelm.LocalImages,
		Own: istiohelm.WithOptions(map[string]string{
			PlaintextServicesOption: "services exempted from mTLS, as a PeerAuthentication with mode DISABLE on their workloads and a DestinationRule with tls mode DISABLE for their host (default: none)",
		}),
		Needs:   []string{"envoy"},
		SMPType: istiohelm.SMPType,
		Stands: []published.Stand{{For: "istio"}, {For: "appmesh", MTLS: "off",
			Unlike: "AWS App Mesh is not available (it runs only on AWS, and is retired): appmesh-like is the same Envoy sidecar as istio-like without mTLS, so the two differ by mTLS, not by mesh"}},
		OnCluster: istiohelm.OnCluster(IstioSidecar),
	})
}

// PlaintextServicesOption names the services whose workloads have mTLS switched off,
// the way an Istio user exempts a legacy workload; the security probes catch it.
const PlaintextServicesOption = "plaintext_services"

var _ mesh.Telemetry = (*Profile)(nil)

// Profile is one envoy-sidecar configuration. Install and Uninstall are not meant to
// run concurrently with each other.
type Profile struct {
	opts   mesh.Options
	mode   mesh.MTLSMode
	exempt []string // PlaintextServicesOption

	mu       sync.Mutex
	ca       *pki.CA
	configs  map[string][]byte
	sidecars map[string]*sidecar // by pod name
}

type sidecar struct {
	pod      topology.Pod
	identity string
	certs    CertPaths
	proc     substrate.Process
	rules    *Interception // set once applied
	allow    []string      // the authorization policy it enforces; nil: none
}

// New builds the profile from parsed options.
func New(o mesh.Options) (mesh.Profile, error) {
	mode := o.EffectiveMTLS(DefaultMTLS)
	exempt, err := o.OwnStrings(PlaintextServicesOption)
	if err != nil {
		return nil, err
	}
	if len(exempt) > 0 && mode == mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: PlaintextServicesOption, Msg: "with mtls off every service is plaintext already"}
	}
	for _, s := range exempt {
		if !serviceName.MatchString(s) {
			return nil, &mesh.OptionError{Key: PlaintextServicesOption, Msg: fmt.Sprintf("%q is not a service name", s)}
		}
	}
	return &Profile{opts: o, mode: mode, exempt: exempt}, nil
}

var serviceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// podMode is the mTLS mode a pod's own sidecar serves inbound.
func (p *Profile) podMode(pod topology.Pod) mesh.MTLSMode {
	// The ingress gateway faces the outside: it takes plaintext and sends on with mTLS.
	if pod.Service != "" && (slices.Contains(p.exempt, pod.Service) || pod.Service == gateway.Service) {
		return mesh.MTLSOff
	}
	return p.mode
}

func (p *Profile) Name() string { return Name }

// MTLS is the effective mTLS mode.
func (p *Profile) MTLS() mesh.MTLSMode { return p.mode }

// Options are the parsed options.
func (p *Profile) Options() mesh.Options { return p.opts }

// CA is the workload CA of the last Install (nil before, or when mTLS is off).
func (p *Profile) CA() *pki.CA {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ca
}

// Configs returns each sidecar's bootstrap and interception rules and the mesh root
// certificate (never a private key).
func (p *Profile) Configs() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]byte, len(p.configs))
	for k, v := range p.configs {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// MeshedPods are the pods the profile enrolls: every service pod, and the clients when
// MeshClients resolves to on.
func (p *Profile) MeshedPods(app *topology.App) []topology.Pod {
	var out []topology.Pod
	for _, s := range app.Services {
		if s.Name == gateway.Service {
			continue // the mesh's own ingress gateway (IngressGatewayConfig) has no sidecar
		}
		for _, v := range s.Versions {
			out = append(out, v.Endpoints...)
		}
	}
	if p.opts.ClientsMeshed(p.mode) {
		out = append(out, app.Clients...)
	}
	return out
}

// identity is the pod's SPIFFE ID: as the substrate assigned it, else Istio's rule.
func (p *Profile) identity(app *topology.App, pod topology.Pod) string {
	if pod.Identity != "" {
		return pod.Identity
	}
	sa := pod.ServiceAccount
	if sa == "" {
		sa = pod.Service
	}
	if sa == "" {
		sa = pod.Name
	}
	return topology.SPIFFEID(p.opts.TrustDomain, app.Namespace, sa)
}

// baseIDs gives every Envoy this process starts its own --base-id.
var baseIDs atomic.Uint32

// Install starts a sidecar in every enrolled pod and then redirects the pod's traffic
// into it. Call it before the workload starts.
func (p *Profile) Install(ctx context.Context, sub substrate.Substrate, app *topology.App) error {
	envoy, err := prereq.Envoy()
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	for _, s := range p.exempt {
		if app.Service(s) == nil {
			var have []string
			for _, s := range app.Services {
				have = append(have, s.Name)
			}
			return fmt.Errorf("%s: option %s: the app has no service %q (it has %s)", Name, PlaintextServicesOption, s, strings.Join(have, ", "))
		}
	}
	p.mu.Lock()
	p.configs = map[string][]byte{}
	p.sidecars = map[string]*sidecar{}
	p.ca = nil
	if p.mode != mesh.MTLSOff {
		ca, err := pki.NewCA(p.opts.TrustDomain, 0)
		if err != nil {
			p.mu.Unlock()
			return fmt.Errorf("%s: %w", Name, err)
		}
		p.ca = ca
		p.configs["ca.pem"] = ca.CertPEM()
	}
	p.mu.Unlock()

	pods := p.MeshedPods(app)
	errs := make([]error, len(pods))
	sem := make(chan struct{}, 4) // Envoy start-up is CPU-heavy; two cores are shared
	var wg sync.WaitGroup
	for i, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := p.installPod(ctx, sub, app, pod, envoy); err != nil {
				errs[i] = fmt.Errorf("pod %s: %w", pod.Name, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = p.Uninstall(context.WithoutCancel(ctx), sub)
		return fmt.Errorf("%s install: %w", Name, err)
	}
	return nil
}

func (p *Profile) installPod(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod, envoy string) error {
	sc := &sidecar{pod: pod, identity: p.identity(app, pod)}
	certs, err := p.writeCerts(sub, pod, sc.identity)
	if err != nil {
		return err
	}
	sc.certs = certs
	p.mu.Lock()
	p.sidecars[pod.Name] = sc
	p.mu.Unlock()
	if err := p.startEnvoy(ctx, sub, app, sc, envoy); err != nil {
		return err
	}
	ic := istioInterception(pod.Port)
	rules := ic.InstallRules()
	p.mu.Lock()
	p.configs[pod.Name+"/iptables.rules"] = []byte(rules)
	p.mu.Unlock()
	// Rules go in only once the proxy listens, so no connection is ever redirected
	// into a port nobody serves.
	if out, err := sub.Exec(ctx, pod, strings.NewReader(rules), "iptables-restore", "--noflush", "--wait"); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	p.mu.Lock()
	sc.rules = &ic
	p.mu.Unlock()
	return nil
}

// writeCerts issues pod a workload certificate for identity from the mesh CA and
// writes it, its key and the root into the pod; no paths when mTLS is off.
func (p *Profile) writeCerts(sub substrate.Substrate, pod topology.Pod, identity string) (CertPaths, error) {
	var certs CertPaths
	ca := p.CA()
	if ca == nil {
		return certs, nil
	}
	leaf, err := ca.Issue(identity, 0)
	if err != nil {
		return certs, err
	}
	// The key is for the proxy alone: substrates give pod files to the proxy uid
	// (testbed: owner 1337), so 0600 keeps the workload from reading it.
	for _, f := range []struct {
		name string
		data []byte
		mode uint32
		dst  *string
	}{{"envoy-ca.pem", ca.CertPEM(), 0o644, &certs.CA}, {"envoy-cert.pem", leaf.CertPEM, 0o644, &certs.Cert}, {"envoy-key.pem", leaf.KeyPEM, 0o600, &certs.Key}} {
		path, err := sub.WriteFile(pod, f.name, f.data, f.mode)
		if err != nil {
			return certs, err
		}
		*f.dst = path
	}
	return certs, nil
}

// startEnvoy writes the sidecar's bootstrap (with its authorization policy, if any)
// and starts Envoy under the proxy uid, returning once its admin says ready.
func (p *Profile) startEnvoy(ctx context.Context, sub substrate.Substrate, app *topology.App, sc *sidecar, envoy string) error {
	pod := sc.pod
	pod.Identity = sc.identity
	b, err := BuildBootstrapAllowing(app, pod, p.opts, p.mode, sc.certs, sc.allow)
	if err != nil {
		return err
	}
	js, err := MarshalBootstrap(b)
	if err != nil {
		return err
	}
	cfg, err := sub.WriteFile(pod, "envoy.json", js, 0o644)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs[pod.Name+"/envoy.json"] = js
	p.mu.Unlock()
	argv := []string{envoy, "-c", cfg,
		"--concurrency", fmt.Sprint(p.opts.Concurrency),
		// As Istio's pilot-agent: no hot restart, so no shared memory between Envoys;
		// a distinct base id anyway, so nothing on the host can collide.
		"--disable-hot-restart", "--base-id", fmt.Sprint(baseIDs.Add(1) + 1000),
		"--drain-time-s", "1",
		"--service-cluster", strings.TrimPrefix(pod.Service+"."+app.Namespace, "."),
		"--service-node", pod.Name,
		"--log-level", "warning",
	}
	proc, err := sub.Start(ctx, pod, substrate.ProcessSpec{
		Name: "envoy",
		Role: substrate.RoleSidecar,
		Argv: argv,
		UID:  substrate.ProxyUID,
		Ready: func(ctx context.Context) error {
			return adminReady(ctx, sub, pod)
		},
	})
	if err != nil {
		return fmt.Errorf("start envoy: %w", err)
	}
	p.mu.Lock()
	sc.proc = proc
	p.mu.Unlock()
	return nil
}

// Uninstall removes the rules and stops the sidecars, continuing past errors.
func (p *Profile) Uninstall(ctx context.Context, sub substrate.Substrate) error {
	p.mu.Lock()
	scs := make([]*sidecar, 0, len(p.sidecars))
	for _, sc := range p.sidecars {
		scs = append(scs, sc)
	}
	p.sidecars = map[string]*sidecar{}
	p.mu.Unlock()
	var errs []error
	for _, sc := range scs {
		if sc.rules != nil {
			if out, err := sub.Exec(ctx, sc.pod, strings.NewReader(sc.rules.RemoveRules()), "iptables-restore", "--noflush", "--wait"); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: remove rules: %w: %s", sc.pod.Name, err, strings.TrimSpace(string(out))))
			}
		}
		if sc.proc != nil {
			if err := sc.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: stop envoy: %w", sc.pod.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// adminAddr is where the sidecar's admin listens inside its pod. Connections to it
// from inside the pod are on loopback and not intercepted.
var adminAddr = fmt.Sprintf("127.0.0.1:%d", AdminPort)

func adminReady(ctx context.Context, sub substrate.Substrate, pod topology.Pod) error {
	r, err := mesh.ProbeHTTP(ctx, sub, pod, adminAddr, "", "/ready")
	if err != nil {
		return err
	}
	if r.Status != 200 {
		return fmt.Errorf("envoy admin /ready: HTTP %d %s", r.Status, strings.TrimSpace(r.Body))
	}
	return nil
}

// ReadCounters snapshots every sidecar's admin endpoint (mesh.Telemetry): inbound
// requests per pod's service, all counters and gauges.
func (p *Profile) ReadCounters(ctx context.Context, sub substrate.Substrate, _ *topology.App) []meshkube.ProxyCounters {
	p.mu.Lock()
	scs := make([]*sidecar, 0, len(p.sidecars))
	for _, sc := range p.sidecars {
		scs = append(scs, sc)
	}
	p.mu.Unlock()
	sort.Slice(scs, func(i, j int) bool { return scs[i].pod.Name < scs[j].pod.Name })
	out := make([]meshkube.ProxyCounters, len(scs))
	var wg sync.WaitGroup
	for i, sc := range scs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := sc.pod
			c := telemetry.NewClient(adminAddr, func(ctx context.Context, network, addr string) (net.Conn, error) {
				return sub.DialContext(ctx, pod, network, addr)
			})
			sctx, cancel := context.WithTimeout(ctx, meshprobe.ProbeTimeout)
			defer cancel()
			snap, err := c.Snapshot(sctx)
			pc := meshkube.ProxyCounters{Component: Component, Pod: pod.Name, Time: snap.Time, Err: err, Unit: meshkube.UnitRequests}
			if err == nil {
				pc.Version, pc.Counters, pc.Gauges = snap.Version, snap.Counters, snap.Gauges
				if pod.Service != "" {
					pc.Inbound = map[string]uint64{pod.Service: telemetry.InboundRequests(telemetry.Diff{Counters: snap.Counters})}
				}
			}
			out[i] = pc
		}()
	}
	wg.Wait()
	return out
}
