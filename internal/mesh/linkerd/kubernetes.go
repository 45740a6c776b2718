package linkerd

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/pki"
	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
)

// On Kubernetes the profile is Linkerd itself, installed as Linkerd's Helm docs install
// it: the linkerd-crds chart, then linkerd-control-plane, into the linkerd namespace,
// with a trust anchor and an identity issuer made by meshmark's PKI where the docs make
// them with step.
const (
	// KubeNamespace is where Linkerd's control plane runs.
	KubeNamespace = "linkerd"
	// Sidecar is the container Linkerd's proxy injector adds to every pod it meshes (a
	// native sidecar by default: an init container that keeps running).
	Sidecar = "linkerd-proxy"
	// InjectAnnotation asks the proxy injector to mesh the pods of a namespace (or a
	// pod).
	InjectAnnotation = "linkerd.io/inject"

	// EdgeRepo is Linkerd's Helm repository for edge releases, which are the ones
	// published as charts.
	EdgeRepo = "https://helm.linkerd.io/edge"

	VersionOption = "linkerd_version"
	RepoOption    = "linkerd_repo"
	ChartsOption  = "linkerd_charts"
	ValuesOption  = "helm_values"

	crdsRelease         = "linkerd-crds"
	controlPlaneRelease = "linkerd-control-plane"
)

// kubeOptions are the options of the profile that only Kubernetes reads.
var kubeOptions = map[string]string{
	VersionOption: "on Kubernetes: the Linkerd release installed, an edge tag like " + linkerdcharts.Tag + " (default; its charts are vendored in meshmark)",
	RepoOption:    "on Kubernetes: a Helm repository to install linkerd_version's charts from instead of meshmark's copy, e.g. " + EdgeRepo,
	ChartsOption:  "on Kubernetes: a directory holding a linkerd2 release's charts/ (linkerd-crds, linkerd-control-plane, partials) to install from instead of meshmark's copy",
	ValuesOption:  "on Kubernetes: chart values by release, {linkerd-crds: {...}, linkerd-control-plane: {...}}, over meshmark's own",
}

var edgeTag = regexp.MustCompile(`^edge-([0-9]{2})\.([0-9]{1,2})\.([0-9]+)$`)

var _ mesh.KubernetesInstaller = (*Profile)(nil)

// Kubernetes describes the Linkerd install this configuration stands for. Each call
// makes a new trust anchor and issuer, as each local Install makes a new CA, so no two
// installs share a key. Options Linkerd on Kubernetes does not get from meshmark yet
// are refused rather than dropped, so that a result never claims a setting the cluster
// did not have.
func (p *Profile) Kubernetes() (meshkube.KubernetesInstall, error) {
	o, def := p.opts, mesh.DefaultOptions()
	if len(p.authz) > 0 {
		return meshkube.KubernetesInstall{}, &mesh.OptionError{Key: "authz", Msg: "not carried over to Linkerd yet: it would be a Server and an AuthorizationPolicy in the app's namespace, which meshmark does not apply there"}
	}
	charts, err := p.kubeCharts()
	if err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	certs, err := identityValues(o.TrustDomain)
	if err != nil {
		return meshkube.KubernetesInstall{}, fmt.Errorf("%s: %w", Name, err)
	}
	cp := &charts[1]
	if cp.Values == nil {
		cp.Values = map[string]any{}
	}
	maps.Copy(cp.Values, certs)
	proxy := map[string]any{}
	if p.mode == mesh.MTLSStrict {
		// Linkerd's cluster-wide default policy: a pod that no Server selects accepts
		// only mTLS from meshed peers, as the local profile's strict mode does.
		proxy["defaultInboundPolicy"] = "all-authenticated"
	}
	if o.Concurrency != def.Concurrency {
		proxy["runtime"] = map[string]any{"workers": map[string]any{"minimum": o.Concurrency}}
	}
	if o.AccessLog {
		proxy["accessLog"] = "apache"
	}
	if len(proxy) > 0 {
		cp.Values["proxy"] = proxy
	}
	if o.TrustDomain != def.TrustDomain {
		cp.Values["identityTrustDomain"] = o.TrustDomain
	}
	if err := mesh.MergeHelmValues(charts, o.Own[ValuesOption], ValuesOption); err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	enroll := map[string]string{InjectAnnotation: "enabled"}
	var appManifests []string
	if p.mode == mesh.MTLSStrict {
		appManifests = append(appManifests, adminServer)
	}
	return meshkube.KubernetesInstall{
		AppManifests: appManifests,
		// linkerd-init writes each meshed pod's iptables with NET_ADMIN and NET_RAW, the
		// control plane's pods' included, which Pod Security's baseline level refuses
		// (Linkerd's CNI plugin, which would avoid it, is not installed).
		PrivilegedNamespaces: []string{KubeNamespace},
		NamespaceLabels:      map[string]string{meshkube.PodSecurityEnforce: meshkube.PodSecurityPrivileged},
		Charts:               charts,
		NamespaceAnnotations: enroll,
		// On the pods too, which Linkerd's injector honours the same way: the namespace
		// annotation alone reaches only a substrate that sets namespace annotations.
		PodAnnotations: maps.Clone(enroll),
		Sidecar:        Sidecar,
		// The proxy's admin server, which proxy-init leaves out of the redirection
		// and which serves /metrics on the pod's address, as Prometheus scrapes it.
		Proxies:         []meshkube.ProxyEndpoint{{Component: Component, Container: Sidecar, Port: AdminPort, Path: "/metrics", Read: readKubeMetrics}},
		ForLocalCluster: ForLocalCluster,
	}, nil
}

