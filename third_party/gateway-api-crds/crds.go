// Package gatewayapicrds holds the Kubernetes Gateway API's standard-channel
// CustomResourceDefinitions of one release, copied unmodified (see README.md), as a chart
// of CRDs only. Istio's waypoint is a Gateway API Gateway, and Istio's documentation
// installs these CRDs from the release's standard-install.yaml when the cluster lacks
// them; meshmark installs the same files from this copy, so that no run needs GitHub
// and every run of a release installs the very same CRDs.
package gatewayapicrds

import (
	"embed"
	"io/fs"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/embedcopy"
)

const (
	// Version is the Gateway API release the CRDs come from: the one Istio 1.31 is
	// built against (its go.mod requires sigs.k8s.io/gateway-api v1.6.0).
	Version = "v1.6.0"
	// ModuleSum is the Go checksum database's hash of the module sigs.k8s.io/gateway-api
	// at Version, whose config/crd/standard the files were copied from.
	ModuleSum = "h1:735YBRj5NXFrOGX0GoSjwzUIzbz8kiEOfADsqHFmHgE="
	// Chart is the chart's name, as its Chart.yaml gives it.
	Chart = "gateway-api-crds"
	// GatewayCRD is the CRD of the Gateway kind, the one a waypoint needs.
	GatewayCRD = "gateways.gateway.networking.k8s.io"
	// InstallCommand installs the same CRDs as Istio's documentation does, from the
	// release on GitHub.
	InstallCommand = "kubectl apply --server-side -f https://github.com/kubernetes-sigs/gateway-api/releases/download/" + Version + "/standard-install.yaml"
)

//go:embed Chart.yaml crds
var files embed.FS

// FS is the chart: Chart.yaml and crds/.
func FS() fs.FS { return files }

// Dir returns the chart's directory, written under the user's cache directory
// the first time: Helm loads a chart from disk.
func Dir() (string, error) {
	return embedcopy.Dir(files, "gateway-api-crds-"+Version, filepath.Join("crds", "gateway.networking.k8s.io_gateways.yaml"))
}
