package mesh

import (
	"io"
	"maps"
	"slices"
	"strings"
)

// KubernetesInstaller is implemented by profiles that can also be put on a Kubernetes
// cluster: there a profile is the mesh itself, installed the way its documentation
// recommends (Helm charts at a pinned version), rather than its data plane driven by
// meshmark's own control plane. The description is plain data, so that profiles need
// not know client-go; the Kubernetes substrate carries it out.
type KubernetesInstaller interface {
	Kubernetes() (KubernetesInstall, error)
}

// KubernetesInstall is how a mesh goes onto a cluster and how its enrollment shows.
type KubernetesInstall struct {
	// Charts are installed in order and uninstalled in reverse.
	Charts []HelmChart
	// Manifests are applied after the charts are ready, each into the namespace it
	// names: the mesh's configuration, such as a mesh-wide PeerAuthentication.
	Manifests []string
	// NamespaceLabels, NamespaceAnnotations and PodAnnotations enroll the workload.
	NamespaceLabels, NamespaceAnnotations, PodAnnotations map[string]string
	// Sidecar is the container the mesh adds to every enrolled pod (as a container or
	// as a native sidecar, an init container that keeps running); a pod without it is
	// not in the mesh. Empty for meshes without sidecars.
	Sidecar string
	// EnrolledAnnotations are what the mesh writes on every pod it enrolled (ambient's
	// CNI agent marks the pods it redirected); a pod without them is not in the mesh.
	EnrolledAnnotations map[string]string
	// Proxies are where the mesh's proxies serve their own counters on the cluster, so
	// that every trial stores what they carried, as the local profile's Telemetry does.
	Proxies []ProxyEndpoint
}

// ProxyEndpoint is a metrics endpoint that a mesh's proxies serve on their pods' own
// addresses, which the Kubernetes substrate reads through the API server's pod proxy
// (so that no pod need be reachable from where meshmark runs), and how to turn what it
// serves into the ProxyCounters the local substrate stores.
type ProxyEndpoint struct {
	// Component names the proxy among a trial's counters, as the local profile names it.
	Component string
	// Container, for sidecars: every pod of the app's namespace that carries it.
	Container string
	// Namespace and Labels, for node proxies: the pods of that namespace with those
	// labels, on the nodes that host the app's pods. Each is stored under its node's
	// name, as the local substrate stores a node proxy.
	Namespace string
	Labels    map[string]string
	// Port and Path are where the proxy serves its metrics on its pod's address.
	Port int
	Path string
	// Read parses one answer of the endpoint into the proxy's version, inbound counts,
	// counters and gauges; the substrate sets the component, pod and time.
	Read func(body io.Reader, of ProxyScrape) (ProxyCounters, error)
}

// ProxyScrape is what the substrate tells a ProxyEndpoint's Read about the proxy.
type ProxyScrape struct {
	// Service is the app's service whose pod the sidecar is in: empty for a node proxy,
	// and for a load generator's pod, which serves nothing.
	Service string
	// Namespace is the app's namespace and Services its services, for a node proxy,
	// which counts the traffic of every pod of its node.
	Namespace string
	Services  []string
}

// HelmChart is one chart of a mesh, pinned.
type HelmChart struct {
	Release, Namespace string
	// Chart is the chart's name in Repo, or a local chart directory when Repo is empty.
	Chart, Repo, Version string
	Values               map[string]any
}

// MergeHelmValues lays the values a study sets for each release ({release: {values}})
// over the charts' own, key by key, so that a user can set any chart value; option names
// the study option they came from, for errors.
func MergeHelmValues(charts []HelmChart, byRelease any, option string) error {
	if byRelease == nil {
		return nil
	}
	m, ok := byRelease.(map[string]any)
	if !ok {
		return &OptionError{Key: option, Msg: "want a map of release name to values"}
	}
	for release, v := range m {
		i := slices.IndexFunc(charts, func(ch HelmChart) bool { return ch.Release == release })
		if i < 0 {
			var names []string
			for _, ch := range charts {
				names = append(names, ch.Release)
			}
			return &OptionError{Key: option + "." + release, Msg: "no such release (releases: " + strings.Join(names, ", ") + ")"}
		}
		values, ok := v.(map[string]any)
		if !ok {
			return &OptionError{Key: option + "." + release, Msg: "want a map of chart values"}
		}
		charts[i].Values = mergeValues(charts[i].Values, values)
	}
	return nil
}

func mergeValues(into, from map[string]any) map[string]any {
	out := maps.Clone(into)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range from {
		sub, isMap := v.(map[string]any)
		have, hadMap := out[k].(map[string]any)
		if isMap && hadMap {
			out[k] = mergeValues(have, sub)
		} else {
			out[k] = v
		}
	}
	return out
}
