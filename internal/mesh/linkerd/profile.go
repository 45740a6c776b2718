// Package linkerd is the linkerd mesh profile. Locally it is Linkerd's data plane alone:
// every enrolled pod gets the real linkerd2-proxy, running as uid 2102 beside its
// workload with the environment Linkerd's proxy injector gives it, an identity
// directory (key.p8, csr.der) and linkerd2-proxy-init's iptables rules (inbound to 4143,
// outbound to 4140, the proxy's uid and its ports 4190/4191 skipped). The proxies talk
// to meshmark's own minimal control plane (package controlplane), run as
// `meshmark linkerd-controlplane` in a node namespace under the control-plane role:
// it certifies each proxy's identity with meshmark's CA and serves destinations, service
// profiles (the version split) and inbound policy. On Kubernetes the profile is Linkerd
// itself instead: its own Helm charts, with certificates from meshmark's PKI
// (kubernetes.go).
package linkerd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Name is the registry name.
const Name = "linkerd"

// Ports as Linkerd's injector and proxy-init set them.
const (
	InboundPort  = 4143
	OutboundPort = 4140
	AdminPort    = 4191
	ControlPort  = 4190 // tap
	// The control plane's ports, as Linkerd's services expose them.
	IdentityPort    = 8080
	DestinationPort = 8086
	PolicyPort      = 8090
)

// ClusterNetworks is where every testbed address lives (the proxies' cluster and
// profile networks, as Linkerd's clusterNetworks setting).
const ClusterNetworks = "198.18.0.0/15"

// CertValidity is how long the identity controller's certificates live (Linkerd: 24h).
const CertValidity = 24 * time.Hour

// ControlPlaneCommand is the hidden subcommand that runs the control plane.
const ControlPlaneCommand = "linkerd-controlplane"

// ControlPlaneBinary is the executable started as `<bin> linkerd-controlplane`: by
// default the running meshmark. Tests point it at their own binary.
var ControlPlaneBinary = os.Executable

func init() {
	mesh.RegisterProfile(mesh.Registration{
		Name:    Name,
		Summary: "Linkerd's data plane: the real linkerd2-proxy in every pod, proxy-init iptables, mTLS by default, meshmark's minimal control plane; on Kubernetes, Linkerd itself from its Helm charts",
		New:     New,
		Own: withKubeOptions(map[string]string{
			"authz": "service accounts or identity names allowed to call meshed pods (default: everyone, Linkerd's all-unauthenticated)",
		}),
		Unsupported: map[string]string{
			"request_id":       "linkerd2-proxy does not generate x-request-id",
			"retries":          "Linkerd retries only routes its policy marks retryable; meshmark configures none, like a stock install",
			"circuit_breakers": "linkerd2-proxy has no Envoy-style connection and request thresholds",
			"telemetry":        "linkerd2-proxy always keeps its metrics; there is no switch to attribute their cost",
		},
		Needs:       []string{"linkerd2-proxy"},
		LocalImages: LocalImages,
		SMPType:     "linkerd",
		Stands:      []published.Stand{{For: "linkerd"}},
		OnCluster: meshkube.ClusterMarks{
			Sidecar: Sidecar,
			Outside: meshkube.OptOut{
				NamespaceAnnotations: map[string]string{InjectAnnotation: "disabled"},
				PodAnnotations:       map[string]string{InjectAnnotation: "disabled"},
			},
		},
	})
}

var _ mesh.Telemetry = (*Profile)(nil)

// Profile is one linkerd configuration. Install and Uninstall are not meant to run
// concurrently with each other.
type Profile struct {
	opts  mesh.Options
	mode  mesh.MTLSMode
	authz []string // as written; resolved to identity names at Install
	// cpEnv is added to the control plane's environment (tests inject faults with it).
	cpEnv []string

	mu    sync.Mutex
	ca    *pki.CA
	cp    substrate.Process
	cpPod topology.Pod
	cpIP  netip.Addr
	// policyFile is where Authorize writes the running AuthzPolicy; policyVersion
	// numbers them.
	policyFile    string
	policyVersion int64
	configs       map[string][]byte
	proxies       map[string]*proxy // by pod name
}

