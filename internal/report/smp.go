package report

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // every profile's SMP type
	"github.com/meshmark/meshmark/internal/results"
)

// SMPSchema is the revision of the Service Mesh Performance protos
// (github.com/service-mesh-performance/service-mesh-performance, protos/*.proto) whose
// messages the export follows field for field; it is what smp_version says.
const SMPSchema = "smp protos@1a82110241f20665364b972f76af8901a09ce73f"

// SMPDocument is meshmark's SMP export: the spec's four messages (test config, one
// result per mesh and point, one mesh config per mesh, the environment). Field names
// are the proto field names. meshmark's numbers the spec has no field for (p99.9,
// errors, repeats, intervals) travel in the spec's own labels maps, prefixed
// "meshmark.", so a strict SMP reader still accepts the document.
type SMPDocument struct {
	PerformanceTestConfig SMPTestConfig   `json:"performance_test_config"`
	Results               []SMPResult     `json:"results"`
	MeshConfigs           []SMPMeshConfig `json:"mesh_configs"`
	Env                   SMPEnvironment  `json:"env"`
}

// SMPTestConfig is smp.PerformanceTestConfig.
type SMPTestConfig struct {
	SMPVersion string            `json:"smp_version"`
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Labels     map[string]string `json:"labels"`
	Clients    []SMPClient       `json:"clients"`
	Duration   string            `json:"duration"`
}

// SMPClient is smp.PerformanceTestConfig.Client.
type SMPClient struct {
	Internal      bool              `json:"internal"`
	LoadGenerator string            `json:"load_generator"`
	Protocol      string            `json:"protocol"`
	Connections   int32             `json:"connections"`
	RPS           int64             `json:"rps"`
	Headers       map[string]string `json:"headers"`
	Cookies       map[string]string `json:"cookies"`
	Body          string            `json:"body"`
	ContentType   string            `json:"content_type"`
	EndpointURL   []string          `json:"endpoint_url"`
}

