package mesh

import (
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
