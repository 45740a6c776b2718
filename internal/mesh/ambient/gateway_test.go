package ambient

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/topology"
)

// The ambient ingress gateway as generated: Envoy accepts it; it listens in plaintext
// on the gateway port, splits the entry service per request over its versions with
// weight, and reaches each pod only over HBONE (port 15008, TLS 1.3, the pod's SPIFFE
// ID checked); ztunnel's config leaves the gateway service outside the waypoint.
func TestIngressGatewayBootstrap(t *testing.T) {
	envoy, err := prereq.Envoy()
	if err != nil {
		t.Fatalf("this test validates with a real Envoy: %v", err)
	}
	app := splitApp()
	gwPod := topology.Pod{Name: "gw-0", Service: gateway.Service, Version: "v1", Node: "node0", IP: netip.MustParseAddr("198.18.1.9"), Port: gateway.Port}
	app.Services = append(app.Services, topology.Service{Name: gateway.Service, VIP: netip.MustParseAddr("198.19.128.9"), Port: gateway.Port,
		Versions: []topology.Version{{Name: "v1", Endpoints: []topology.Pod{gwPod}}}})
	dir := t.TempDir()
	ca, err := pki.NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	id := func(p topology.Pod) string {
		return topology.SPIFFEID("cluster.local", app.Namespace, ServiceAccount(p))
	}
	leaf, err := ca.Issue(id(gwPod), 0)
	if err != nil {
		t.Fatal(err)
	}
	files := WaypointFiles{CA: filepath.Join(dir, "root.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	for path, b := range map[string][]byte{files.CA: ca.CertPEM(), files.Cert: leaf.CertPEM, files.Key: leaf.KeyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := BuildIngressGateway(app, "reviews", gwPod, id, files)
	if err != nil {
		t.Fatal(err)
	}
	js, err := MarshalWaypoint(b)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gateway.json")
	if err := os.WriteFile(path, js, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(context.Background(), envoy, "--mode", "validate", "-c", path, "--log-level", "error").CombinedOutput(); err != nil {
		t.Fatalf("envoy rejected the gateway: %v\n%s", err, out)
	}
	s := string(js)
	for _, want := range []string{gateway.HopHeader, "reviews|v1", "reviews|v2", "connect_originate|198.18.2.3", "hbone|198.18.1.3",
		id(topology.Pod{Name: "rv2-0", Service: "reviews"})} {
		if !strings.Contains(s, want) {
			t.Errorf("gateway config lacks %q", want)
		}
	}
	for _, unwanted := range []string{"reviews|v3", "productpage", "connect_terminate"} {
		if strings.Contains(s, unwanted) {
			t.Errorf("gateway config has %q", unwanted)
		}
	}
	for _, c := range b.StaticResources.Clusters {
		if !strings.HasPrefix(c.Name, "hbone|") {
			continue
		}
		ep := c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress()
		if ep.GetPortValue() != HBONEPort || c.TransportSocket == nil {
			t.Errorf("cluster %s: endpoint port %d, TLS %v: want HBONE over mTLS", c.Name, ep.GetPortValue(), c.TransportSocket != nil)
		}
	}
	if front := b.StaticResources.Listeners[0]; front.Address.GetSocketAddress().GetPortValue() != gateway.Port || b.Admin.Address.GetSocketAddress().GetPortValue() != gateway.AdminPort {
		t.Errorf("front listener %s, admin %v", front.Name, b.Admin.Address)
	}

	cfg, err := BuildLocalConfig(app, map[string]bool{"pp-0": true}, ServiceAccount, "cluster.local", nil,
		&WaypointWorkload{Name: "waypoint", ServiceAccount: WaypointServiceAccount, Node: "node0", IP: netip.MustParseAddr("198.18.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range cfg.Services {
		if (svc.Waypoint != nil) == (svc.Name == gateway.Service) {
			t.Errorf("service %s: waypoint %v; the gateway alone goes without", svc.Name, svc.Waypoint)
		}
	}
}
