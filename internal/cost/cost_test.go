package cost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/substrate"
)

func near(t *testing.T, name string, got, want float64) {
	t.Helper()
	if d := got - want; d > 1e-9 || d < -1e-9 {
		t.Errorf("%s = %.10g, want %.10g", name, got, want)
	}
}

func TestDefaultTableIsCompleteAndSourced(t *testing.T) {
	tab := Default()
	if tab.Currency != "USD" || tab.HoursPerMonth != 730 || len(tab.Instances) < 5 {
		t.Fatalf("default table %+v", tab)
	}
	for _, in := range tab.Instances {
		if in.Source == "" || in.AsOf == "" || !strings.HasPrefix(in.Source, "https://") {
			t.Errorf("%s lacks a source or date: %+v", in.Name, in)
		}
		// A sanity band for on-demand general-purpose prices per vCPU-hour.
		if per := in.PricePerHour / in.VCPU; per < 0.01 || per > 0.1 {
			t.Errorf("%s costs %.4f USD per vCPU-hour: implausible", in.Name, per)
		}
	}
	if m := tab.Instance("aws/m6i.large"); m == nil || m.VCPU != 2 || m.MemoryGiB != 8 || m.PricePerHour != 0.096 {
		t.Errorf("aws/m6i.large = %+v", m)
	}
}

func TestEstimateArithmetic(t *testing.T) {
	tab := Default()
	// Mesh adds 0.5 vCPU and 1 GiB over the baseline at 1000 rps, on m6i.large
	// (2 vCPU, 8 GiB, 0.096 $/h): CPU share 0.25 > memory share 0.125, so 0.25
	// instances = 0.024 $/h = 17.52 $/month; 1000 rps = 3.6 M requests/hour, so
	// 0.024 / 3.6 = 0.00666... $ per million requests.
	base := Usage{VCPU: 1.2, MemoryMiB: 300}
	mesh := Usage{VCPU: 1.7, MemoryMiB: 300 + 1024}
	e, err := tab.Estimate("aws/m6i.large", base, mesh, 1000)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "ExtraVCPU", e.ExtraVCPU, 0.5)
	near(t, "ExtraMemoryGiB", e.ExtraMemoryGiB, 1)
	near(t, "InstanceEquivalents", e.InstanceEquivalents, 0.25)
	near(t, "PerHour", e.PerHour, 0.024)
	near(t, "PerMonth", e.PerMonth, 17.52)
	near(t, "PerMillionRequests", e.PerMillionRequests, 0.024/3.6)
	if e.BoundBy != "cpu" || e.Currency != "USD" {
		t.Errorf("bound by %q currency %q", e.BoundBy, e.Currency)
	}
	// On c6i.large (2 vCPU, 4 GiB, 0.085 $/h) 3 GiB extra memory dominates: 0.75
	// instances = 0.06375 $/h = 46.5375 $/month.
	e, err = tab.Estimate("aws/c6i.large", base, Usage{VCPU: 1.3, MemoryMiB: 300 + 3072}, 0)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "InstanceEquivalents", e.InstanceEquivalents, 0.75)
	near(t, "PerMonth", e.PerMonth, 46.5375)
	if e.BoundBy != "memory" || e.PerMillionRequests != 0 {
		t.Errorf("c6i: %+v", e)
	}
	// A mesh measured cheaper than the baseline (noise) costs nothing, not money back.
	e, _ = tab.Estimate("gcp/e2-standard-2", base, Usage{VCPU: 1.1, MemoryMiB: 290}, 500)
	if e.InstanceEquivalents != 0 || e.PerMonth != 0 || e.ExtraVCPU >= 0 {
		t.Errorf("negative overhead: %+v", e)
	}
	if _, err := tab.Estimate("aws/x9.huge", base, mesh, 1); err == nil || !strings.Contains(err.Error(), "aws/m6i.large") {
		t.Errorf("unknown instance error should list the known ones: %v", err)
	}
	if all := tab.EstimateAll(base, mesh, 1000); len(all) != len(tab.Instances) {
		t.Errorf("EstimateAll gave %d estimates", len(all))
	}
}

func TestUserPricesOverrideAndExtendTheDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prices.yaml")
	err := os.WriteFile(path, []byte(`hoursPerMonth: 720
instances:
  - name: aws/m6i.large
    vcpu: 2
    memoryGiB: 8
    usdPerHour: 0.05   # our negotiated price
    source: contract 2026
    asOf: 2026-01-01
  - name: onprem/blade
    vcpu: 64
    memoryGiB: 256
    usdPerHour: 1.28
    source: finance spreadsheet
    asOf: 2026-10-01
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := tab.Instance("aws/m6i.large"); m.PricePerHour != 0.05 || m.Source != "contract 2026" {
		t.Errorf("override not applied: %+v", m)
	}
	if tab.Instance("gcp/e2-standard-2") == nil || tab.Instance("onprem/blade") == nil {
		t.Error("defaults should remain and new entries be added")
	}
	// 1 extra vCPU on a 64-vCPU blade at 1.28 $/h: 0.02 $/h × 720 h = 14.4 $/month.
	e, err := tab.Estimate("onprem/blade", Usage{}, Usage{VCPU: 1, MemoryMiB: 1024}, 0)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "PerMonth", e.PerMonth, 14.4)
	if !strings.Contains(tab.Origin, path) {
		t.Errorf("origin %q", tab.Origin)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file must be an error")
	}
}

func TestBadPriceFilesNameFileLineAndField(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"negative", "instances:\n  - name: a/b\n    vcpu: -2\n", "p.yaml:3: instances[0].vcpu: \"-2\": want a positive number"},
		{"unknown", "instances:\n  - name: a/b\n    vcpus: 2\n", "p.yaml:3: instances[0].vcpus: unknown field"},
		{"no source", "instances:\n  - name: a/b\n    vcpu: 2\n    memoryGiB: 4\n    usdPerHour: 0.1\n    asOf: 2024-01-01\n", "p.yaml:2: instances[0].source: missing"},
		{"bad date", "instances:\n  - name: a/b\n    asOf: June 2024\n", "p.yaml:3: instances[0].asOf: \"June 2024\": want a date"},
		{"bad name", "instances:\n  - name: m6i\n", "p.yaml:2: instances[0].name: \"m6i\": want provider/type"},
		{"top", "currency: USD\nprices: []\n", "p.yaml:2: prices: unknown field"},
		{"empty", "", "p.yaml:1: instances: empty price table"},
		{"not list", "instances: 3\n", "p.yaml:1: instances: want a list"},
		{"syntax", "instances: [\n", "p.yaml: "},
		{"dup", "instances:\n" + entry("a/b") + entry("a/b"), "p.yaml:8: instances[1].name: \"a/b\" already defined on line 2"},
	}
	for _, c := range cases {
		_, err := Parse("p.yaml", []byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func entry(name string) string {
	return "  - name: " + name + "\n    vcpu: 2\n    memoryGiB: 4\n    usdPerHour: 0.1\n    source: x\n    asOf: 2024-01-01\n"
}

func TestUsageFromSummaryExcludesTheLoadGenerator(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := func(pid int, role substrate.Role, cpu time.Duration, rssMiB, pssMiB uint64) sampler.ProcSample {
		return sampler.ProcSample{Target: sampler.Target{PID: pid, Role: role}, User: cpu, RSSBytes: rssMiB << 20, PSSBytes: pssMiB << 20}
	}
	mk := func(cpu time.Duration) []sampler.ProcSample {
		return []sampler.ProcSample{
			p(1, substrate.RoleWorkload, cpu, 100, 80),
			p(2, substrate.RoleSidecar, 2*cpu, 50, 0),
			p(3, substrate.RoleLoadGen, 3*cpu, 10, 10),
		}
	}
	s, err := sampler.Summarize([]sampler.Round{{Time: t0, Procs: mk(0)}, {Time: t0.Add(2 * time.Second), Procs: mk(time.Second)}},
		sampler.SummaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := UsageFromSummary(s)
	// Workload 0.5 vCPU + sidecar 1.0 vCPU; memory PSS 80 MiB (workload) + RSS 50 MiB
	// (sidecar has no PSS).
	near(t, "VCPU", u.VCPU, 1.5)
	near(t, "MemoryMiB", u.MemoryMiB, 130)
}

func FuzzParse(f *testing.F) {
	f.Add(defaultPrices)
	f.Add([]byte("instances:\n" + entry("a/b")))
	f.Add([]byte("instances: [{name: 1}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse("f.yaml", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error without file name: %v", err)
			}
			return
		}
		for _, in := range tab.Instances {
			if in.VCPU <= 0 || in.MemoryGiB <= 0 || in.PricePerHour <= 0 || in.Source == "" {
				t.Fatalf("accepted an invalid entry %+v", in)
			}
		}
	})
}