// adminServer opens each meshed pod's proxy admin port (linkerd-admin, 4191) to
// unauthenticated clients, in the app's namespace. Linkerd's policy applies to the admin
// server's port too: under the all-authenticated default (strict mTLS) it answers the
// API server's pod proxy, which reads each proxy's /metrics in plaintext as a trial's
// proxy counters, with 403, and only the pod's own HTTP probe paths are authorized
// there by default (the policy controller's pod_http_probes). The app's ports keep the
// default policy, so the plaintext the probe sends them is still refused. Admin routes
// that change the proxy answer only callers on the pod's loopback whatever the policy.
const adminServer = `apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata:
  name: meshmark-proxy-admin
spec:
  podSelector:
    matchExpressions:
      - {key: linkerd.io/control-plane-ns, operator: Exists}
  port: linkerd-admin
  proxyProtocol: HTTP/1
  accessPolicy: all-unauthenticated
`

// kubeCharts are the two charts pinned to the release the options name, from
// meshmark's vendored copy, a local copy or a Helm repository.
func (p *Profile) kubeCharts() ([]meshkube.HelmChart, error) {
	o := p.opts
	version := linkerdcharts.Tag
	if v, ok := o.Own[VersionOption]; ok {
		version = fmt.Sprint(v)
	}
	m := edgeTag.FindStringSubmatch(version)
	if m == nil {
		return nil, &mesh.OptionError{Key: VersionOption, Msg: fmt.Sprintf("%q is not a Linkerd edge release like %s (edge releases are the ones Linkerd publishes as charts)", version, linkerdcharts.Tag)}
	}
	repo, _ := o.Own[RepoOption].(string)
	dir, _ := o.Own[ChartsOption].(string)
	if _, ok := o.Own[RepoOption]; ok && repo == "" {
		return nil, &mesh.OptionError{Key: RepoOption, Msg: "want the URL of a Helm repository, like " + EdgeRepo}
	}
	if _, ok := o.Own[ChartsOption]; ok && dir == "" {
		return nil, &mesh.OptionError{Key: ChartsOption, Msg: "want a directory holding linkerd-crds, linkerd-control-plane and partials"}
	}
	if repo != "" && dir != "" {
		return nil, &mesh.OptionError{Key: RepoOption, Msg: "give " + RepoOption + " or " + ChartsOption + ", not both"}
	}
	crds := meshkube.HelmChart{Release: crdsRelease, Namespace: KubeNamespace, Chart: linkerdcharts.CRDs,
		// The Gateway API route CRDs Linkerd's policy controller watches; Linkerd's
		// install docs have linkerd-crds add them where the cluster has none.
		Values: map[string]any{"installGatewayAPI": true}}
	cp := meshkube.HelmChart{Release: controlPlaneRelease, Namespace: KubeNamespace, Chart: linkerdcharts.ControlPlane}
	if repo != "" {
		// Linkerd publishes edge-YY.M.N's charts as version 20YY.M.N.
		chartVersion := "20" + m[1] + "." + m[2] + "." + m[3]
		crds.Repo, crds.Version = repo, chartVersion
		cp.Repo, cp.Version = repo, chartVersion
		return []meshkube.HelmChart{crds, cp}, nil
	}
	if dir == "" {
		if version != linkerdcharts.Tag {
			return nil, &mesh.OptionError{Key: VersionOption, Msg: fmt.Sprintf("meshmark carries the charts of Linkerd %s only (third_party/linkerd-charts); for %s name a Helm repository with %s (%s) or a copy of that release's charts/ with %s",
				linkerdcharts.Tag, version, RepoOption, EdgeRepo, ChartsOption)}
		}
		var err error
		if dir, err = linkerdcharts.Dir(); err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
	}
	crds.Chart, cp.Chart = filepath.Join(dir, linkerdcharts.CRDs), filepath.Join(dir, linkerdcharts.ControlPlane)
	// Charts from Linkerd's source name their images' tag linkerdVersionValue, which
	// Linkerd's release job replaces with the release when it packages them; a packaged
	// chart from the repository has it already.
	cp.Values = map[string]any{"linkerdVersion": version}
	return []meshkube.HelmChart{crds, cp}, nil
}

// identityValues are the certificates Linkerd's identity controller needs, as its docs
// make them: a trust anchor (root.linkerd.<trust domain>) and an issuer for
// identity.linkerd.<trust domain> that it signs, ECDSA P-256.
func identityValues(trustDomain string) (map[string]any, error) {
	anchor, err := pki.NewTrustAnchor(trustDomain, "root.linkerd."+trustDomain, 0)
	if err != nil {
		return nil, err
	}
	issuer, err := anchor.NewIntermediate(IssuerName(trustDomain), 0)
	if err != nil {
		return nil, err
	}
	key, err := issuer.KeyPEM()
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"identityTrustAnchorsPEM": string(anchor.CertPEM()),
		"identity": map[string]any{"issuer": map[string]any{"tls": map[string]any{
			"crtPEM": string(issuer.CertPEM()),
			"keyPEM": string(key),
		}}},
	}, nil
}

// IssuerName is the name Linkerd's identity controller requires of its issuer
// certificate.
func IssuerName(trustDomain string) string {
	return "identity." + KubeNamespace + "." + strings.TrimSuffix(trustDomain, ".")
}

func withKubeOptions(own map[string]string) map[string]string {
	maps.Copy(own, kubeOptions)
	return own
}
