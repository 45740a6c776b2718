package prereq

import (
	"context"
	"os"
	"strings"
	"testing"
)

// CheckNamed finds present items, reports missing kernel modules and unknown names,
// and a kernel module this kernel has loaded passes.
func TestCheckNamed(t *testing.T) {
	loaded := ""
	if b, err := os.ReadFile("/proc/modules"); err == nil && len(b) > 0 {
		loaded = strings.Fields(string(b))[0]
	}
	names := []string{"ip", KernelPrefix + "no_such_module_meshmark", "no-such-tool"}
	if loaded != "" {
		names = append(names, KernelPrefix+loaded)
	}
	found, unknown := CheckNamed(context.Background(), names...)
	if len(unknown) != 1 || unknown[0] != "no-such-tool" {
		t.Errorf("unknown %v, want [no-such-tool]", unknown)
	}
	if len(found) != len(names)-1 {
		t.Fatalf("found %d statuses for %v", len(found), names)
	}
	if !found[0].OK() || found[0].Problem() != "" {
		t.Errorf("ip: %v", found[0].Err)
	}
	if p := found[1].Problem(); found[1].OK() || !strings.Contains(p, "no_such_module_meshmark") || !strings.Contains(p, "modprobe") {
		t.Errorf("missing module: %q", p)
	}
	if loaded != "" && !found[2].OK() {
		t.Errorf("module %s is loaded but: %v", loaded, found[2].Err)
	}
}
