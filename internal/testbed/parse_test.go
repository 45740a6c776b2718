package testbed

import (
	"strings"
	"testing"
)

func TestParseObjectName(t *testing.T) {
	for name, want := range map[string]string{
		"mm-0a1b2c-node0":        "0a1b2c",
		"mm-0a1b2c-reviews-v2-0": "0a1b2c",
		"mm-0a1b2c-":             "",
		"mm-0A1B2C-node0":        "",
		"mm-0a1b2-node0":         "",
		"xmm-0a1b2c-node0":       "",
		"cni-0a1b2c-node0":       "",
		"mm-0a1b2c-node0/../x":   "",
		"mm-0a1b2c-Node":         "",
	} {
		id, ok := ParseObjectName(name)
		if ok != (want != "") || id != want {
			t.Errorf("ParseObjectName(%q) = %q, %v; want %q", name, id, ok, want)
		}
	}
}

func FuzzParseObjectName(f *testing.F) {
	f.Add("mm-0a1b2c-node0")
	f.Add("mm-0a1b2c-../../etc")
	f.Fuzz(func(t *testing.T, name string) {
		id, ok := ParseObjectName(name)
		if !ok {
			return
		}
		// Clean removes what this accepts: it must be exactly our shape.
		if !strings.HasPrefix(name, Prefix+id+"-") || !runIDPattern.MatchString(id) || strings.ContainsAny(name, "/. \n\\") {
			t.Fatalf("accepted %q (id %q)", name, id)
		}
	})
}