// SMPLatency is smp.PerformanceTestResult.Latency (milliseconds).
type SMPLatency struct {
	Min     float64 `json:"min"`
	Average float64 `json:"average"`
	P50     float64 `json:"p50"`
	P90     float64 `json:"p90"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
}

// SMPResult is smp.PerformanceTestResult.
type SMPResult struct {
	SMPVersion   string            `json:"smp_version"`
	ID           string            `json:"id"`
	Labels       map[string]string `json:"labels"`
	StartTime    time.Time         `json:"start_time"`
	EndTime      time.Time         `json:"end_time"`
	LatenciesMs  SMPLatency        `json:"latencies_ms"`
	ActualQPS    float64           `json:"actual_QPS"`
	DetailsURI   string            `json:"details_uri"`
	TestID       string            `json:"testId"`
	MeshConfigID string            `json:"meshConfigId"`
	EnvID        string            `json:"envId"`
}

// SMPProxyGroup is the shape shared by IngressGateway, Sidecar, MeshTelemetry and
// MeshPolicy (the latter also has cache_hit_rate).
type SMPProxyGroup struct {
	Count     int32 `json:"count"`
	CPUmCores int32 `json:"cpu_mCores"`
	MemMB     int32 `json:"mem_mb"`
	RPS       int32 `json:"rps"`
	BPS       int32 `json:"bps"`
}

// SMPTelemetry is smp.ServiceMeshConfig.MeshTelemetry.
type SMPTelemetry struct {
	Count     int32 `json:"count"`
	CPUmCores int32 `json:"cpu_mCores"`
	MemMB     int32 `json:"mem_mb"`
	RPS       int32 `json:"rps"`
}

// SMPPolicy is smp.ServiceMeshConfig.MeshPolicy.
type SMPPolicy struct {
	Count        int32 `json:"count"`
	CPUmCores    int32 `json:"cpu_mCores"`
	MemMB        int32 `json:"mem_mb"`
	RPS          int32 `json:"rps"`
	CacheHitRate int32 `json:"cache_hit_rate"`
}

// SMPControlPlane is smp.ServiceMeshConfig.MeshControlPlane.
type SMPControlPlane struct {
	Count            int32 `json:"count"`
	CPUmCores        int32 `json:"cpu_mCores"`
	MemMB            int32 `json:"mem_mb"`
	Endpoints        int32 `json:"endpoints"`
	Services         int32 `json:"services"`
	Sidecars         int32 `json:"sidecars"`
	VirtualServices  int32 `json:"virtual_services"`
	DestinationRules int32 `json:"destination_rules"`
	LDSLatencyMs     int32 `json:"lds_latency_ms"`
	CDSLatencyMs     int32 `json:"cds_latency_ms"`
}

// SMPApplication is smp.ApplicationMetadata.
type SMPApplication struct {
	ApplicationName     string `json:"application_name"`
	ApplicationVersion  string `json:"application_version"`
	HelmchartName       string `json:"helmchart_name"`
	HelmchartVersion    string `json:"helmchart_version"`
	CNABSpecVersion     string `json:"cnabspec_version"`
	ComposeVersion      string `json:"compose_version"`
	ClusterName         string `json:"cluster_name"`
	K8sVersionSupported string `json:"k8s_version_supported"`
	ApplicationProtocol string `json:"application_protocol"`
}

// SMPMeshType is smp.ServiceMeshes.
type SMPMeshType struct {
	Type string `json:"type"`
}

// SMPMeshConfig is smp.ServiceMeshConfig.
type SMPMeshConfig struct {
	SMPVersion           string            `json:"smp_version"`
	ID                   string            `json:"id"`
	Labels               map[string]string `json:"labels"`
	IngressGateway       SMPProxyGroup     `json:"ingress_gateway"`
	Sidecar              SMPProxyGroup     `json:"sidecar"`
	MeshTelemetry        SMPTelemetry      `json:"mesh_telemetry"`
	MeshPolicy           SMPPolicy         `json:"mesh_policy"`
	MeshControlPlane     SMPControlPlane   `json:"mesh_control_plane"`
	MeshPolicyEnabled    bool              `json:"mesh_policy_enabled"`
	MeshTelemetryEnabled bool              `json:"mesh_telemetry_enabled"`
	MTLSEnabled          bool              `json:"mtls_enabled"`
	ProxyConcurrency     int32             `json:"proxy_concurrency"`
	MeshBuild            string            `json:"mesh_build"`
	ProxyBuild           string            `json:"proxy_build"`
	ExpGroupUUID         string            `json:"exp_group_uuid"`
	ExpUUID              string            `json:"exp_uuid"`
	Profile              string            `json:"profile"`
	MeshType             SMPMeshType       `json:"mesh_type"`
	ApplicationMetadata  SMPApplication    `json:"application_metadata"`
}

// SMPNode is smp.EnvironmentConfig.Node.
type SMPNode struct {
	Type  string `json:"type"`
	Cores int32  `json:"cores"`
	MemMB int64  `json:"mem_mb"`
}

// SMPWorkload is smp.EnvironmentConfig.IndividualWorkload.
type SMPWorkload struct {
	Name      string `json:"name"`
	Count     int32  `json:"count"`
	CPUmCores int32  `json:"cpu_mCores"`
	MemMB     int32  `json:"mem_mb"`
}

// SMPTraffic is smp.TrafficMetadata.
type SMPTraffic struct {
	LoadBalanceName    string `json:"load_balance_name"`
	LoadBalanceIP      string `json:"load_balance_ip"`
	HostEndpoint       string `json:"host_endpoint"`
	PrometheusURL      string `json:"prometheus_url"`
	HTTPHeaders        string `json:"http_headers"`
	UserAgent          string `json:"user_agent"`
	PingHealthEndpoint string `json:"ping_health_endpoint"`
}

// SMPEnvironment is smp.EnvironmentConfig.
type SMPEnvironment struct {
	SMPVersion          string            `json:"smp_version"`
	ID                  string            `json:"id"`
	Labels              map[string]string `json:"labels"`
	KubernetesVersion   string            `json:"kubernetes_version"`
	Node                []SMPNode         `json:"node"`
	IndividualWorkloads []SMPWorkload     `json:"individual_workloads"`
	TrafficMetadata     SMPTraffic        `json:"traffic_metadata"`
}

// SMPZeroAllowed lists the SMP fields that may legitimately be zero, false or empty in
// an export, with why: the spec asks for something this run did not have (no
// telemetry pods, no Istio CRDs, no request body). Every other field always carries a
// measured or recorded value. docs/report.md repeats this list.
var SMPZeroAllowed = map[string]string{
	"clients.cookies":        "the load generator sent no cookies",
	"clients.body":           "requests without a body (GET) send none",
	"clients.rps":            "closed-model clients have no target rate",
	"clients.connections":    "open-model clients that do not pin a connection count",
	"clients.internal":       "false means traffic entered through an ingress",
	"ingress_gateway":        "meshes without an ingress gateway component report zeros",
	"sidecar":                "the baseline and sidecar-less meshes have no sidecars",
	"mesh_telemetry":         "no separate telemetry component ran (proxies export their own stats)",
	"mesh_policy":            "no separate policy component ran",
	"mesh_control_plane":     "meshes configured statically (no xDS server) have no control plane",
	"bps":                    "the results model stores no byte counters yet",
	"mesh_policy_enabled":    "false when no authorization policy was configured",
	"mesh_telemetry_enabled": "false when the mesh ran with telemetry off",
	"mtls_enabled":           "false when the mesh ran without mTLS (always for the baseline)",
	"proxy_concurrency":      "0 for the baseline, which runs no proxy",
}

func renderSMP(w io.Writer, run *results.Run, s *Summary, opts Options) error {
	doc := BuildSMP(run, s, opts)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

func mb(bytes float64) int32 { return int32(math.Round(bytes / 1e6)) }

func stableUUID(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	h[6] = (h[6] & 0x0f) | 0x50 // version 5 layout (name-based), SHA-256 truncated
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func sha256Hex(s string) string { return results.SHA256Hex([]byte(s)) }

// BuildSMP assembles the SMP export of a run from its summary.
func BuildSMP(run *results.Run, s *Summary, opts Options) SMPDocument {
	version := opts.MeshmarkVersion
	if version == "" {
		version = run.Provenance.MeshmarkVersion
	}
	if version == "" {
		version = "dev"
	}
	envID := run.ID + "/env"
	doc := SMPDocument{}

	// Test config: one client per experiment (its first trial's parameters).
	tc := SMPTestConfig{SMPVersion: SMPSchema, ID: run.ID, Name: run.Study,
		Labels: map[string]string{"meshmark.run": run.ID, "meshmark.study": run.Study, "meshmark.substrate": orNone(run.Substrate, "local"),
			"meshmark.status": string(run.Status), "meshmark.seed": strconv.FormatInt(run.Seed, 10)}}
	seenExp := map[string]bool{}
	var longest time.Duration
	var firstURL, firstHeaders string
	for i := range run.Trials {
		t := &run.Trials[i]
		longest = max(longest, t.Duration())
		if seenExp[t.Experiment] {
			continue
		}
		seenExp[t.Experiment] = true
		c := clientOf(t, version)
		tc.Clients = append(tc.Clients, c)
		if firstURL == "" && len(c.EndpointURL) > 0 {
			firstURL = c.EndpointURL[0]
			var hs []string
			for _, k := range sortedKeys(c.Headers) {
				hs = append(hs, k+": "+c.Headers[k])
			}
			firstHeaders = strings.Join(hs, "; ")
		}
	}
	tc.Duration = longest.String()
	doc.PerformanceTestConfig = tc

	for _, g := range s.Groups {
		r := SMPResult{SMPVersion: SMPSchema, ID: fmt.Sprintf("%s/%s/%s/%d", run.ID, g.Mesh, g.Experiment, g.Step),
			Labels: map[string]string{"meshmark.mesh": g.Mesh, "meshmark.experiment": g.Experiment, "meshmark.step": strconv.Itoa(g.Step),
				"meshmark.point": g.Label, "meshmark.repeats": strconv.Itoa(g.Repeats), "meshmark.requests": strconv.FormatInt(g.Requests, 10),
				"meshmark.errors": strconv.FormatInt(g.Errors, 10), "meshmark.p999_ms": num(g.P999Ms),
				"meshmark.pooling": "histograms merged over repeats"},
			StartTime: g.Start.UTC(), EndTime: g.End.UTC(),
			LatenciesMs: SMPLatency{Min: float64(g.MinMs), Average: float64(g.MeanMs), P50: float64(g.P50Ms), P90: float64(g.P90Ms),
				P99: float64(g.P99Ms), Max: float64(g.MaxMs)},
			ActualQPS:  float64(g.Throughput),
			DetailsURI: fmt.Sprintf("meshmark://runs/%s/experiments/%s/steps/%d/meshes/%s", run.ID, url.PathEscape(g.Experiment), g.Step, url.PathEscape(g.Mesh)),
			TestID:     run.ID + "/" + g.Experiment, MeshConfigID: run.ID + "/" + g.Mesh, EnvID: envID}
		doc.Results = append(doc.Results, r)
	}

	for _, m := range run.Meshes {
		doc.MeshConfigs = append(doc.MeshConfigs, meshConfig(run, s, m, version))
	}

	env := SMPEnvironment{SMPVersion: SMPSchema, ID: envID,
		Labels: map[string]string{"meshmark.kernel": orNone(run.Provenance.Kernel, "unknown kernel"), "meshmark.os": orNone(run.Provenance.OS, "unknown os"),
			"meshmark.cpu": orNone(run.Provenance.CPUModel, "unknown cpu"), "meshmark.host": orNone(run.Provenance.Hostname, "unknown host")}}
	env.KubernetesVersion = run.Provenance.Components["kubernetes"]
	if env.KubernetesVersion == "" {
		env.KubernetesVersion = "none: local substrate, no Kubernetes (kernel " + orNone(run.Provenance.Kernel, "unknown") + ")"
	}
	nodes := map[string]bool{}
	for _, r := range run.Trials {
		for _, x := range r.Result.Resources {
			if x.Node != "" {
				nodes[x.Node] = true
			}
		}
	}
	nodeType := "local: network-namespace node on " + orNone(run.Provenance.CPUModel, "this machine")
	if run.Substrate == "kubernetes" {
		nodeType = "kubernetes node"
	}
	for range max(len(nodes), 1) {
		env.Node = append(env.Node, SMPNode{Type: nodeType, Cores: int32(run.Provenance.Cores), MemMB: run.Provenance.MemoryBytes / 1e6})
	}
	env.IndividualWorkloads = workloads(s)
	host := "none: the runner recorded no target URL (params.extra.url)"
	if u, err := url.Parse(firstURL); err == nil && u.Scheme == "http" && u.Host != "" {
		host = u.Hostname()
	}
	env.TrafficMetadata = SMPTraffic{LoadBalanceName: "none: the load generator calls the service address directly", LoadBalanceIP: host,
		HostEndpoint: firstURL, PrometheusURL: "none: meshmark reads /proc and proxy admin endpoints itself, no Prometheus",
		HTTPHeaders: firstHeaders, UserAgent: "meshmark", PingHealthEndpoint: firstURL}
	doc.Env = env
	return doc
}

func orNone(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

func clientOf(t *results.Trial, version string) SMPClient {
	x := t.Params.Extra
	c := SMPClient{Internal: t.Params.Path != "ingress", LoadGenerator: "meshmark " + version,
		Protocol: orNone(x["protocol"], "http"), Connections: int32(t.Params.Connections), RPS: int64(math.Round(t.Params.RequestedRate)),
		Headers: map[string]string{"User-Agent": "meshmark"}, Cookies: map[string]string{}, Body: x["body"]}
	if !t.Params.KeepAlive {
		c.Headers["Connection"] = "close"
	}
	for k, v := range x {
		switch {
		case strings.HasPrefix(k, "header."):
			c.Headers[strings.TrimPrefix(k, "header.")] = v
		case strings.HasPrefix(k, "cookie."):
			c.Cookies[strings.TrimPrefix(k, "cookie.")] = v
		}
	}
	c.ContentType = x["content_type"]
	if c.ContentType == "" {
		c.ContentType = "none: " + orNone(x["method"], "GET") + " request without a body"
	}
	if u := x["url"]; u != "" {
		c.EndpointURL = []string{u}
	} else {
		c.EndpointURL = []string{"meshmark://experiments/" + url.PathEscape(t.Experiment)}
	}
	return c
}

func meshConfig(run *results.Run, s *Summary, m results.Mesh, version string) SMPMeshConfig {
	mc := SMPMeshConfig{SMPVersion: SMPSchema, ID: run.ID + "/" + m.Label, Labels: map[string]string{"meshmark.mesh": m.Label, "meshmark.profile": m.Profile},
		Profile: m.Profile, ExpGroupUUID: stableUUID(run.ID), ExpUUID: stableUUID(run.ID, m.Label)}
	for k, v := range m.Options {
		mc.Labels["meshmark.option."+k] = v
	}
	mc.MeshType.Type = mesh.SMPType(m.Profile)
	var throughput float64
	for _, c := range s.Costs {
		if c.Mesh == m.Label {
			throughput = c.Throughput
		}
	}
	add := func(count *int32, cpu, mem *int32, role string) {
		pods := map[string]bool{}
		var cores, bytes float64
		for _, r := range s.Resources {
			if r.Mesh == m.Label && r.Role == role {
				pods[r.Pod+"/"+r.Component] = true
				cores += r.AvgCores
				bytes += r.AvgMemMiB * (1 << 20)
			}
		}
		*count, *cpu, *mem = int32(len(pods)), int32(math.Round(cores*1000)), mb(bytes)
	}
	add(&mc.IngressGateway.Count, &mc.IngressGateway.CPUmCores, &mc.IngressGateway.MemMB, "gateway")
	if mc.IngressGateway.Count > 0 {
		mc.IngressGateway.RPS = int32(math.Round(throughput))
	}
	add(&mc.Sidecar.Count, &mc.Sidecar.CPUmCores, &mc.Sidecar.MemMB, "sidecar")
	if mc.Sidecar.Count == 0 {
		add(&mc.Sidecar.Count, &mc.Sidecar.CPUmCores, &mc.Sidecar.MemMB, "node-proxy")
	}
	if mc.Sidecar.Count > 0 {
		mc.Sidecar.RPS = int32(math.Round(throughput))
	}
	add(&mc.MeshTelemetry.Count, &mc.MeshTelemetry.CPUmCores, &mc.MeshTelemetry.MemMB, "telemetry")
	add(&mc.MeshPolicy.Count, &mc.MeshPolicy.CPUmCores, &mc.MeshPolicy.MemMB, "policy")
	cp := &mc.MeshControlPlane
	add(&cp.Count, &cp.CPUmCores, &cp.MemMB, "control-plane")
	var e enrollment
	if json.Unmarshal(m.Enrollment, &e) == nil {
		services := map[string]bool{}
		for _, p := range e.Pods {
			if p.Service != "" {
				services[p.Service] = true
				cp.Endpoints++
			}
			if p.Sidecar {
				cp.Sidecars++
			}
		}
		cp.Services = int32(len(services))
	}
	mc.MeshPolicyEnabled = m.Options["authorization"] != "" && m.Options["authorization"] != "off"
	// The mesh's effective options: what the study set, with the mesh package's defaults
	// for the rest; the mTLS mode the equivalence check recorded wins over both.
	if m.Profile != results.BaselineProfile {
		raw := map[string]any{}
		for k, v := range m.Options {
			if n, err := strconv.Atoi(v); err == nil {
				raw[k] = n
			} else {
				raw[k] = v
			}
		}
		if o, err := mesh.ParseOptions(raw); err == nil {
			mc.MeshTelemetryEnabled = o.Telemetry
			mc.ProxyConcurrency = int32(o.Concurrency)
			mc.MTLSEnabled = o.MTLS == mesh.MTLSPermissive || o.MTLS == mesh.MTLSStrict
		}
	}
	if e.MTLS != "" {
		mc.MTLSEnabled = e.MTLS == string(mesh.MTLSPermissive) || e.MTLS == string(mesh.MTLSStrict)
	}
	comps := run.Provenance.Components
	mc.MeshBuild = orNone(comps[m.Profile], "meshmark "+version+" profile "+m.Profile)
	mc.ProxyBuild = comps["envoy"]
	if m.Profile == results.BaselineProfile || mc.ProxyBuild == "" {
		mc.ProxyBuild = "none: profile " + m.Profile + " runs no proxy"
	}
	mc.ApplicationMetadata = SMPApplication{ApplicationName: run.Study, ApplicationVersion: "meshmark " + version,
		HelmchartName: "none: local substrate installs no Helm chart", HelmchartVersion: "none: local substrate installs no Helm chart",
		CNABSpecVersion: "none: not packaged as a CNAB bundle", ComposeVersion: "none: not a Compose application",
		ClusterName: orNone(run.Provenance.Hostname, "local"), K8sVersionSupported: "none: runs without Kubernetes",
		ApplicationProtocol: "http"}
	if run.Substrate == "kubernetes" {
		mc.ApplicationMetadata.K8sVersionSupported = orNone(comps["kubernetes"], "unknown")
	}
	return mc
}

func workloads(s *Summary) []SMPWorkload {
	type acc struct {
		pods       map[string]bool
		cores, mem float64
	}
	by := map[string]*acc{}
	for _, r := range s.Resources {
		if r.Role != "workload" || r.Mesh != s.Baseline {
			continue
		}
		a := by[r.Component]
		if a == nil {
			a = &acc{pods: map[string]bool{}}
			by[r.Component] = a
		}
		a.pods[r.Pod] = true
		a.cores += r.AvgCores
		a.mem += r.AvgMemMiB * (1 << 20)
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []SMPWorkload
	for _, n := range names {
		a := by[n]
		out = append(out, SMPWorkload{Name: n, Count: int32(len(a.pods)), CPUmCores: int32(math.Round(a.cores * 1000)), MemMB: mb(a.mem)})
	}
	return out
}
