package study

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// builtinFS holds the studies that ship inside the binary; examples/demo.yaml is a
// copy of builtin/demo.yaml, kept identical by a test.
//
//go:embed builtin/*.yaml
var builtinFS embed.FS

// BuiltinNames lists the embedded studies.
func BuiltinNames() []string {
	entries, _ := fs.ReadDir(builtinFS, "builtin")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

func isBuiltin(name string) bool {
	for _, n := range BuiltinNames() {
		if n == name {
			return true
		}
	}
	return false
}

// Builtin parses the embedded study of that name, e.g. "demo".
func Builtin(name string) (*Study, error) {
	if !isBuiltin(name) {
		return nil, fmt.Errorf("no built-in study %q (have: %s)", name, strings.Join(BuiltinNames(), ", "))
	}
	data, err := builtinFS.ReadFile(path.Join("builtin", name+".yaml"))
	if err != nil {
		return nil, err
	}
	return Parse("builtin:"+name, data)
}
