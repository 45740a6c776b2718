package workload

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBuiltinsParse(t *testing.T) {
	for _, name := range []string{"bookinfo", "emojivoto", "online-boutique", "teastore", "chain-1", "chain-5", "fanout-1", "fanout-8", "chain-1000"} {
		g, err := Builtin(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if g.Entrypoint().Service == "" {
			t.Errorf("%s: no entrypoint", name)
		}
		if g.Origin != name {
			t.Errorf("%s: origin %q", name, g.Origin)
		}
		// what --print shows must parse to the same graph
		src, err := BuiltinYAML(name)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(name+".yaml", src)
		if err != nil {
			t.Fatalf("%s printed graph does not parse: %v", name, err)
		}
		if len(again.Deployments()) != len(g.Deployments()) {
			t.Errorf("%s: printed graph has %d deployments, built-in %d", name, len(again.Deployments()), len(g.Deployments()))
		}
	}
}

func TestBookinfoShape(t *testing.T) {
	g, err := Builtin("bookinfo:replicas=3")
	if err != nil {
		t.Fatal(err)
	}
	want := []Deployment{
		{"productpage", "v1", 1, 3, 9080, "http"},
		{"details", "v1", 1, 3, 9080, "http"},
		{"reviews", "v1", 1, 3, 9080, "http"},
		{"reviews", "v2", 1, 3, 9080, "http"},
		{"reviews", "v3", 1, 3, 9080, "http"},
		{"ratings", "v1", 1, 3, 9080, "http"},
	}
	got := g.Deployments()
	if len(got) != len(want) {
		t.Fatalf("deployments %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("deployment %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if ep := g.Entrypoint(); ep != (Entrypoint{"productpage", 9080, "/productpage"}) {
		t.Errorf("entrypoint %+v", ep)
	}
	reviews := g.Service("reviews")
	for _, v := range reviews.Versions {
		calls := v.Script.Calls()
		callsRatings := len(calls) == 1 && calls[0].Service == "ratings"
		if callsRatings != (v.Name != "v1") {
			t.Errorf("reviews %s calls %+v", v.Name, calls)
		}
	}
	args := strings.Join(g.ServiceArgs(got[3], "reviews-v2-0"), " ")
	if args != "service --graph bookinfo:replicas=3 --service reviews --version v2 --pod reviews-v2-0 --listen :9080" {
		t.Errorf("service args: %s", args)
	}
}

func TestWeightPercents(t *testing.T) {
	cases := []struct {
		weights []int
		want    []int
	}{
		{[]int{1, 1, 1}, []int{34, 33, 33}},
		{[]int{90, 10}, []int{90, 10}},
		{[]int{1, 0, 2}, []int{33, 0, 67}},
		{[]int{5}, []int{100}},
		{[]int{1, 1, 1, 1, 1, 1, 1}, []int{15, 15, 14, 14, 14, 14, 14}},
	}
	for _, tc := range cases {
		s := &Service{}
		for _, w := range tc.weights {
			s.Versions = append(s.Versions, &Version{Weight: w})
		}
		got := s.WeightPercents()
		sum := 0
		for i := range got {
			sum += got[i]
			if got[i] != tc.want[i] {
				t.Errorf("weights %v: got %v, want %v", tc.weights, got, tc.want)
				break
			}
		}
		if sum != 100 {
			t.Errorf("weights %v: percents %v sum to %d", tc.weights, got, sum)
		}
	}
}

func TestGeneratedShapes(t *testing.T) {
	chain, err := Builtin("chain-4")
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range chain.Services {
		calls := s.Versions[0].Script.Calls()
		if i < 3 && (len(calls) != 1 || calls[0].Service != "svc-"+string(rune('1'+i))) {
			t.Errorf("svc-%d calls %+v", i, calls)
		}
		if i == 3 && len(calls) != 0 {
			t.Errorf("last service calls %+v", calls)
		}
	}
	fan, err := Builtin("fanout-5")
	if err != nil {
		t.Fatal(err)
	}
	sc := fan.Service("root").Versions[0].Script
	if len(sc) != 1 || len(sc[0].Concurrent) != 5 {
		t.Errorf("fanout root script %+v", sc)
	}
	for _, bad := range []string{"chain-0", "chain-1001", "chain-x", "chain-05", "fanout-", "nope", "bookinfo:replicas=0", "bookinfo:color=red"} {
		if _, err := Builtin(bad); err == nil {
			t.Errorf("Builtin(%q) succeeded", bad)
		}
	}
}

func TestParseFullGraph(t *testing.T) {
	src := `name: shop
defaults:
  port: 8000
  replicas: 2
  responseSize: 2KiB
  requestSize: 100B
services:
  - name: front
    path: /home
    script:
      - call: cart
      - call: {service: catalog, path: /items, size: 1KB, probability: 25%}
      - - call: cart
          probability: 50%
        - sleep: {distribution: normal, mean: 10ms, stddev: 2ms, min: 1ms, max: 30ms}
      - sleep: 5ms
      - cpu: 200us
  - name: cart
    port: 7000
    errorRate: 0.5%
    versions:
      - {name: v1, weight: 90, replicas: 3}
      - {name: v2, weight: 10}
  - name: catalog
    responseSize: 1.5MiB
`
	g, err := Parse("shop.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	front := g.Service("front")
	if !front.IsEntrypoint || g.Entrypoint() != (Entrypoint{"front", 8000, "/home"}) {
		t.Errorf("entrypoint %+v", g.Entrypoint())
	}
	sc := front.Versions[0].Script
	if len(sc) != 5 {
		t.Fatalf("script %+v", sc)
	}
	if c := sc[0].Call; c.Service != "cart" || c.Size != 100 || c.Probability != 1 || c.Path != "" {
		t.Errorf("step 0 %+v", c)
	}
	if c := sc[1].Call; c.Service != "catalog" || c.Size != 1000 || c.Probability != 0.25 || c.Path != "/items" {
		t.Errorf("step 1 %+v", c)
	}
	if grp := sc[2].Concurrent; len(grp) != 2 || grp[0].Call.Probability != 0.5 ||
		*grp[1].Sleep != (Delay{Normal, 10 * time.Millisecond, 2 * time.Millisecond, time.Millisecond, 30 * time.Millisecond}) {
		t.Errorf("step 2 %+v", grp)
	}
	if *sc[3].Sleep != (Delay{Distribution: Constant, Mean: 5 * time.Millisecond}) || sc[4].CPU != 200*time.Microsecond {
		t.Errorf("steps 3, 4: %+v %+v", sc[3].Sleep, sc[4])
	}
	cart := g.Service("cart")
	if cart.Port != 7000 || cart.ErrorRate != 0.005 || cart.ResponseSize != 2048 {
		t.Errorf("cart %+v", cart)
	}
	wantDeps := []Deployment{{"front", "v1", 1, 2, 8000, "http"}, {"cart", "v1", 90, 3, 7000, "http"}, {"cart", "v2", 10, 2, 7000, "http"}, {"catalog", "v1", 1, 2, 8000, "http"}}
	for i, d := range g.Deployments() {
		if d != wantDeps[i] {
			t.Errorf("deployment %d: %+v, want %+v", i, d, wantDeps[i])
		}
	}
	if g.Service("catalog").ResponseSize != 1572864 {
		t.Errorf("catalog size %d", g.Service("catalog").ResponseSize)
	}
}

// TestBadGraphs checks that each mistake is reported at the right line, column and field.
func TestBadGraphs(t *testing.T) {
	const head = "name: g\nservices:\n"
	cases := []struct {
		name string
		src  string
		want string // the first error, exactly
	}{
		{"unknown callee", head + "  - name: a\n    script:\n      - call: b\n",
			`g.yaml:5:15: services[0].script[0].call: unknown service "b"`},
		{"unknown callee long form", head + "  - name: productpage\n    script:\n      - call: {service: ratingz}\n  - name: ratings\n",
			`g.yaml:5:25: services[0].script[0].call.service: unknown service "ratingz"`},
		{"unknown field", head + "  - name: a\n    replica: 2\n",
			`g.yaml:4:5: services[0].replica: unknown field`},
		{"unknown top field", "name: g\nservice: []\n",
			`g.yaml:2:1: service: unknown field`},
		{"duplicate service", head + "  - name: a\n  - name: b\n  - name: a\n",
			`g.yaml:5:11: services[2].name: duplicate service "a" (first defined at line 3)`},
		{"duplicate field", head + "  - name: a\n    port: 1\n    port: 2\n",
			`g.yaml:5:5: services[0].port: duplicate field`},
		{"self cycle", head + "  - name: a\n    script:\n      - call: a\n",
			`g.yaml:5:15: services[0].script[0].call: call cycle a → a`},
		{"long cycle in a group", head + "  - name: a\n    isEntrypoint: true\n    script: [call: b]\n  - name: b\n    script:\n      - - call: c\n  - name: c\n    versions:\n      - name: v1\n        script:\n          - call: {service: b}\n",
			`g.yaml:13:29: services[2].versions[0].script[0].call.service: call cycle b → c → b`},
		{"bad port", head + "  - name: a\n    port: 70000\n",
			`g.yaml:4:11: services[0].port: 70000 out of range [1, 65535]`},
		{"port not a number", head + "  - name: a\n    port: http\n",
			`g.yaml:4:11: services[0].port: want a whole number, got "http"`},
		{"error rate without percent", head + "  - name: a\n    errorRate: 0.01\n",
			`g.yaml:4:16: services[0].errorRate: want a percentage like "1%", got "0.01"`},
		{"error rate above 100%", head + "  - name: a\n    errorRate: 101%\n",
			`g.yaml:4:16: services[0].errorRate: "101%" out of range [0%, 100%]`},
		{"bad size", head + "  - name: a\n    responseSize: 1KiBB\n",
			`g.yaml:4:19: services[0].responseSize: want a size like 1KiB, 512B or 2MiB, got "1KiBB"`},
		{"size too big", head + "  - name: a\n    responseSize: 1GiB\n",
			`g.yaml:4:19: services[0].responseSize: size "1GiB" out of range [0, 64MiB]`},
		{"negative sleep", head + "  - name: a\n    script:\n      - sleep: -1ms\n",
			`g.yaml:5:16: services[0].script[0].sleep: -1ms out of range [0s, 1h0m0s]`},
		{"sleep without unit", head + "  - name: a\n    script:\n      - sleep: 10\n",
			`g.yaml:5:16: services[0].script[0].sleep: want a duration like 10ms or 200us, got "10"`},
		{"unknown distribution", head + "  - name: a\n    script:\n      - sleep: {distribution: pareto, mean: 1ms}\n",
			`g.yaml:5:31: services[0].script[0].sleep.distribution: unknown distribution "pareto" (want constant, normal, exponential or uniform)`},
		{"uniform without max", head + "  - name: a\n    script:\n      - sleep: {distribution: uniform, min: 1ms}\n",
			`g.yaml:5:16: services[0].script[0].sleep.max: missing field (needed by distribution uniform)`},
		{"max below min", head + "  - name: a\n    script:\n      - sleep: {distribution: uniform, min: 5ms, max: 1ms}\n",
			`g.yaml:5:55: services[0].script[0].sleep.max: max 1ms is below min 5ms`},
		{"two actions in a step", head + "  - name: a\n    script:\n      - {sleep: 1ms, cpu: 1ms}\n",
			`g.yaml:5:9: services[0].script[0]: a step has exactly one of call, sleep or cpu, got sleep and cpu`},
		{"empty step", head + "  - name: a\n    script:\n      - {}\n",
			`g.yaml:5:9: services[0].script[0]: a step needs one of call, sleep or cpu`},
		{"probability on a sleep", head + "  - name: a\n    script:\n      - sleep: 1ms\n        probability: 5%\n",
			`g.yaml:6:22: services[0].script[0].probability: probability applies to calls only`},
		{"nested group", head + "  - name: a\n    script:\n      - - - cpu: 1ms\n",
			`g.yaml:5:11: services[0].script[0][0]: concurrent groups cannot be nested`},
		{"bad service name", head + "  - name: Product_Page\n",
			`g.yaml:3:11: services[0].name: service name "Product_Page" must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit`},
		{"missing name", head + "  - port: 80\n",
			`g.yaml:3:5: services[0].name: missing field`},
		{"duplicate version", head + "  - name: a\n    versions:\n      - name: v1\n      - name: v1\n",
			`g.yaml:6:15: services[0].versions[1].name: duplicate version "v1" (first defined at line 5)`},
		{"all weights zero", head + "  - name: a\n    versions:\n      - {name: v1, weight: 0}\n",
			`g.yaml:5:7: services[0].versions: every version has weight 0: the service would get no traffic`},
		{"two entrypoints", head + "  - name: a\n    isEntrypoint: true\n  - name: b\n    isEntrypoint: true\n",
			`g.yaml:6:19: services[1].isEntrypoint: more than one entrypoint (a and b)`},
		{"no entrypoint", head + "  - name: a\n  - name: b\n",
			`g.yaml:2:1: services: no service is marked isEntrypoint and 2 services are called by no other (a, b): mark one with isEntrypoint: true`},
		{"unsupported protocol", head + "  - name: a\n    protocol: thrift\n",
			`g.yaml:4:15: services[0].protocol: unsupported protocol "thrift" (supported: http, http2, grpc; h2c means http2)`},
		{"services not a list", "name: g\nservices: {a: 1}\n",
			`g.yaml:2:11: services: want a non-empty list of services, got a mapping`},
		{"missing services", "name: g\n",
			`g.yaml:1:1: services: missing field`},
		{"empty file", "",
			`g.yaml:1:1: empty graph file: want a mapping with name and services`},
		{"bad defaults", "name: g\ndefaults:\n  replicas: 0\nservices:\n  - name: a\n",
			`g.yaml:3:13: defaults.replicas: 0 out of range [1, 1000]`},
		{"syntax error", "name: g\nservices:\n  - name: a\n   port: 1\n",
			`g.yaml:3: YAML syntax: did not find expected '-' indicator (in the block that starts on this line)`},
		{"tab indentation", "name: g\nservices:\n\t- name: a\n",
			`g.yaml:3:1: YAML syntax: found character that cannot start any token (tabs cannot indent YAML)`},
		{"scanner error", "name: g\nservices:\n  - name: a\n    port: 1: 2\n",
			`g.yaml:4: YAML syntax: mapping values are not allowed in this context`},
		{"control character", "name: g\nservices:\n  - name: a\x01\n",
			`g.yaml:3:12: YAML syntax: control characters are not allowed`},
		{"invalid utf-8", "name: g\nservices:\n  - name: \xff\n",
			`g.yaml:3:11: YAML syntax: invalid leading UTF-8 octet`},
		{"path without slash", head + "  - name: a\n    path: home\n",
			`g.yaml:4:11: services[0].path: path "home" must start with / and contain no spaces or '#'`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("g.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("parsed without error:\n%s", tc.src)
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error is not an ErrorList: %v", err)
			}
			if got := list[0].Error(); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestManyErrorsReportedTogether(t *testing.T) {
	src := "name: g\nservices:\n  - name: a\n    port: x\n    errorRate: 5\n    colour: red\n"
	_, err := Parse("g.yaml", []byte(src))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 3 {
		t.Fatalf("want 3 errors, got %v", err)
	}
	for i, line := range []int{4, 5, 6} {
		if list[i].Line != line {
			t.Errorf("error %d on line %d, want %d: %v", i, list[i].Line, line, list[i])
		}
	}
}

// TestAliasBombIsBounded builds a small file whose aliases expand to 100^4 steps; the
// parser must refuse it quickly instead of walking every expansion.
func TestAliasBombIsBounded(t *testing.T) {
	repeat := func(item string, n int) string {
		return strings.TrimSuffix(strings.Repeat(item+", ", n), ", ")
	}
	var b strings.Builder
	b.WriteString("name: g\nservices:\n")
	b.WriteString("  - name: s0\n    isEntrypoint: true\n    script:\n      - &g [" + repeat("{cpu: 1us}", 100) + "]\n")
	b.WriteString("  - name: s1\n    script: &s [" + repeat("*g", 100) + "]\n")
	b.WriteString("    versions: &v [" + repeat("{name: v1, script: *s}", 100) + "]\n")
	for i := 2; i < 100; i++ {
		b.WriteString("  - {name: s" + strconv.Itoa(i) + ", versions: *v}\n")
	}
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "graph too large") {
		t.Fatalf("alias bomb: want a 'graph too large' error, got %v", err)
	}
	if len(b.String()) > 20000 {
		t.Fatalf("the bomb should be small, is %d bytes", len(b.String()))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("alias bomb took %v", d)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mini.yaml")
	if err := os.WriteFile(path, []byte("name: mini\nservices:\n  - name: only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := Load(path)
	if err != nil || g.Name != "mini" || g.Origin != path {
		t.Fatalf("Load(file) = %+v, %v", g, err)
	}
	if g, err := Load("emojivoto"); err != nil || g.Name != "emojivoto" {
		t.Fatalf("Load(builtin) = %+v, %v", g, err)
	}
	if _, err := Load(filepath.Join(dir, "absent.yaml")); err == nil || !strings.Contains(err.Error(), "absent.yaml") {
		t.Errorf("Load(missing file) error %v", err)
	}
	if _, err := Load("bookinf"); err == nil || !strings.Contains(err.Error(), "bookinfo") {
		t.Errorf("Load(typo) error should list built-ins: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{"0": 0, "512": 512, "512B": 512, "1KiB": 1024, "1.5KiB": 1536, "2KB": 2000, "1kB": 1000, "3MiB": 3 << 20, "1MB": 1e6, "10 KiB": 10240}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "KiB", "-1", "1XB", "0x10", "1e9", "NaN", "1_000", "65MiB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, got)
		}
	}
}

// FuzzParseGraph checks that no input panics the parser and that every error it
// reports carries a position.
func FuzzParseGraph(f *testing.F) {
	for _, name := range []string{"bookinfo", "emojivoto", "chain-3", "fanout-3"} {
		src, err := BuiltinYAML(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(src)
	}
	f.Add([]byte("name: g\nservices:\n  - name: a\n    script:\n      - - call: {service: a, probability: 5%}\n        - sleep: {distribution: uniform, min: 1ms, max: 2ms}\n"))
	f.Add([]byte("name: g\nx: &a [*a]\n"))
	f.Add([]byte("\xff\x00name: g"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse("fuzz.yaml", data)
		if err == nil {
			if g == nil || len(g.Services) == 0 || g.Entrypoint().Service == "" {
				t.Fatalf("graph without services or entrypoint accepted: %+v", g)
			}
			return
		}
		var list ErrorList
		if !errors.As(err, &list) || len(list) == 0 {
			t.Fatalf("error without position: %v", err)
		}
		for _, e := range list {
			if e.File != "fuzz.yaml" || e.Line < 1 || e.Column < 0 {
				t.Fatalf("error without position: %#v", e)
			}
		}
	})
}
