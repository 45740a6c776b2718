package envoysidecar

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/pki"
)

func TestGeneratedBootstrapPassesEnvoyValidation(t *testing.T) {
	envoy := envoyBinary(t)
	ca, err := pki.NewCA("cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	app := bookinfo()
	app.Services[3].Protocol = "grpc" // ratings: HTTP/2 upstream clusters
	variants := []struct {
		name string
		mode mesh.MTLSMode
		raw  map[string]any
	}{
		{"off", mesh.MTLSOff, nil},
		{"permissive", mesh.MTLSPermissive, nil},
		{"strict-lean", mesh.MTLSStrict, map[string]any{"telemetry": "off", "request_id": false, "circuit_breakers": "proxy-default", "access_log": true, "retries": "off"}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			opts, err := mesh.ParseOptions(v.raw)
			if err != nil {
				t.Fatal(err)
			}
			for _, pod := range []int{0, 3, 5} { // productpage, a reviews version, ratings
				dir := t.TempDir()
				p := app.Pods()[pod]
				certs := writeCerts(t, ca, dir, p.Identity)
				b, err := BuildBootstrap(app, p, opts, v.mode, certs)
				if err != nil {
					t.Fatal(err)
				}
				js, err := MarshalBootstrap(b)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(dir, "envoy.json")
				if err := os.WriteFile(path, js, 0o600); err != nil {
					t.Fatal(err)
				}
				validate(t, envoy, path)
				s := string(js)
				for _, want := range []string{"virtualOutbound", "virtualInbound", "outbound|9080|v2|reviews.bookinfo.svc.cluster.local", "envoy.filters.listener.original_dst", "127.0.0.6", `"reviews:9080"`} {
					if !strings.Contains(s, want) {
						t.Errorf("config lacks %q", want)
					}
				}
				if got := strings.Contains(s, "retriable-status-codes"); got != opts.Retries {
					t.Errorf("retry policy present=%v with retries %v", got, opts.Retries)
				}
				if got := strings.Contains(s, "4294967295"); got != (opts.CircuitBreakers == mesh.CircuitBreakersUnlimited) {
					t.Errorf("unlimited circuit breakers present=%v with option %s", got, opts.CircuitBreakers)
				}
				if !strings.Contains(s, "http2ProtocolOptions") {
					t.Error("gRPC service ratings has no HTTP/2 cluster")
				}
				if got := strings.Contains(s, "UpstreamTlsContext"); got != (v.mode != mesh.MTLSOff) {
					t.Errorf("upstream TLS present=%v under mtls %s", got, v.mode)
				}
			}
		})
	}
}
