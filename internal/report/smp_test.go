package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// smpFields is the field list of the SMP protos (protos/service_mesh_performance.proto,
// protos/metadata.proto, protos/service_mesh.proto at SMPSchema), as paths into the
// export. It is written out by hand from the spec, not derived from our structs, so a
// field the export forgets fails the test.
var smpFields = map[string][]string{
	"performance_test_config": {"smp_version", "id", "name", "labels", "clients", "duration"},
	"clients": {"internal", "load_generator", "protocol", "connections", "rps", "headers", "cookies", "body",
		"content_type", "endpoint_url"},
	"results":      {"smp_version", "id", "labels", "start_time", "end_time", "latencies_ms", "actual_QPS", "details_uri", "testId", "meshConfigId", "envId"},
	"latencies_ms": {"min", "average", "p50", "p90", "p99", "max"},
	"mesh_configs": {"smp_version", "id", "labels", "ingress_gateway", "sidecar", "mesh_telemetry", "mesh_policy", "mesh_control_plane",
		"mesh_policy_enabled", "mesh_telemetry_enabled", "mtls_enabled", "proxy_concurrency", "mesh_build", "proxy_build",
		"exp_group_uuid", "exp_uuid", "profile", "mesh_type", "application_metadata"},
	"ingress_gateway": {"count", "cpu_mCores", "mem_mb", "rps", "bps"},
	"sidecar":         {"count", "cpu_mCores", "mem_mb", "rps", "bps"},
	"mesh_telemetry":  {"count", "cpu_mCores", "mem_mb", "rps"},
	"mesh_policy":     {"count", "cpu_mCores", "mem_mb", "rps", "cache_hit_rate"},
	"mesh_control_plane": {"count", "cpu_mCores", "mem_mb", "endpoints", "services", "sidecars", "virtual_services",
		"destination_rules", "lds_latency_ms", "cds_latency_ms"},
	"mesh_type": {"type"},
	"application_metadata": {"application_name", "application_version", "helmchart_name", "helmchart_version", "cnabspec_version",
		"compose_version", "cluster_name", "k8s_version_supported", "application_protocol"},
	"env":                  {"smp_version", "id", "labels", "kubernetes_version", "node", "individual_workloads", "traffic_metadata"},
	"node":                 {"type", "cores", "mem_mb"},
	"individual_workloads": {"name", "count", "cpu_mCores", "mem_mb"},
	"traffic_metadata": {"load_balance_name", "load_balance_ip", "host_endpoint", "prometheus_url", "http_headers", "user_agent",
		"ping_health_endpoint"},
}

// zeroAllowed says whether a zero/empty value at path is one SMPZeroAllowed explains:
// the entry names the field or one of the messages it sits in.
func zeroAllowed(path []string) bool {
	for i := range path {
		if _, ok := SMPZeroAllowed[path[i]]; ok {
			return true
		}
		if i > 0 {
			if _, ok := SMPZeroAllowed[path[i-1]+"."+path[i]]; ok {
				return true
			}
		}
	}
	return false
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case float64:
		return x == 0
	case bool:
		return !x
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// checkSMP walks message msg (a JSON object) named name and reports every spec field
// that is missing, or zero without an explanation.
func checkSMP(t *testing.T, name string, msg map[string]any, path []string) {
	fields, ok := smpFields[name]
	if !ok {
		t.Fatalf("no field list for %s", name)
	}
	for _, f := range fields {
		p := append(append([]string(nil), path...), f)
		v, ok := msg[f]
		if !ok {
			t.Errorf("%s: missing", strings.Join(p, "."))
			continue
		}
		if isZero(v) && !zeroAllowed(append([]string{name}, f)) && !zeroAllowed(p) {
			t.Errorf("%s: zero or empty (%v) and SMPZeroAllowed does not say why", strings.Join(p, "."), v)
		}
		if _, sub := smpFields[f]; !sub {
			continue
		}
		switch x := v.(type) {
		case map[string]any:
			checkSMP(t, f, x, p)
		case []any:
			for _, e := range x {
				if m, ok := e.(map[string]any); ok {
					checkSMP(t, f, m, p)
				} else {
					t.Errorf("%s: element %v is not a message", strings.Join(p, "."), e)
				}
			}
		default:
			t.Errorf("%s: %T is not a message", strings.Join(p, "."), v)
		}
	}
}

func TestSMPExportHasEverySpecField(t *testing.T) {
	run, an := fixture(t)
	var buf bytes.Buffer
	if err := Render(&buf, SMP, run, an, Options{MeshmarkVersion: "v0.1.0"}); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, top := range []string{"performance_test_config", "results", "mesh_configs", "env"} {
		switch x := doc[top].(type) {
		case map[string]any:
			checkSMP(t, top, x, []string{top})
		case []any:
			if len(x) == 0 {
				t.Errorf("%s: empty", top)
			}
			for _, e := range x {
				checkSMP(t, top, e.(map[string]any), []string{top})
			}
		default:
			t.Errorf("%s: missing", top)
		}
	}

	// The numbers are the run's, not placeholders: results match the pooled groups.
	var typed SMPDocument
	if err := json.Unmarshal(buf.Bytes(), &typed); err != nil {
		t.Fatal(err)
	}
	s := Summarize(run, an, Options{})
	if len(typed.Results) != len(s.Groups) {
		t.Fatalf("%d results for %d groups", len(typed.Results), len(s.Groups))
	}
	for i, r := range typed.Results {
		g := s.Groups[i]
		l := r.LatenciesMs
		if l.P99 != float64(g.P99Ms) || r.ActualQPS != float64(g.Throughput) || !(l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
			t.Errorf("result %s does not match its group: %+v vs p99 %v", r.ID, l, g.P99Ms)
		}
		if !r.EndTime.After(r.StartTime) {
			t.Errorf("result %s: end %v not after start %v", r.ID, r.EndTime, r.StartTime)
		}
	}
	for _, mc := range typed.MeshConfigs {
		switch mc.Profile {
		case "none":
			if mc.Sidecar.Count != 0 || mc.MeshType.Type != "none" {
				t.Errorf("baseline mesh config claims a mesh: %+v", mc)
			}
		case "envoy-sidecar":
			if mc.Sidecar.Count != 2 || mc.Sidecar.CPUmCores <= 0 || mc.MeshType.Type != "istio" || mc.ProxyConcurrency != 2 ||
				mc.MeshControlPlane.Count != 1 || mc.MeshControlPlane.Services != 4 {
				t.Errorf("sidecar mesh config wrong: %+v", mc)
			}
		}
		if (mc.ID == run.ID+"/sidecar-mtls") != mc.MTLSEnabled {
			t.Errorf("%s: mtls_enabled = %v", mc.ID, mc.MTLSEnabled)
		}
	}
}

// TestSMPZeroAllowedIsDocumented keeps docs/report.md and SMPZeroAllowed in step.
func TestSMPZeroAllowedIsDocumented(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	doc, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for field := range SMPZeroAllowed {
		if !strings.Contains(string(doc), "`"+field+"`") {
			t.Errorf("docs/report.md does not explain SMP field %s", field)
		}
	}
}
