package study

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/published"
)

func TestReproducesUnknownStudyNamesFileLineAndField(t *testing.T) {
	doc := strings.Replace(minimal, "spec:\n", "spec:\n  reproduces: S6\n", 1)
	_, err := Parse("mini.yaml", []byte(doc))
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 1 {
		t.Fatalf("want one error, got %v", err)
	}
	e := errs[0]
	if e.File != "mini.yaml" || e.Line != 6 || e.Field != "spec.reproduces" {
		t.Errorf("error at %s:%d field %s, want mini.yaml:6 spec.reproduces: %v", e.File, e.Line, e.Field, e)
	}
	for _, want := range []string{`"S6"`, "S1, S2, S3, S4, S5", `mini.yaml:6:`} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("error %q does not say %s", e.Error(), want)
		}
	}

	doc = strings.Replace(minimal, "spec:\n", "spec:\n  reproduces: s4\n", 1)
	if _, err := Parse("mini.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), `did you mean "S4"`) {
		t.Errorf("lower-case id: %v, want a suggestion of S4", err)
	}
}

func TestReproducesWarnsOfRolesNoMeshStandsFor(t *testing.T) {
	// minimal has a baseline and an Envoy sidecar: S4's Istio, but not its Linkerd or
	// Traefik Mesh, and no steps or soak experiment.
	doc := strings.Replace(minimal, "spec:\n", "spec:\n  reproduces: S4\n", 1)
	s, err := Parse("mini.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if s.Spec.Reproduces != "S4" {
		t.Errorf("reproduces %q", s.Spec.Reproduces)
	}
	joined := strings.Join(s.Warnings, "\n")
	for _, want := range []string{"S4 compared Linkerd, but no mesh here can stand for it (linkerd)",
		"S4 compared Traefik Mesh", "by a steps experiment", "by a soak experiment"} {
		if !strings.Contains(joined, want) {
			t.Errorf("warnings do not say %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "Istio") {
		t.Errorf("warned about Istio, which the sidecar stands for:\n%s", joined)
	}
}

func TestReproducingExamplesHaveEveryRole(t *testing.T) {
	// The local examples reproduce S1 to S5, each once, with a mesh for every role
	// (TestExamplesParse checks they raise no warning).
	var ids []string
	for _, f := range examples(t) {
		s, err := ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if s.Spec.Reproduces != "" {
			ids = append(ids, s.Spec.Reproduces)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, published.IDs()) {
		t.Errorf("examples reproduce %v, want each of %v once", ids, published.IDs())
	}
}

func TestSchemaReproducesIsPublishedIDs(t *testing.T) {
	defs := loadSchemaDefs(t)
	p := defs["Spec"]["properties"].(map[string]any)["reproduces"].(map[string]any)
	var got []string
	for _, v := range p["enum"].([]any) {
		got = append(got, v.(string))
	}
	if !slices.Equal(got, published.IDs()) {
		t.Errorf("schema spec.reproduces %v, published studies %v", got, published.IDs())
	}
}
