// Package linkerdcharts holds Linkerd's own Helm charts (linkerd-crds,
// linkerd-control-plane and the library chart partials they both depend on), vendored
// unmodified from one Linkerd release (see README.md), so that meshmark installs Linkerd
// on a cluster that cannot reach Linkerd's Helm repository, and every run of a release
// installs the very same chart files.
package linkerdcharts

import (
	"embed"
	"io/fs"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/embedcopy"
)

const (
	// Tag is the linkerd2 release the charts come from; its proxy is linkerd2-proxy
	// v2.366.0, the release meshmark's local Linkerd profile runs.
	Tag = "edge-26.8.3"
	// Commit is that tag's commit in github.com/linkerd/linkerd2.
	Commit = "19a0d90d5a4a65e0b976f079ba8a5f1dab12c005"
	// ChartVersion is the version Linkerd's edge Helm repository gives this release's
	// charts (edge-YY.M.N is published as 20YY.M.N); the source files say
	// 0.0.0-undefined, which Linkerd's release job rewrites when it packages them.
	ChartVersion = "2026.8.3"
)

// The chart directories, as the linkerd2 repository lays them out under charts/, so
// that their dependency file://../partials resolves.
const (
	CRDs         = "linkerd-crds"
	ControlPlane = "linkerd-control-plane"
	Partials     = "partials"
)

// all: keeps the charts' .helmignore and partials' _*.tpl, which embed leaves out
// otherwise.
//
//go:embed all:linkerd-crds all:linkerd-control-plane all:partials
var files embed.FS

// FS is the three chart directories.
func FS() fs.FS { return files }

// Digest is a SHA-256 over every vendored chart file's path and contents.
func Digest() string { return embedcopy.Digest(files) }

// Dir returns a directory holding the charts, written under the user's cache directory
// (the temporary directory when there is none) the first time: Helm loads a chart and
// resolves its file:// dependency from disk. The directory is named by the charts'
// digest, so a copy on disk is never another release's or a modified one's.
func Dir() (string, error) {
	return embedcopy.Dir(files, "linkerd-charts-"+Tag, filepath.Join(ControlPlane, "Chart.yaml"))
}
