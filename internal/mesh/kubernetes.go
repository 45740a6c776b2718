package mesh

import (
	"fmt"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
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
	Kubernetes() (meshkube.KubernetesInstall, error)
}

// MergeHelmValues lays the values a study sets for each release ({release: {values}})
// over the charts' own, key by key, so that a user can set any chart value; option names
// the study option they came from, for errors.
func MergeHelmValues(charts []meshkube.HelmChart, byRelease any, option string) error {
	if byRelease == nil {
		return nil
	}
	m, ok := byRelease.(map[string]any)
	if !ok {
		return &OptionError{Key: option, Msg: "want a map of release name to values"}
	}
	for release, v := range m {
		i := slices.IndexFunc(charts, func(ch meshkube.HelmChart) bool { return ch.Release == release })
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
		charts[i].Values = MergeValues(charts[i].Values, values)
	}
	return nil
}

// MergeValues lays from over into, key by key and recursively into maps: from wins.
func MergeValues(into, from map[string]any) map[string]any {
	out := maps.Clone(into)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range from {
		sub, isMap := v.(map[string]any)
		have, hadMap := out[k].(map[string]any)
		if isMap && hadMap {
			out[k] = MergeValues(have, sub)
		} else {
			out[k] = v
		}
	}
	return out
}

// marksAgree says which key of m a registered mesh sets to another value: one mesh's
// opt-out would then undo another's, or a gateway label mean two things.
func marksAgree(m meshkube.ClusterMarks, registry map[string]Registration) error {
	for name, r := range registry {
		o := r.OnCluster
		for _, pair := range [][2]map[string]string{
			{m.GatewayPodLabels, o.GatewayPodLabels},
			{m.Outside.NamespaceLabels, o.Outside.NamespaceLabels}, {m.Outside.NamespaceAnnotations, o.Outside.NamespaceAnnotations},
			{m.Outside.PodLabels, o.Outside.PodLabels}, {m.Outside.PodAnnotations, o.Outside.PodAnnotations},
		} {
			for k, v := range pair[0] {
				if w, ok := pair[1][k]; ok && w != v {
					return fmt.Errorf("%s=%q, which profile %s sets to %q", k, v, name, w)
				}
			}
		}
	}
	return nil
}
