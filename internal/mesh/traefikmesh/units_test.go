package traefikmesh

import (
	"net/netip"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/meshmark/meshmark/internal/topology"
)

func splitApp() *topology.App {
	pod := func(svc, ver, ip string) topology.Pod {
		return topology.Pod{Name: svc + "-" + ver + "-0", Service: svc, Version: ver, IP: netip.MustParseAddr(ip), Port: 9080}
	}
	return &topology.App{Name: "bookinfo", Namespace: "bookinfo", Services: []topology.Service{
		{Name: "productpage", Port: 9080, Versions: []topology.Version{{Name: "v1", Weight: 100, Endpoints: []topology.Pod{pod("productpage", "v1", "198.18.1.2")}}}},
		{Name: "reviews", Port: 9080, Versions: []topology.Version{
			{Name: "v1", Weight: 25, Endpoints: []topology.Pod{pod("reviews", "v1", "198.18.1.3")}},
			{Name: "v2", Weight: 75, Endpoints: []topology.Pod{pod("reviews", "v2", "198.18.1.4")}},
			{Name: "v3", Weight: 0, Endpoints: []topology.Pod{pod("reviews", "v3", "198.18.1.5")}},
		}},
	}}
}

func TestDynamicConfigFromGraph(t *testing.T) {
	b, err := DynamicConfig(splitApp(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var c dynamicConfig
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	r := c.HTTP.Routers["reviews"]
	if r.Rule != "Host(`reviews.bookinfo.traefik.mesh`)" || r.Service != "reviews" || len(r.EntryPoints) != 1 || r.EntryPoints[0] != "reviews" {
		t.Errorf("reviews router: %+v", r)
	}
	w := c.HTTP.Services["reviews"].Weighted
	if w == nil || len(w.Services) != 2 || w.Services[0] != (weightedService{"reviews_v1", 25}) || w.Services[1] != (weightedService{"reviews_v2", 75}) {
		t.Fatalf("reviews split: %+v\n%s", w, b)
	}
	if _, has := c.HTTP.Services["reviews_v3"]; has {
		t.Errorf("weight-0 version configured:\n%s", b)
	}
	lb := c.HTTP.Services["productpage"].LoadBalancer
	if lb == nil || len(lb.Servers) != 1 || lb.Servers[0].URL != "http://198.18.1.2:9080" {
		t.Errorf("productpage: %+v", c.HTTP.Services["productpage"])
	}

	app := splitApp()
	app.Services[1].Protocol = "grpc"
	b, err = DynamicConfig(app, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "url: h2c://198.18.1.3:9080") || !strings.Contains(string(b), "url: http://198.18.1.2:9080") {
		t.Errorf("a gRPC service's pods must be reached in h2c, the others in HTTP/1.1:\n%s", b)
	}
}

// ACL mode: a restricted service's router carries an IP allow-list of its callers' pods,
// one allowing nobody an address no pod has; the others stay open.
func TestDynamicConfigACL(t *testing.T) {
	b, err := DynamicConfig(splitApp(), map[string][]string{"reviews": {"198.18.1.2/32"}, "productpage": {}})
	if err != nil {
		t.Fatal(err)
	}
	var c dynamicConfig
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if r := c.HTTP.Routers["reviews"]; len(r.Middlewares) != 1 || r.Middlewares[0] != "acl-reviews" {
		t.Errorf("reviews router: %+v", r)
	}
	if m := c.HTTP.Middlewares["acl-reviews"].IPAllowList; m == nil || len(m.SourceRange) != 1 || m.SourceRange[0] != "198.18.1.2/32" {
		t.Errorf("reviews allow-list: %+v\n%s", m, b)
	}
	if m := c.HTTP.Middlewares["acl-productpage"].IPAllowList; m == nil || len(m.SourceRange) != 1 || m.SourceRange[0] != denyAll {
		t.Errorf("productpage allows nobody, got %+v", m)
	}
	if _, err := DynamicConfig(splitApp(), map[string][]string{"nosuch": nil}); err == nil {
		t.Error("access control for an unknown service accepted")
	}
	open, _ := DynamicConfig(splitApp(), nil)
	if strings.Contains(string(open), "middlewares") {
		t.Errorf("no ACL, yet middlewares:\n%s", open)
	}
}

func TestStaticConfig(t *testing.T) {
	b, err := StaticConfig(splitApp(), "/run/x/dynamic.yml", false)
	if err != nil {
		t.Fatal(err)
	}
	var c staticConfig
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.EntryPoints["productpage"].Address != ":5000" || c.EntryPoints["reviews"].Address != ":5001" || c.EntryPoints[metricsEntryPoint].Address != "127.0.0.1:8082" {
		t.Errorf("entry points: %+v", c.EntryPoints)
	}
	if !c.Metrics.Prometheus.AddRoutersLabels || c.Providers.File.Filename != "/run/x/dynamic.yml" || c.AccessLog != nil {
		t.Errorf("static config:\n%s", b)
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(`# HELP traefik_router_requests_total How many HTTP requests are processed on a router, partitioned by service, status code, protocol, and method.
# TYPE traefik_router_requests_total counter
traefik_router_requests_total{code="200",method="GET",protocol="http",router="reviews@file",service="reviews@file"} 12
traefik_router_requests_total{code="502",method="GET",protocol="http",router="reviews@file",service="reviews@file"} 3
traefik_router_requests_total{code="200",method="GET",protocol="http",router="productpage@file",service="productpage@file"} 1e+06
process_resident_memory_bytes 4.2e+07
go_goroutines 31
`)
	if err != nil {
		t.Fatal(err)
	}
	if m.RouterRequests["reviews"] != 15 || m.RouterRequests["productpage"] != 1000000 {
		t.Errorf("router requests %v", m.RouterRequests)
	}
	if m.Values["process_resident_memory_bytes"] != 42000000 || m.Values["go_goroutines"] != 31 {
		t.Errorf("values %v", m.Values)
	}
	if _, err := ParseMetrics("traefik_router_requests_total{router=\"a\"} x\n"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("bad value accepted: %v", err)
	}
}
