package cilium

import (
	"fmt"
	"io"
	"regexp"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
)

const (
	// Version is the Cilium release installed unless cilium_version says otherwise.
	Version = "1.19.6"
	// Repo is Cilium's Helm repository.
	Repo = "https://helm.cilium.io"
	// Namespace is where Cilium's chart installs, as its docs install it: the agents
	// and the operator are part of the cluster's own networking.
	Namespace = "kube-system"
	// Release is the Helm release, named as Cilium's docs name it; ValuesOption's map
	// takes it as its key.
	Release = "cilium"
	chart   = "cilium"

	// AgentMetricsPort and EnvoyMetricsPort are where the agent and cilium-envoy serve
	// Prometheus metrics (the chart's prometheus.port and envoy.prometheus.port), on
	// their pods' addresses, which are their nodes' (both run on the host network).
	AgentMetricsPort = 9962
	EnvoyMetricsPort = 9964

	// AgentComponent and EnvoyComponent name the two among a trial's counters.
	AgentComponent = "cilium-agent"
	EnvoyComponent = "cilium-envoy"

	// ipsecSecret holds the IPsec keys, made by the user as Cilium's IPsec guide shows.
	ipsecSecret = "cilium-ipsec-keys"
)

// agentLabels and envoyLabels select the chart's agent and cilium-envoy pods, one per
// node; partOf is on every pod the chart makes.
var (
	agentLabels = map[string]string{"k8s-app": "cilium"}
	envoyLabels = map[string]string{"k8s-app": "cilium-envoy"}
	partOf      = map[string]string{"app.kubernetes.io/part-of": "cilium"}
)

var release = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// otherNetworks are the DaemonSets of the pod networks (CNIs) a cluster is commonly
// made with. Cilium is a pod network too: installed beside one of them it breaks both.
var otherNetworks = []struct{ daemonSet, what string }{
	{"kindnet", "kind's default CNI"},
	{"calico-node", "Calico"},
	{"canal", "Canal (Calico with Flannel)"},
	{"kube-flannel-ds", "Flannel"},
	{"aws-node", "the Amazon VPC CNI"},
	{"weave-net", "Weave Net"},
	{"antrea-agent", "Antrea"},
	{"kube-router", "kube-router"},
	{"cilium", "a Cilium that meshmark did not install"},
}

// noOtherNetwork is the refusal of a cluster that runs another pod network.
const noOtherNetwork = "Cilium is the cluster's pod network (its CNI), and installed beside another one it breaks both. " +
	"Run it on a cluster created without a CNI: with kind, networking.disableDefaultCNI: true " +
	"(and kubeProxyMode: none for Cilium's kube-proxy replacement); see docs/kubernetes.md, \"Cilium\""

