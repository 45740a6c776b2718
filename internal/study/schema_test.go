package study

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

const schemaFile = "../../schema/study.schema.json"

func compileSchema(t testing.TB) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	sch, err := c.Compile(schemaFile)
	if err != nil {
		t.Fatalf("compiling %s: %v", schemaFile, err)
	}
	return sch
}

// validateYAML checks a YAML document against the schema, going through JSON the
// way an editor's language server does.
func validateYAML(sch *jsonschema.Schema, data []byte) error {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return err
	}
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

func TestExamplesMatchSchema(t *testing.T) {
	sch := compileSchema(t)
	for _, f := range examples(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateYAML(sch, data); err != nil {
			t.Errorf("%s as written: %v", f, err)
		}
		s, err := Parse(f, data)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := s.Marshal()
		if err := validateYAML(sch, out); err != nil {
			t.Errorf("%s normalised: %v\n%s", f, err, out)
		}
	}
}

// TestSchemaRejectsWhatParserRejects spot-checks that the schema is not merely
// permissive: mistakes an editor should flag are flagged.
func TestSchemaRejectsWhatParserRejects(t *testing.T) {
	sch := compileSchema(t)
	for _, c := range []struct{ old, new string }{
		{"  workload:\n", "  workload:\n    replica: {x: 1}\n"},
		{"duration: 20s", "duration: 20"},
		{"rate: 75% of lowest capacity", `rate: "75% of fastest capacity"`},
		{"profile: envoy-sidecar", "profile: envoy-sidecr"},
		{"kind: capacity", "kind: capacty"},
		{"duration: 20s", "duration: 20s\n      from: 5"},
		{"connections: [8, 16]", "connections: [0]"},
	} {
		doc := strings.Replace(minimal, c.old, c.new, 1)
		if _, err := Parse("f.yaml", []byte(doc)); err == nil {
			t.Errorf("parser accepts %q", c.new)
		}
		if err := validateYAML(sch, []byte(doc)); err == nil {
			t.Errorf("schema accepts %q", c.new)
		}
	}
}

func loadSchemaDefs(t *testing.T) map[string]map[string]any {
	t.Helper()
	data, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Defs
}

// TestSchemaMatchesGoTypes walks every struct reachable from Study and checks the
// schema has a definition of the same name whose properties are exactly the YAML
// fields, so the schema and the parser cannot drift apart.
func TestSchemaMatchesGoTypes(t *testing.T) {
	defs := loadSchemaDefs(t)
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice || rt.Kind() == reflect.Map {
			rt = rt.Elem()
		}
		if seen[rt] || rt.PkgPath() != reflect.TypeFor[Study]().PkgPath() {
			return
		}
		seen[rt] = true
		if reflect.PointerTo(rt).Implements(nodeDecoderType) {
			if defs[rt.Name()] == nil {
				t.Errorf("schema has no $defs/%s for Go type %s", rt.Name(), rt)
			}
			return
		}
		if rt.Kind() != reflect.Struct {
			return
		}
		def := defs[rt.Name()]
		if def == nil {
			t.Errorf("schema has no $defs/%s", rt.Name())
			return
		}
		if def["additionalProperties"] != false {
			t.Errorf("$defs/%s must forbid unknown fields, as the parser does", rt.Name())
		}
		props, _ := def["properties"].(map[string]any)
		var want, got []string
		for i := range rt.NumField() {
			if name := yamlName(rt.Field(i)); name != "" {
				want = append(want, name)
				walk(rt.Field(i).Type)
			}
		}
		for k := range props {
			got = append(got, k)
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("$defs/%s properties %v, Go fields %v", rt.Name(), got, want)
		}
	}
	walk(reflect.TypeFor[Study]())

	enum := func(def, prop string) []string {
		p := defs[def]["properties"].(map[string]any)[prop].(map[string]any)
		var out []string
		for _, v := range p["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	if got := enum("Mesh", "profile"); !slices.Equal(got, KnownProfiles()) {
		t.Errorf("schema profiles %v, registered profiles %v", got, KnownProfiles())
	}
	if got := enum("Experiment", "kind"); !slices.Equal(got, kindNames()) {
		t.Errorf("schema kinds %v, Go kinds %v", got, kindNames())
	}
	// Per kind, the schema's allowed fields are the common ones plus kindFields; a
	// security experiment takes none of the load-shaping common ones (loadFields).
	common := []string{"name", "kind", "warmup", "repeats", "keepAlive", "protocol", "streams", "path"}
	for _, rule := range defs["Experiment"]["allOf"].([]any) {
		r := rule.(map[string]any)
		kind := r["if"].(map[string]any)["properties"].(map[string]any)["kind"].(map[string]any)["const"].(string)
		var got []string
		for _, v := range r["then"].(map[string]any)["propertyNames"].(map[string]any)["enum"].([]any) {
			got = append(got, v.(string))
		}
		want := append(slices.Clone(common), kindFields[ExperimentKind(kind)]...)
		if ExperimentKind(kind) == KindSecurity {
			want = append([]string{"name", "kind"}, kindFields[KindSecurity]...)
		}
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("schema fields of kind %s %v, parser %v", kind, got, want)
		}
	}
}
