package ambient

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
)

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"mtls": "off"}, "mtls", "always uses mTLS"},
		{map[string]any{"waypoint": "maybe"}, "waypoint", ""},
		{map[string]any{"request_id": "on"}, "request_id", "L4"},
		{map[string]any{"retries": "off"}, "retries", "L4"},
	} {
		_, err := mesh.New(Name, tc.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != tc.key || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an option error on %s mentioning %q", tc.raw, err, tc.key, tc.want)
		}
	}
	p, err := mesh.New(Name, map[string]any{"mtls": "strict", "concurrency": 3, "waypoint": "off"})
	if err != nil {
		t.Fatal(err)
	}
	if p.(*Profile).MTLS() != mesh.MTLSStrict {
		t.Errorf("mtls %s", p.(*Profile).MTLS())
	}
	p, err = mesh.New(Name, nil)
	if err != nil || p.(*Profile).MTLS() != mesh.MTLSPermissive {
		t.Errorf("default: %v %v", p, err)
	}
}