// Kubernetes describes the Cilium install this configuration stands for.
func (p *Profile) Kubernetes() (meshkube.KubernetesInstall, error) {
	o := p.opts
	ch := meshkube.HelmChart{Release: Release, Namespace: Namespace, Chart: chart, Repo: Repo, Version: Version}
	if v, ok := o.Own[VersionOption]; ok {
		ch.Version = fmt.Sprint(v)
		if !release.MatchString(ch.Version) {
			return meshkube.KubernetesInstall{}, &mesh.OptionError{Key: VersionOption, Msg: fmt.Sprintf("%q is not a Cilium release like %s", ch.Version, Version)}
		}
	}
	if v, ok := o.Own[ChartOption]; ok {
		dir, _ := v.(string)
		if dir == "" {
			return meshkube.KubernetesInstall{}, &mesh.OptionError{Key: ChartOption, Msg: "want the directory of a copy of the cilium chart, as helm pull cilium/cilium --untar makes it"}
		}
		ch.Chart, ch.Repo, ch.Version = dir, "", ""
	}
	// The agent serves its metrics only when asked; they are the trial's counters.
	ch.Values = map[string]any{"prometheus": map[string]any{"enabled": true}}
	var requires []meshkube.ClusterRequirement
	for _, n := range otherNetworks {
		requires = append(requires, meshkube.ClusterRequirement{Kind: "DaemonSet", Name: n.daemonSet, Absent: true,
			Why: n.what + " runs on this cluster. " + noOtherNetwork})
	}
	switch p.encryption {
	case EncryptionWireGuard, EncryptionIPsec:
		ch.Values["encryption"] = map[string]any{"enabled": true, "type": p.encryption}
	}
	if p.encryption == EncryptionIPsec {
		requires = append(requires, meshkube.ClusterRequirement{Kind: "Secret", Namespace: Namespace, Name: ipsecSecret,
			Why: "Cilium's IPsec reads its keys from it, and its agents do not start without it: create it as Cilium's IPsec guide does, " +
				`kubectl create -n kube-system secret generic cilium-ipsec-keys --from-literal=keys="3+ rfc4106(gcm(aes)) $(dd if=/dev/urandom count=20 bs=1 2>/dev/null | xxd -p -c 64) 128"`})
	}
	if !p.l7 {
		// Without the L7 proxy the chart leaves out cilium-envoy too.
		ch.Values["l7Proxy"] = false
	}
	var manifests []string
	if p.mutualAuth {
		ch.Values["authentication"] = map[string]any{"enabled": true, "mutual": map[string]any{"spire": map[string]any{
			"enabled": true, "install": map[string]any{"enabled": true}}}}
		manifests = append(manifests, mutualAuthPolicy)
	}
	charts := []meshkube.HelmChart{ch}
	if err := mesh.MergeHelmValues(charts, o.Own[ValuesOption], ValuesOption); err != nil {
		return meshkube.KubernetesInstall{}, err
	}
	proxies := []meshkube.ProxyEndpoint{{Component: AgentComponent, Namespace: Namespace, Labels: agentLabels,
		Port: AgentMetricsPort, Path: "/metrics", Read: ReadAgentMetrics}}
	if p.l7 {
		// cilium-envoy's metrics listener answers /metrics with Envoy's
		// /stats/prometheus.
		proxies = append(proxies, meshkube.ProxyEndpoint{Component: EnvoyComponent, Namespace: Namespace, Labels: envoyLabels,
			Port: EnvoyMetricsPort, Path: "/metrics", Read: ReadEnvoyMetrics})
	}
	return meshkube.KubernetesInstall{
		Charts:    charts,
		Manifests: manifests,
		// No label and no sidecar: a pod is in Cilium's datapath when its node's agent
		// is ready, since the agent's CNI plugin wired it.
		NodeAgents:     []meshkube.NodeAgent{{Component: AgentComponent, Namespace: Namespace, Labels: agentLabels}},
		Requires:       requires,
		ClusterNetwork: true,
		OwnPodLabels:   partOf,
		Proxies:        proxies,
	}, nil
}

// mutualAuthPolicy requires SPIRE mutual authentication for every connection between
// meshmark's pods, as Cilium's mutual-authentication docs require it of an app with a
// CiliumNetworkPolicy: cluster-wide, since the app's namespace does not exist yet when
// the mesh's configuration is applied. Other ingress to those pods is left to Cilium's
// defaults for a selected endpoint (its node, hence the kubelet's probes, is allowed).
const mutualAuthPolicy = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: meshmark-mutual-auth
spec:
  endpointSelector:
    matchLabels:
      app.kubernetes.io/managed-by: meshmark
  ingress:
    - fromEndpoints:
        - matchLabels:
            app.kubernetes.io/managed-by: meshmark
      authentication:
        mode: required
`

// The agent's series a trial reads beyond keeping them: its release, and what its L7
// proxy handled.
const (
	agentVersion = "cilium_version"
)

// ReadAgentMetrics reads one cilium agent's /metrics (meshkube.ProxyEndpoint): every
// counter and gauge it serves (what its datapath forwarded and dropped per direction,
// cilium_forward_count_total and cilium_drop_count_total; what its L7 proxy handled,
// cilium_policy_l7_total; its endpoints), and its release from cilium_version. The agent
// counts per node, not per service, so it has no inbound counts: the trial keeps what
// it counted, and the check that the entry service's proxies counted every request has
// nothing to hold Cilium to.
func ReadAgentMetrics(body io.Reader, _ meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	var version string
	pc, err := mesh.ReadPrometheusText(body, func(name string, labels map[string]string, _ float64) {
		if name == agentVersion {
			version = labels["version"]
		}
	})
	if err != nil {
		return meshkube.ProxyCounters{}, fmt.Errorf("cilium agent metrics: %w", err)
	}
	pc.Version = version
	return pc, nil
}

// ReadEnvoyMetrics reads one cilium-envoy's /metrics (meshkube.ProxyEndpoint), Envoy's own
// statistics in Prometheus format (envoy_*, Cilium's own under envoy_cilium_*): every
// counter and gauge, kept per node. As the agent, it counts no service.
func ReadEnvoyMetrics(body io.Reader, _ meshkube.ProxyScrape) (meshkube.ProxyCounters, error) {
	pc, err := mesh.ReadPrometheusText(body, nil)
	if err != nil {
		return meshkube.ProxyCounters{}, fmt.Errorf("cilium-envoy metrics: %w", err)
	}
	return pc, nil
}
