package gatewayapicrds

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestCopyIsTheStandardChannelOfVersion: every file in crds/ is one CRD of the Gateway
// API's standard channel at Version, as the release stamps its bundle, Gateway among
// them, and nothing else (no ValidatingAdmissionPolicy); the chart's version is the
// same release; and the copy Dir writes is the embedded files byte for byte.
func TestCopyIsTheStandardChannelOfVersion(t *testing.T) {
	entries, err := fs.ReadDir(FS(), "crds")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		b, err := fs.ReadFile(FS(), "crds/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Kind     string
			Metadata struct {
				Name        string
				Annotations map[string]string
			}
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		a := crd.Metadata.Annotations
		if crd.Kind != "CustomResourceDefinition" || a["gateway.networking.k8s.io/bundle-version"] != Version || a["gateway.networking.k8s.io/channel"] != "standard" {
			t.Errorf("%s: %s %s, bundle %q, channel %q: want a standard-channel CRD of %s", e.Name(), crd.Kind, crd.Metadata.Name,
				a["gateway.networking.k8s.io/bundle-version"], a["gateway.networking.k8s.io/channel"], Version)
		}
		names = append(names, crd.Metadata.Name)
	}
	if len(names) != 10 || !slices.Contains(names, GatewayCRD) || !slices.Contains(names, "gatewayclasses.gateway.networking.k8s.io") {
		t.Errorf("CRDs %v: want the standard channel's 10, Gateway and GatewayClass among them", names)
	}
	var chart struct{ Name, Version, AppVersion string }
	b, _ := fs.ReadFile(FS(), "Chart.yaml")
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.Name != Chart || "v"+chart.Version != Version || chart.AppVersion != Version {
		t.Errorf("Chart.yaml %+v (%v): want %s at %s", chart, err, Chart, Version)
	}
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	err = fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		want, _ := fs.ReadFile(FS(), p)
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in %s differs from the embedded copy (%v)", p, dir, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
