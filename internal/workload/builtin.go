package workload

import (
	"embed"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

//go:embed builtin/*.yaml
var builtinFS embed.FS

// maxGeneratedServices bounds chain-N and fanout-N.
const maxGeneratedServices = 1000

// fileBuiltins are the built-in graphs kept as files under builtin/.
var fileBuiltins = []string{"bookinfo", "emojivoto", "online-boutique", "teastore"}

// BuiltinNames lists the built-in graphs; chain-N and fanout-N take any N from 1 to 1000.
func BuiltinNames() []string {
	return append(slices.Clone(fileBuiltins), "chain-N", "fanout-N")
}

// Builtin returns a built-in graph by name (see BuiltinNames), optionally followed by
// options, e.g. "bookinfo:replicas=3".
func Builtin(name string) (*Graph, error) {
	base, opts, _ := strings.Cut(name, ":")
	var src []byte
	switch {
	case slices.Contains(fileBuiltins, base):
		data, err := builtinFS.ReadFile("builtin/" + base + ".yaml")
		if err != nil {
			return nil, err
		}
		src = data
	case strings.HasPrefix(base, "chain-"):
		n, err := generatedSize(base, "chain-")
		if err != nil {
			return nil, err
		}
		src = chainYAML(n)
	case strings.HasPrefix(base, "fanout-"):
		n, err := generatedSize(base, "fanout-")
		if err != nil {
			return nil, err
		}
		src = fanoutYAML(n)
	default:
		return nil, fmt.Errorf("unknown built-in graph %q (built-ins: %s)", base, strings.Join(BuiltinNames(), ", "))
	}
	g, err := Parse("builtin:"+base, src)
	if err != nil {
		return nil, fmt.Errorf("built-in graph %s is broken: %w", base, err)
	}
	if opts != "" {
		for _, opt := range strings.Split(opts, ",") {
			key, val, _ := strings.Cut(opt, "=")
			switch key {
			case "replicas":
				n, err := strconv.Atoi(val)
				if err != nil || n < 1 || n > maxReplicas {
					return nil, fmt.Errorf("built-in graph %q: replicas=%q: want a whole number from 1 to %d", name, val, maxReplicas)
				}
				g.SetReplicas(n)
			default:
				return nil, fmt.Errorf("built-in graph %q: unknown option %q (known: replicas=N)", name, opt)
			}
		}
	}
	g.Origin = name
	return g, nil
}

// BuiltinYAML returns the graph file of a built-in (without options), for users who want
// to start their own graph from one.
func BuiltinYAML(name string) ([]byte, error) {
	base, _, _ := strings.Cut(name, ":")
	if _, err := Builtin(base); err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(base, "chain-"):
		n, _ := generatedSize(base, "chain-")
		return chainYAML(n), nil
	case strings.HasPrefix(base, "fanout-"):
		n, _ := generatedSize(base, "fanout-")
		return fanoutYAML(n), nil
	}
	return builtinFS.ReadFile("builtin/" + base + ".yaml")
}

// Load returns the graph in a file or, when no such file exists and the argument names
// a built-in graph, that built-in.
func Load(pathOrBuiltin string) (*Graph, error) {
	looksLikeFile := strings.ContainsRune(pathOrBuiltin, os.PathSeparator) ||
		strings.HasSuffix(pathOrBuiltin, ".yaml") || strings.HasSuffix(pathOrBuiltin, ".yml")
	if _, err := os.Stat(pathOrBuiltin); err == nil || looksLikeFile {
		return ParseFile(pathOrBuiltin)
	}
	g, err := Builtin(pathOrBuiltin)
	if err != nil {
		return nil, fmt.Errorf("%q is neither a graph file nor a built-in graph: %w", pathOrBuiltin, err)
	}
	return g, nil
}

func generatedSize(name, prefix string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
	if err != nil || n < 1 || n > maxGeneratedServices || strconv.Itoa(n) != strings.TrimPrefix(name, prefix) {
		return 0, fmt.Errorf("built-in graph %q: want %sN with N from 1 to %d", name, prefix, maxGeneratedServices)
	}
	return n, nil
}

// chainYAML is svc-0 → svc-1 → … → svc-(n-1).
func chainYAML(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "name: chain-%d\ndefaults:\n  responseSize: 1KiB\nservices:\n", n)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: svc-%d\n", i)
		if i == 0 {
			b.WriteString("    isEntrypoint: true\n")
		}
		if i+1 < n {
			fmt.Fprintf(&b, "    script:\n      - call: svc-%d\n", i+1)
		}
	}
	return []byte(b.String())
}

// fanoutYAML is root calling leaf-0 … leaf-(n-1) all at once.
func fanoutYAML(n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "name: fanout-%d\ndefaults:\n  responseSize: 1KiB\nservices:\n  - name: root\n    isEntrypoint: true\n    script:\n", n)
	for i := 0; i < n; i++ {
		lead := "        - "
		if i == 0 {
			lead = "      - - "
		}
		fmt.Fprintf(&b, "%scall: leaf-%d\n", lead, i)
	}
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: leaf-%d\n", i)
	}
	return []byte(b.String())
}
