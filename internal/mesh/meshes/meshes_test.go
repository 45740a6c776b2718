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
)

// namedElsewhere are the string literals outside internal/mesh that may still spell a
// mesh's name, each with why: everything else a package needs to know about a mesh it
// asks the registry (mesh.Lookup, mesh.SMPType, mesh.KnownClusterMarks).
var namedElsewhere = map[string]string{
	// prereq is below the registry (mesh profiles import it); these are its own words.
	"internal/prereq/prereq.go: linkerd":     "`meshmark setup --for linkerd`: the need that builds Linkerd's images from its source for a local cluster",
	"internal/prereq/prereq.go: istio-proxy": "the directory of istio-proxy's Envoy bootstrap among the tools setup installs",
}

// TestNoMeshNamedOutsideItsPackage: no Go source of meshmark outside internal/mesh (and
// internal/published, which is data about published studies and names the meshes they
// measured) spells a registered profile's name or a mesh's sidecar container as a
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
				if rel == "internal/mesh" || rel == "internal/published" || d.Name() == "testdata" {
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