type proxy struct {
	pod      topology.Pod
	identity string
	proc     substrate.Process
	rules    *Interception
}

// New builds the profile from parsed options. mtls off is refused: Linkerd always
// speaks mTLS between meshed proxies and has no switch to turn that off.
func New(o mesh.Options) (mesh.Profile, error) {
	mode := o.EffectiveMTLS(mesh.MTLSPermissive)
	if mode == mesh.MTLSOff {
		return nil, &mesh.OptionError{Key: "mtls", Msg: "Linkerd cannot turn mTLS off between meshed pods (permissive: plaintext from outside the mesh accepted, Linkerd's default; strict: all-authenticated)"}
	}
	authz, err := o.OwnStrings("authz")
	if err != nil {
		return nil, err
	}
	for _, a := range authz {
		if strings.ContainsAny(a, " /:@") {
			return nil, &mesh.OptionError{Key: "authz", Msg: fmt.Sprintf("%q is neither a service account nor a Linkerd identity name", a)}
		}
	}
	return &Profile{opts: o, mode: mode, authz: authz}, nil
}

func (p *Profile) Name() string { return Name }

// MTLS is the effective mode.
func (p *Profile) MTLS() mesh.MTLSMode { return p.mode }

// CA is the identity CA of the last Install.
func (p *Profile) CA() *pki.CA {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ca
}

// ControlPlane is the control-plane process of the last Install (nil before).
func (p *Profile) ControlPlane() substrate.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cp
}

