// Package linkerdcharts holds Linkerd's own Helm charts (linkerd-crds,
// linkerd-control-plane and the library chart partials they both depend on), vendored
// unmodified from one Linkerd release (see README.md), so that meshmark installs Linkerd
// on a cluster that cannot reach Linkerd's Helm repository, and every run of a release
// installs the very same chart files.
package linkerdcharts

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
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
func Digest() string {
	h := sha256.New()
	var paths []string
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			paths = append(paths, p)
		}
		return err
	})
	sort.Strings(paths)
	for _, p := range paths {
		b, _ := files.ReadFile(p)
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Dir returns a directory holding the charts, written under the user's cache directory
// (the temporary directory when there is none) the first time: Helm loads a chart and
// resolves its file:// dependency from disk. The directory is named by the charts'
// digest, so a copy on disk is never another release's or a modified one's.
func Dir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil || os.MkdirAll(base, 0o755) != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "meshmark", "linkerd-charts-"+Tag+"-"+Digest()[:12])
	if _, err := os.Stat(filepath.Join(dir, ControlPlane, "Chart.yaml")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("linkerd charts: %w", err)
	}
	// Written beside and renamed into place, so that a concurrent or interrupted
	// extraction never leaves a half-written copy under the final name.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".linkerd-charts-")
	if err != nil {
		return "", fmt.Errorf("linkerd charts: %w", err)
	}
	defer os.RemoveAll(tmp)
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("linkerd charts: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, ControlPlane, "Chart.yaml")); serr == nil {
			return dir, nil // another process put it there first
		}
		return "", fmt.Errorf("linkerd charts: %w", err)
	}
	return dir, nil
}
