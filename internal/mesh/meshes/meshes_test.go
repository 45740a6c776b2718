package meshes

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/published"
)

// namedElsewhere are the string literals outside internal/mesh that may still spell a
// mesh's name, each with why: everything else a package needs to know about a mesh it
// asks the registry (mesh.Lookup, mesh.SMPType, mesh.KnownClusterMarks).
var namedElsewhere = map[string]string{
	// prereq is below the registry (mesh profiles import it); these are its own words.
	"internal/prereq/prereq.go: linkerd":     "`meshmark setup --for linkerd`: the need that builds Linkerd's images from its source for a local cluster",
	"internal/prereq/prereq.go: istio-proxy": "the directory of istio-proxy's Envoy bootstrap among the tools setup installs",
	// published names the meshes the studies measured; two share a profile's name.
	"internal/published/published.go: linkerd": "Linkerd as S2, S4 and S5 measured it: a study's role, which the linkerd profile's Stand names",
	"internal/published/published.go: cilium":  "Cilium as S5 measured it: a study's role, which the cilium and cilium-envoy profiles' Stands name",
}

// TestNoMeshNamedOutsideItsPackage: no Go source of meshmark outside internal/mesh
// spells a registered profile's name or a mesh's sidecar container as a
// string literal, so that adding or changing a mesh touches its own package only. The
// baseline's name, "none", is a common word (a mount's type, an empty answer): it is
// looked for only where a Profile is compared with it, and the packages that mean the
// baseline name it study.ProfileNone (none.Name) or results.BaselineProfile.
func TestNoMeshNamedOutsideItsPackage(t *testing.T) {
	forbidden := map[string]string{}
	for _, n := range mesh.Names() {
		if n != "none" {
			forbidden[n] = "profile " + n
		}
	}
	known := mesh.KnownClusterMarks()
	for _, s := range known.Sidecars {
		forbidden[s] = "a mesh's sidecar container"
	}
	if len(forbidden) < 6 || len(known.Sidecars) < 2 {
		t.Fatalf("the registry knows only %v: the meshes are not all linked in", forbidden)
	}

	root := filepath.Join("..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("not run from the module's internal/mesh/meshes: %v", err)
	}
	var leaks []string
	used := map[string]bool{}
	files := 0
	for _, top := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if rel == "internal/mesh" || d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			files++
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				// The baseline's name is a common word, so it is looked for only where a
				// profile is compared with it.
				if cmp, ok := n.(*ast.BinaryExpr); ok && (cmp.Op == token.EQL || cmp.Op == token.NEQ) {
					for _, side := range [][2]ast.Expr{{cmp.X, cmp.Y}, {cmp.Y, cmp.X}} {
						sel, isSel := side[0].(*ast.SelectorExpr)
						lit, isLit := side[1].(*ast.BasicLit)
						if isSel && isLit && sel.Sel.Name == "Profile" && lit.Value == `"none"` {
							leaks = append(leaks, fset.Position(lit.Pos()).String()+`: a profile compared with "none" (use study.ProfileNone or results.BaselineProfile)`)
						}
					}
				}
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				what, bad := forbidden[s]
				if !bad {
					return true
				}
				if _, ok := namedElsewhere[rel+": "+s]; ok {
					used[rel+": "+s] = true
					return true
				}
				leaks = append(leaks, fset.Position(lit.Pos()).String()+": "+strconv.Quote(s)+" ("+what+")")
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 100 {
		t.Fatalf("only %d Go files read: the walk missed the sources", files)
	}
	sort.Strings(leaks)
	for _, l := range leaks {
		t.Errorf("%s: a mesh named outside internal/mesh; register the fact with the profile and ask the registry", l)
	}
	for k := range namedElsewhere {
		if !used[k] {
			t.Errorf("namedElsewhere %q is no longer needed: remove it", k)
		}
	}
}

// TestSubstratesImportNoMeshProfile: the substrates sit below the mesh profiles, which
// drive them; what a profile tells the Kubernetes substrate is plain data in meshkube,
// and what the in-pod probes share is meshprobe, two packages that import nothing of
// meshmark's mesh layer. A substrate that imported the registry or a profile would run
// an arrow back up, and every mesh change would rebuild it.
func TestSubstratesImportNoMeshProfile(t *testing.T) {
	const module = "github.com/meshmark/meshmark/"
	allowed := map[string]bool{module + "internal/mesh/meshkube": true, module + "internal/mesh/meshprobe": true}
	root := filepath.Join("..", "..", "..")
	files := 0
	err := filepath.WalkDir(filepath.Join(root, "internal", "substrate"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if (p == module+"internal/mesh" || strings.HasPrefix(p, module+"internal/mesh/")) && !allowed[p] {
				t.Errorf("%s imports %s", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("only %d files under internal/substrate read", files)
	}
}

// TestProfilesStandForThePublishedMeshes: each published study's roles are taken by the
// profiles' own registered stands: S1's Istio and App Mesh by the Envoy sidecar with
// mTLS on and off, S4's three meshes, S5's Cilium by the node proxy with the reason it is
// not Cilium; and a role no profile here stands for is named in the message.
func TestProfilesStandForThePublishedMeshes(t *testing.T) {
	meshOf := func(label, profile string, options map[string]string) published.Mesh {
		return published.Mesh{Label: label, Stands: mesh.StandsOf(profile), Options: options}
	}
	roles := func(id string, meshes ...published.Mesh) map[string]published.Assignment {
		out := map[string]published.Assignment{}
		for _, a := range published.Lookup(id).Assign(meshes, "base") {
			out[a.Role] = a
		}
		return out
	}
	base := meshOf("base", "none", nil)
	s1 := roles("S1", base, meshOf("appmesh-like", "envoy-sidecar", map[string]string{"mtls": "off"}),
		meshOf("istio-like", "envoy-sidecar", map[string]string{"mtls": "strict"}))
	if s1["istio"].Mesh != "istio-like" || s1["appmesh"].Mesh != "appmesh-like" || !strings.Contains(s1["appmesh"].Unlike, "App Mesh") {
		t.Errorf("S1: %+v", s1)
	}
	s4 := roles("S4", base, meshOf("t", "traefik-mesh", nil), meshOf("l", "linkerd", nil), meshOf("i", "envoy-sidecar", nil))
	if s4["istio"].Mesh != "i" || s4["linkerd"].Mesh != "l" || s4["traefik"].Mesh != "t" {
		t.Errorf("S4: %+v", s4)
	}
	s5 := roles("S5", base, meshOf("c", "cilium-envoy", nil), meshOf("a", "istio-ambient", nil))
	if s5["cilium"].Mesh != "c" || !strings.Contains(s5["cilium"].Unlike, "eBPF") || s5["istio"].Mesh != "" {
		t.Errorf("S5: %+v", s5)
	}
	if got := mesh.StandingFor(published.Lookup("S1").Role("istio")); got != "envoy-sidecar with mtls on" {
		t.Errorf("who can stand for S1's Istio: %q", got)
	}
}
