package results

import "time"

// InstallEffortConfig names the provenance config in which a run on Kubernetes records
// what installing a mesh took, once per install.
const InstallEffortConfig = "kubernetes-install.json"

// InstallEffort is what installing a mesh on a cluster took, as a user meets it: the
// "effort" of a mesh comparison.
type InstallEffort struct {
	Charts []InstalledChart `json:"charts"`
	// Manifests are the configuration objects applied after the charts.
	Manifests []string `json:"manifests,omitempty"`
	// Ready is from the start of the install until every object was ready.
	Ready time.Duration `json:"ready_ns"`
	// Objects counts the objects the install created (CRDs and manifests included), by
	// kind in Kinds.
	Objects int            `json:"objects"`
	Kinds   map[string]int `json:"kinds"`
	// CRDs lists the CustomResourceDefinitions the install added to the cluster.
	CRDs []string `json:"crds"`
	// Values counts the chart values set, by meshmark and by the study.
	Values int `json:"values"`
}

// InstalledChart is one Helm chart of an install, as pinned.
type InstalledChart struct {
	Release   string `json:"release"`
	Namespace string `json:"namespace"`
	Chart     string `json:"chart"`
	Repo      string `json:"repo,omitempty"`
	Version   string `json:"version,omitempty"`
}
