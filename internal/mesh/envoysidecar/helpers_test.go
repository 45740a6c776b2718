package envoysidecar

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/topology"
)

func envoyBinary(t testing.TB) string {
	t.Helper()
	p, err := prereq.Envoy()
	if err != nil {
		t.Fatalf("these tests run a real Envoy: %v (or set MESHMARK_ENVOY)", err)
	}
	return p
}

// bookinfo is a bookinfo-shaped app with fixed addresses; reviews splits 20/30/50.
func bookinfo() *topology.App {
	ns := "bookinfo"
	pod := func(svc, ver, ip string, idx int) topology.Pod {
		return topology.Pod{
			Name: svc + "-" + ver + "-0", Service: svc, Version: ver, NetNS: "x",
			IP: netip.MustParseAddr(ip), Port: 9080, ServiceAccount: svc,
			Identity: topology.SPIFFEID("cluster.local", ns, svc),
		}
	}
	svc := func(name, vip string, versions ...topology.Version) topology.Service {
		return topology.Service{Name: name, VIP: netip.MustParseAddr(vip), Port: 9080, Protocol: "http", Versions: versions}
	}
	return &topology.App{
		Name: "bookinfo", Namespace: ns,
		Services: []topology.Service{
			svc("productpage", "198.19.128.1", topology.Version{Name: "v1", Weight: 100, Endpoints: []topology.Pod{pod("productpage", "v1", "198.18.1.2", 0)}}),
			svc("details", "198.19.128.2", topology.Version{Name: "v1", Weight: 100, Endpoints: []topology.Pod{pod("details", "v1", "198.18.1.3", 0)}}),
			svc("reviews", "198.19.128.3",
				topology.Version{Name: "v1", Weight: 20, Endpoints: []topology.Pod{pod("reviews", "v1", "198.18.1.4", 0)}},
				topology.Version{Name: "v2", Weight: 30, Endpoints: []topology.Pod{pod("reviews", "v2", "198.18.1.5", 0)}},
				topology.Version{Name: "v3", Weight: 50, Endpoints: []topology.Pod{pod("reviews", "v3", "198.18.1.6", 0)}}),
			svc("ratings", "198.19.128.4", topology.Version{Name: "v1", Weight: 100, Endpoints: []topology.Pod{pod("ratings", "v1", "198.18.1.7", 0)}}),
		},
		Clients: []topology.Pod{{Name: "loadgen", NetNS: "x", IP: netip.MustParseAddr("198.18.1.8")}},
	}
}

// writeCerts issues pod's certificate and writes CA, cert and key into dir.
func writeCerts(t testing.TB, ca *pki.CA, dir, id string) CertPaths {
	t.Helper()
	leaf, err := ca.Issue(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	cp := CertPaths{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	for p, b := range map[string][]byte{cp.CA: ca.CertPEM(), cp.Cert: leaf.CertPEM, cp.Key: leaf.KeyPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cp
}

// validate runs `envoy --mode validate` on a config file.
func validate(t testing.TB, envoy, path string) {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), envoy, "--mode", "validate", "-c", path, "--log-level", "error").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy rejected %s: %v\n%s", path, err, out)
	}
}

var _ = mesh.DefaultOptions