// Configs returns the control plane's config, each proxy's environment and rules and
// the trust anchor (never a private key or token).
func (p *Profile) Configs() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]byte, len(p.configs))
	for k, v := range p.configs {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// MeshedPods are every service pod, and the clients when mesh_clients resolves on.
func (p *Profile) MeshedPods(app *topology.App) []topology.Pod {
	var out []topology.Pod
	for _, s := range app.Services {
		for _, v := range s.Versions {
			out = append(out, v.Endpoints...)
		}
	}
	if p.opts.ClientsMeshed(p.mode) {
		out = append(out, app.Clients...)
	}
	return out
}

func serviceAccount(pod topology.Pod) string {
	switch {
	case pod.ServiceAccount != "":
		return pod.ServiceAccount
	case pod.Service != "":
		return pod.Service
	}
	return pod.Name
}

// Identity is the Linkerd identity of a pod's proxy.
func (p *Profile) Identity(app *topology.App, pod topology.Pod) string {
	return controlplane.IdentityName(serviceAccount(pod), app.Namespace, p.opts.TrustDomain)
}

// authzIdentities resolves the authz option: a bare service account becomes its
// identity name in the app's namespace.
func (p *Profile) authzIdentities(app *topology.App) []string {
	var out []string
	for _, a := range p.authz {
		if strings.Contains(a, ".") {
			out = append(out, a)
		} else {
			out = append(out, controlplane.IdentityName(a, app.Namespace, p.opts.TrustDomain))
		}
	}
	return out
}

// nodePodder is implemented by substrates with node namespaces (the testbed): the
// control plane runs in one, reachable from every pod through the pods' default route.
type nodePodder interface {
	NodePod(node string) (topology.Pod, error)
}

// Install starts the control plane, then a proxy in every enrolled pod, then redirects
// each pod's traffic into its proxy. Call it before the workload starts.
func (p *Profile) Install(ctx context.Context, sub substrate.Substrate, app *topology.App) (err error) {
	bin, err := prereq.ProxyBin("linkerd2-proxy")
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	pods := p.MeshedPods(app)
	if len(pods) == 0 {
		return fmt.Errorf("%s: app %s has no pod to mesh", Name, app.Name)
	}
	ca, err := pki.NewCA(p.opts.TrustDomain, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	tokenKey := make([]byte, 32)
	if _, err := rand.Read(tokenKey); err != nil {
		return err
	}
	p.mu.Lock()
	p.ca, p.cp = ca, nil
	p.configs = map[string][]byte{"trust-anchors.pem": ca.CertPEM()}
	p.proxies = map[string]*proxy{}
	p.mu.Unlock()
	defer func() {
		if err != nil {
			_ = p.Uninstall(context.WithoutCancel(ctx), sub)
		}
	}()
	if err := p.startControlPlane(ctx, sub, app, pods, ca, tokenKey); err != nil {
		return fmt.Errorf("%s install: control plane: %w", Name, err)
	}
	errs := make([]error, len(pods))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := p.installPod(ctx, sub, app, pod, bin, ca, tokenKey); err != nil {
				errs[i] = fmt.Errorf("pod %s: %w", pod.Name, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s install: %w", Name, err)
	}
	return nil
}

// controlPlaneConfig describes the app for the control plane.
func (p *Profile) controlPlaneConfig(app *topology.App, meshed []topology.Pod, ip netip.Addr) controlplane.Config {
	isMeshed := map[string]bool{}
	cfg := controlplane.Config{
		Namespace: app.Namespace, TrustDomain: p.opts.TrustDomain,
		IdentityAddr:    netip.AddrPortFrom(ip, IdentityPort).String(),
		DestinationAddr: netip.AddrPortFrom(ip, DestinationPort).String(),
		PolicyAddr:      netip.AddrPortFrom(ip, PolicyPort).String(),
		CertValidity:    controlplane.Duration{Duration: CertValidity},
		Strict:          p.mode == mesh.MTLSStrict,
		Authz:           p.authzIdentities(app),
	}
	for _, pod := range meshed {
		isMeshed[pod.Name] = true
		cfg.Workloads = append(cfg.Workloads, controlplane.Workload{Pod: pod.Name, Identity: p.Identity(app, pod)})
	}
	for _, s := range app.Services {
		cs := controlplane.Service{Name: s.Name, Port: s.Port}
		if s.VIP.IsValid() {
			cs.VIP = s.VIP.String()
		}
		for _, v := range s.Versions {
			cv := controlplane.Version{Name: v.Name, Weight: v.Weight}
			for _, e := range v.Endpoints {
				ce := controlplane.Endpoint{Pod: e.Name, IP: e.IP.String(), Port: e.Port}
				if isMeshed[e.Name] {
					ce.Identity = p.Identity(app, e)
				}
				cv.Endpoints = append(cv.Endpoints, ce)
			}
			cs.Versions = append(cs.Versions, cv)
		}
		cfg.Services = append(cfg.Services, cs)
	}
	return cfg
}

func (p *Profile) startControlPlane(ctx context.Context, sub substrate.Substrate, app *topology.App, meshed []topology.Pod, ca *pki.CA, tokenKey []byte) error {
	np, ok := sub.(nodePodder)
	if !ok {
		return errors.New("the substrate has no node namespace to run the control plane in")
	}
	node := meshed[0].Node
	cpPod, err := np.NodePod(node)
	if err != nil {
		return err
	}
	self, err := ControlPlaneBinary()
	if err != nil {
		return fmt.Errorf("find the meshmark binary: %w", err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	cfg := p.controlPlaneConfig(app, meshed, cpPod.IP)
	for _, f := range []struct {
		name string
		data []byte
		mode uint32
		dst  *string
	}{
		{"linkerd/ca.pem", ca.CertPEM(), 0o644, &cfg.CACert},
		{"linkerd/ca-key.pem", keyPEM, 0o600, &cfg.CAKey},
		{"linkerd/token-key", tokenKey, 0o600, &cfg.TokenKey},
	} {
		path, err := sub.WriteFile(cpPod, f.name, f.data, f.mode)
		if err != nil {
			return err
		}
		*f.dst = path
	}
	cfg.PolicyFile = filepath.Join(filepath.Dir(cfg.CACert), "authz-policy.json")
	js, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	cfgPath, err := sub.WriteFile(cpPod, "linkerd/controlplane.json", js, 0o644)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.configs["control-plane/controlplane.json"] = js
	p.mu.Unlock()
	proc, err := sub.Start(ctx, cpPod, substrate.ProcessSpec{
		Name: "linkerd-control-plane",
		Role: substrate.RoleControlPlane,
		Argv: []string{self, ControlPlaneCommand, "--config", cfgPath},
		// linkerd2-proxy's control-plane client offers no ALPN (Linkerd's controllers
		// sit behind their own proxy and do not ask); grpc-go refuses such TLS clients
		// unless told not to.
		Env: append([]string{"GRPC_ENFORCE_ALPN_ENABLED=false"}, p.cpEnv...),
		Ready: func(ctx context.Context) error {
			for _, a := range []string{cfg.IdentityAddr, cfg.DestinationAddr, cfg.PolicyAddr} {
				c, err := sub.DialContext(ctx, cpPod, "tcp", a)
				if err != nil {
					return err
				}
				c.Close()
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cp, p.cpPod, p.cpIP = proc, cpPod, cpPod.IP
	p.policyFile, p.policyVersion = cfg.PolicyFile, 0
	p.mu.Unlock()
	return nil
}

// identityDocuments are what Linkerd's proxy reads from its identity directory: a
// PKCS#8 P-256 key and a DER CSR for its identity name.
func identityDocuments(identity string) (keyP8, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keyP8, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: identity},
		DNSNames: []string{identity},
	}, key)
	return keyP8, csrDER, err
}

// proxyEnv is the environment Linkerd's proxy injector sets, for one pod.
func (p *Profile) proxyEnv(app *topology.App, pod topology.Pod, identity, identityDir, tokenFile string, ca *pki.CA) []string {
	p.mu.Lock()
	cp := p.cpIP
	p.mu.Unlock()
	dstName := controlplane.IdentityName(controlplane.DestinationAccount, controlplane.ControlNamespace, p.opts.TrustDomain)
	idName := controlplane.IdentityName(controlplane.IdentityAccount, controlplane.ControlNamespace, p.opts.TrustDomain)
	workload, _ := json.Marshal(map[string]string{"ns": app.Namespace, "pod": pod.Name})
	dstContext, _ := json.Marshal(map[string]string{"ns": app.Namespace, "nodeName": pod.Node, "pod": pod.Name})
	defaultPolicy := "all-unauthenticated"
	if p.mode == mesh.MTLSStrict || len(p.authz) > 0 {
		defaultPolicy = "all-authenticated"
	}
	env := []string{
		"LINKERD2_PROXY_LOG=warn,linkerd=info,hickory=error",
		"LINKERD2_PROXY_LOG_FORMAT=plain",
		"LINKERD2_PROXY_DESTINATION_SVC_ADDR=" + netip.AddrPortFrom(cp, DestinationPort).String(),
		"LINKERD2_PROXY_DESTINATION_SVC_NAME=" + dstName,
		"LINKERD2_PROXY_POLICY_SVC_ADDR=" + netip.AddrPortFrom(cp, PolicyPort).String(),
		"LINKERD2_PROXY_POLICY_SVC_NAME=" + dstName,
		"LINKERD2_PROXY_POLICY_WORKLOAD=" + string(workload),
		"LINKERD2_PROXY_INBOUND_DEFAULT_POLICY=" + defaultPolicy,
		"LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS=" + ClusterNetworks,
		"LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS=" + ClusterNetworks,
		"LINKERD2_PROXY_CONTROL_STREAM_INITIAL_TIMEOUT=3s",
		"LINKERD2_PROXY_CONTROL_STREAM_IDLE_TIMEOUT=5m",
		"LINKERD2_PROXY_CONTROL_STREAM_LIFETIME=1h",
		"LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT=100ms",
		"LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT=1000ms",
		"LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT=5s",
		"LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT=90s",
		fmt.Sprintf("LINKERD2_PROXY_CONTROL_LISTEN_ADDR=0.0.0.0:%d", ControlPort),
		fmt.Sprintf("LINKERD2_PROXY_ADMIN_LISTEN_ADDR=0.0.0.0:%d", AdminPort),
		fmt.Sprintf("LINKERD2_PROXY_OUTBOUND_LISTEN_ADDRS=127.0.0.1:%d", OutboundPort),
		fmt.Sprintf("LINKERD2_PROXY_INBOUND_LISTEN_ADDR=0.0.0.0:%d", InboundPort),
		"LINKERD2_PROXY_INBOUND_IPS=" + pod.IP.String(),
		"LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES=svc." + p.opts.TrustDomain + ".",
		"LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE=10000ms",
		"LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE=10000ms",
		"LINKERD2_PROXY_INBOUND_ACCEPT_USER_TIMEOUT=30s",
		"LINKERD2_PROXY_OUTBOUND_CONNECT_USER_TIMEOUT=30s",
		"LINKERD2_PROXY_DESTINATION_CONTEXT=" + string(dstContext),
		"LINKERD2_PROXY_IDENTITY_DIR=" + identityDir,
		"LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS=" + string(ca.CertPEM()),
		"LINKERD2_PROXY_IDENTITY_TOKEN_FILE=" + tokenFile,
		"LINKERD2_PROXY_IDENTITY_SVC_ADDR=" + netip.AddrPortFrom(cp, IdentityPort).String(),
		"LINKERD2_PROXY_IDENTITY_SVC_NAME=" + idName,
		"LINKERD2_PROXY_IDENTITY_LOCAL_NAME=" + identity,
		fmt.Sprintf("LINKERD2_PROXY_CORES=%d", p.opts.Concurrency),
		"LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD=1s",
	}
	if pod.Port > 0 {
		env = append(env, fmt.Sprintf("LINKERD2_PROXY_INBOUND_PORTS=%d", pod.Port))
	}
	if p.opts.AccessLog {
		env = append(env, "LINKERD2_PROXY_ACCESS_LOG=apache")
	}
	return env
}

func (p *Profile) installPod(ctx context.Context, sub substrate.Substrate, app *topology.App, pod topology.Pod, bin string, ca *pki.CA, tokenKey []byte) error {
	px := &proxy{pod: pod, identity: p.Identity(app, pod)}
	keyP8, csr, err := identityDocuments(px.identity)
	if err != nil {
		return err
	}
	var keyPath, tokenPath string
	for _, f := range []struct {
		name string
		data []byte
		mode uint32
		dst  *string
	}{
		{"linkerd-identity/key.p8", keyP8, 0o600, &keyPath},
		{"linkerd-identity/csr.der", csr, 0o644, nil},
		{"linkerd-identity/token", controlplane.Token(tokenKey, px.identity), 0o600, &tokenPath},
	} {
		path, err := sub.WriteFile(pod, f.name, f.data, f.mode)
		if err != nil {
			return err
		}
		if f.dst != nil {
			*f.dst = path
		}
	}
	// The key and the token are the proxy's alone: hand them to its uid.
	uid := fmt.Sprint(substrate.LinkerdProxyUID)
	if out, err := sub.Exec(ctx, pod, nil, "chown", uid+":"+uid, keyPath, tokenPath); err != nil {
		return fmt.Errorf("chown identity files: %w: %s", err, strings.TrimSpace(string(out)))
	}
	identityDir := strings.TrimSuffix(keyPath, "/key.p8")
	env := p.proxyEnv(app, pod, px.identity, identityDir, tokenPath, ca)
	ic := Interception{ProxyUID: substrate.LinkerdProxyUID, InboundPort: InboundPort, OutboundPort: OutboundPort,
		SkipInbound: []int{ControlPort, AdminPort}, Outbound: true}
	rules := ic.InstallRules()
	p.mu.Lock()
	p.configs[pod.Name+"/proxy.env"] = []byte(redactEnv(env))
	p.configs[pod.Name+"/iptables.rules"] = []byte(rules)
	p.proxies[pod.Name] = px
	p.mu.Unlock()

	if err := p.waitControlPlaneReachable(ctx, sub, pod); err != nil {
		return err
	}
	proc, err := sub.Start(ctx, pod, substrate.ProcessSpec{
		Name: "linkerd-proxy",
		Role: substrate.RoleSidecar,
		Argv: []string{bin},
		Env:  env,
		UID:  substrate.LinkerdProxyUID,
		Ready: func(ctx context.Context) error {
			return adminReady(ctx, sub, pod)
		},
	})
	if err != nil {
		return fmt.Errorf("start linkerd2-proxy: %w", err)
	}
	p.mu.Lock()
	px.proc = proc
	p.mu.Unlock()
	// As linkerd-init runs before the proxy in Kubernetes, but here only once the proxy
	// is ready, so no connection is redirected into a port nobody serves.
	if out, err := sub.Exec(ctx, pod, strings.NewReader(rules), "iptables-restore", "--noflush", "--wait"); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	p.mu.Lock()
	px.rules = &ic
	p.mu.Unlock()
	return nil
}

// waitControlPlaneReachable returns once a connection from the pod reaches the
// control plane's identity API, so a proxy starts only where it can be certified and a
// network that cannot carry the pod's control traffic is reported as such, naming the
// pod, instead of as a proxy that never became ready.
func (p *Profile) waitControlPlaneReachable(ctx context.Context, sub substrate.Substrate, pod topology.Pod) error {
	p.mu.Lock()
	addr := netip.AddrPortFrom(p.cpIP, IdentityPort).String()
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		c, err := sub.DialContext(dctx, pod, "tcp", addr)
		dcancel()
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the control plane at %s is not reachable from the pod: %w", addr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// redactEnv renders env for provenance, one variable a line, without the trust anchor
// body (it is stored once as trust-anchors.pem).
func redactEnv(env []string) string {
	var b strings.Builder
	for _, kv := range env {
		if strings.HasPrefix(kv, "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS=") {
			kv = "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS=<trust-anchors.pem>"
		}
		b.WriteString(kv + "\n")
	}
	return b.String()
}

// Uninstall removes the rules, stops the proxies and the control plane, continuing past
// errors.
func (p *Profile) Uninstall(ctx context.Context, sub substrate.Substrate) error {
	p.mu.Lock()
	pxs := make([]*proxy, 0, len(p.proxies))
	for _, px := range p.proxies {
		pxs = append(pxs, px)
	}
	sort.Slice(pxs, func(i, j int) bool { return pxs[i].pod.Name < pxs[j].pod.Name })
	p.proxies = map[string]*proxy{}
	cp := p.cp
	p.cp = nil
	p.mu.Unlock()
	var errs []error
	for _, px := range pxs {
		if px.rules != nil {
			if out, err := sub.Exec(ctx, px.pod, strings.NewReader(px.rules.RemoveRules()), "iptables-restore", "--noflush", "--wait"); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: remove rules: %w: %s", px.pod.Name, err, strings.TrimSpace(string(out))))
			}
		}
		if px.proc != nil {
			if err := px.proc.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("pod %s: stop linkerd2-proxy: %w", px.pod.Name, err))
			}
		}
	}
	if cp != nil {
		if err := cp.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop control plane: %w", err))
		}
	}
	return errors.Join(errs...)
}

// adminAddr is where the proxy's admin server answers inside its pod.
var adminAddr = net.JoinHostPort("127.0.0.1", fmt.Sprint(AdminPort))

// adminReady is Linkerd's readiness probe: /ready answers 200 once the proxy holds its
// certificate.
func adminReady(ctx context.Context, sub substrate.Substrate, pod topology.Pod) error {
	r, err := mesh.ProbeHTTP(ctx, sub, pod, adminAddr, "", "/ready")
	if err != nil {
		return err
	}
	if r.Status != 200 {
		return fmt.Errorf("linkerd2-proxy admin /ready: HTTP %d %s", r.Status, strings.TrimSpace(r.Body))
	}
	return nil
}
