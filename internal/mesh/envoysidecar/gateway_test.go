package envoysidecar

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/topology"
)

// Istio's ingress gateway as generated: Envoy accepts it, it listens on the gateway
// port in plaintext, routes to the entry service's versions by weight, originates mTLS
// to them unless mTLS is off, and has no sidecar half; the sidecars send it plaintext.
func TestGatewayBootstrap(t *testing.T) {
	envoy := envoyBinary(t)
	ca, err := pki.NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	app := bookinfo()
	gwPod := topology.Pod{Name: "ingress-gateway-v1-0", Service: gateway.Service, Version: "v1", NetNS: "x",
		IP: netip.MustParseAddr("198.18.1.9"), Port: gateway.Port, Identity: topology.SPIFFEID("cluster.local", app.Namespace, gateway.Service)}
	app.Services = append(app.Services, topology.Service{Name: gateway.Service, VIP: netip.MustParseAddr("198.19.128.9"), Port: gateway.Port, Protocol: "http",
		Versions: []topology.Version{{Name: "v1", Weight: 100, Endpoints: []topology.Pod{gwPod}}}})
	for _, mode := range []mesh.MTLSMode{mesh.MTLSOff, mesh.MTLSStrict} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			certs := writeCerts(t, ca, dir, gwPod.Identity)
			b, err := BuildGatewayBootstrap(app, gwPod, "reviews", mesh.DefaultOptions(), mode, certs)
			if err != nil {
				t.Fatal(err)
			}
			js, err := MarshalBootstrap(b)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "gateway.json")
			if err := os.WriteFile(path, js, 0o600); err != nil {
				t.Fatal(err)
			}
			validate(t, envoy, path)
			if n := len(b.StaticResources.Listeners); n != 1 || b.StaticResources.Listeners[0].Address.GetSocketAddress().GetPortValue() != gateway.Port {
				t.Errorf("listeners: %d, want one on %d", n, gateway.Port)
			}
			if b.Admin.Address.GetSocketAddress().GetPortValue() != gateway.AdminPort || !strings.HasPrefix(b.Node.Id, "router~") {
				t.Errorf("admin %v, node %q: want the gateway's admin port and router mode", b.Admin.Address, b.Node.Id)
			}
			s := string(js)
			// protojson varies its spacing from run to run, so the one boolean is matched loosely.
			if !regexp.MustCompile(`"useRemoteAddress":\s*true`).MatchString(s) {
				t.Error("the gateway trusts its callers' forwarding headers (use_remote_address is not set)")
			}
			for _, want := range []string{gateway.HopHeader, "outbound|9080|v1|reviews.bookinfo.svc.cluster.local", "outbound|9080|v3|reviews.bookinfo.svc.cluster.local"} {
				if !strings.Contains(s, want) {
					t.Errorf("gateway config lacks %q", want)
				}
			}
			for _, unwanted := range []string{"virtualInbound", "virtualOutbound", "productpage"} {
				if strings.Contains(s, unwanted) {
					t.Errorf("gateway config has %q", unwanted)
				}
			}
			if tls := len(b.StaticResources.Clusters) > 0 && b.StaticResources.Clusters[0].TransportSocket != nil; tls != (mode != mesh.MTLSOff) {
				t.Errorf("mtls %s: the entry cluster originates TLS: %v", mode, tls)
			}
		})
	}
	// The sidecars' clusters for the gateway service are plaintext even under strict.
	side, err := BuildResources(app, app.Pods()[0], mesh.DefaultOptions(), mesh.MTLSStrict, CertPaths{CA: "/ca", Cert: "/c", Key: "/k"})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range side.Clusters {
		if strings.HasSuffix(c.Name, "|"+gateway.Service+".bookinfo.svc.cluster.local") {
			found = true
			if c.TransportSocket != nil {
				t.Errorf("sidecar cluster %s originates mTLS to the gateway, which has no sidecar to end it", c.Name)
			}
		}
	}
	if !found {
		t.Error("the sidecar has no cluster for the gateway service")
	}
}
