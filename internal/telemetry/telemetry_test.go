package telemetry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
)

func envoyBinary(t *testing.T) string {
	t.Helper()
	p, err := prereq.Envoy()
	if err != nil {
		t.Skipf("no Envoy (%v)", err)
	}
	return p
}

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func writeCert(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshmark-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"backend.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

const envoyConfig = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: inbound
    stat_prefix: inbound_9080
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_certificates: [{certificate_chain: {filename: %[1]q}, private_key: {filename: %[2]q}}]
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inbound_0.0.0.0_9080
          route_config:
            virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: "inbound|9080||"}}]}]
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
  - name: outbound
    stat_prefix: outbound_9080
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: outbound_0.0.0.0_9080
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/broken"}
                route:
                  cluster: broken
                  retry_policy: {retry_on: connect-failure, num_retries: 2}
              - match: {prefix: "/"}
                route: {cluster: "outbound|9080||reviews.default.svc.cluster.local"}
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
  clusters:
  - name: "inbound|9080||"
    connect_timeout: 2s
    load_assignment:
      cluster_name: inbound
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[3]d}}}}]}]
  - name: "outbound|9080||reviews.default.svc.cluster.local"
    connect_timeout: 2s
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: backend.test
    load_assignment:
      cluster_name: outbound
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[4]d}}}}]}]
  - name: broken
    connect_timeout: 1s
    load_assignment:
      cluster_name: broken
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[5]d}}}}]}]
`

type testEnvoy struct {
	admin             string
	inbound, outbound string
	backendAddr       string
	tlsBackendAddr    string
	closedPort        int
	binary            string
}

func startEnvoy(t *testing.T) *testEnvoy {
	t.Helper()
	bin := envoyBinary(t)
	dir := t.TempDir()
	certPath, keyPath := writeCert(t, dir)

	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain") }))
	t.Cleanup(backend.Close)
	tlsBackend := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	t.Cleanup(tlsBackend.Close)
	// A port nothing listens on, for connect failures.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	cfg := fmt.Sprintf(envoyConfig, certPath, keyPath, backend.Listener.Addr().(*net.TCPAddr).Port,
		tlsBackend.Listener.Addr().(*net.TCPAddr).Port, closedPort)
	cfgPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(dir, "admin.txt")
	logPath := filepath.Join(dir, "envoy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	baseID := fmt.Sprint(41000 + os.Getpid()%20000)
	cmd := exec.Command(bin, "-c", cfgPath, "--base-id", baseID, "--admin-address-path", adminPath,
		"--concurrency", "1", "-l", "warning")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	exited := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(exited) }()

	e := &testEnvoy{binary: bin, backendAddr: backend.Listener.Addr().String(),
		tlsBackendAddr: tlsBackend.Listener.Addr().String(), closedPort: closedPort}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("envoy exited: %s", b)
		default:
		}
		if b, err := os.ReadFile(adminPath); err == nil && len(b) > 0 {
			e.admin = strings.TrimSpace(string(b))
			if e.listeners(t) {
				return e
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("envoy not ready in 30s: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listeners fills in the listener addresses Envoy bound, once both are up.
func (e *testEnvoy) listeners(t *testing.T) bool {
	resp, err := http.Get("http://" + e.admin + "/listeners?format=json")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return false
	}
	for _, l := range body.ListenerStatuses {
		a := fmt.Sprintf("%s:%d", l.LocalAddress.SocketAddress.Address, l.LocalAddress.SocketAddress.PortValue)
		switch l.Name {
		case "inbound":
			e.inbound = a
		case "outbound":
			e.outbound = a
		}
	}
	return e.inbound != "" && e.outbound != "" && !strings.HasSuffix(e.inbound, ":0")
}

func get(t *testing.T, c *http.Client, url string, wantStatus int) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != wantStatus {
		t.Fatalf("GET %s: %s, want %d", url, resp.Status, wantStatus)
	}
}

func TestSnapshotDiffAgainstRealEnvoy(t *testing.T) {
	e := startEnvoy(t)
	var dials atomic.Int32
	client := NewClient(e.admin, func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, err := client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if dials.Load() == 0 {
		t.Fatal("the caller's dial func was not used")
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(before.Version) {
		t.Fatalf("version %q (build %q)", before.Version, before.BuildVersion)
	}
	out, _ := exec.Command(e.binary, "--version").Output()
	if !strings.Contains(string(out), "/"+before.Version+"/") {
		t.Errorf("admin version %q not in `envoy --version`: %s", before.Version, out)
	}
	hosts := map[string]Host{}
	for _, c := range before.Clusters {
		for _, h := range c.Hosts {
			hosts[c.Name] = h
		}
	}
	if h := hosts["outbound|9080||reviews.default.svc.cluster.local"]; h.Address != e.tlsBackendAddr || !h.Healthy {
		t.Errorf("clusters: %+v", before.Clusters)
	}

	const inbound, outbound, broken = 5, 7, 2
	// Inbound: a new TLS connection per request, so each makes one downstream handshake.
	tlsClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for range inbound {
		get(t, tlsClient, "https://"+e.inbound+"/", 200)
	}
	plain := &http.Client{Transport: &http.Transport{}}
	for range outbound {
		get(t, plain, "http://"+e.outbound+"/", 200)
	}
	for range broken {
		get(t, plain, "http://"+e.outbound+"/broken", 503)
	}
	plain.CloseIdleConnections()
	after, err := client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := Compare(before, after)
	if len(d.Resets) != 0 {
		t.Errorf("unexpected resets %v", d.Resets)
	}
	if got := InboundRequests(d); got != inbound {
		t.Errorf("InboundRequests = %d, want %d (http: %v)", got, inbound, HTTPRequests(d))
	}
	if got := OutboundRequests(d); got != outbound+broken {
		t.Errorf("OutboundRequests = %d, want %d (http: %v)", got, outbound+broken, HTTPRequests(d))
	}
	tlsStats := TLSHandshakes(d)
	if tlsStats.Downstream != inbound {
		t.Errorf("downstream handshakes %d, want %d: %+v", tlsStats.Downstream, inbound, tlsStats)
	}
	// Envoy pools upstream connections: at least one handshake, at most one per request.
	if tlsStats.Upstream < 1 || tlsStats.Upstream > outbound {
		t.Errorf("upstream handshakes %d, want 1..%d: %+v", tlsStats.Upstream, outbound, tlsStats)
	}
	if tlsStats.DownstreamErrors+tlsStats.UpstreamErrors+tlsStats.VerifyFailures != 0 {
		t.Errorf("TLS errors: %+v", tlsStats)
	}

	cl := map[string]ClusterStats{}
	for _, c := range Clusters(d) {
		cl[c.Name] = c
	}
	if len(cl) != 3 {
		t.Errorf("want 3 clusters, got %+v", cl)
	}
	if c := cl["inbound|9080||"]; c.Requests != inbound || c.Rq2xx != inbound || c.Errors() != 0 {
		t.Errorf("inbound cluster %+v", c)
	}
	if c := cl["outbound|9080||reviews.default.svc.cluster.local"]; c.Requests != outbound || c.Rq2xx != outbound ||
		c.TLSHandshakes != tlsStats.Upstream {
		t.Errorf("outbound cluster %+v", c)
	}
	// Each /broken request tries once and retries twice on connect failure.
	if c := cl["broken"]; c.ConnectFailures != broken*3 || c.Retries != broken*2 || c.Errors() < broken*3 {
		t.Errorf("broken cluster %+v", c)
	}
	// Every inbound request had its own connection; the outbound client reused one or a few.
	if got := Connections(d); len(got) != 2 || got["inbound_9080"] != inbound ||
		got["outbound_9080"] < 1 || got["outbound_9080"] > outbound+broken {
		t.Errorf("listener connections %v", got)
	}
}

func TestCompareFlagsCounterResets(t *testing.T) {
	before := Snapshot{Counters: map[string]uint64{"a": 10, "b": 5}}
	after := Snapshot{Counters: map[string]uint64{"a": 15, "b": 2, "c": 4}}
	d := Compare(before, after)
	if d.Counter("a") != 5 || d.Counter("b") != 2 || d.Counter("c") != 4 {
		t.Fatalf("diff %v", d.Counters)
	}
	if len(d.Resets) != 1 || d.Resets[0] != "b" {
		t.Fatalf("resets %v", d.Resets)
	}
}

func TestClustersIgnoresEnvoySubScopes(t *testing.T) {
	d := Diff{Counters: map[string]uint64{
		"cluster.a.b.upstream_rq_total":                           3,
		"cluster.a.b.external.upstream_rq_2xx":                    3,
		"cluster.a.b.upstream_rq_2xx":                             3,
		"cluster.a.b.zone.z1.z2.upstream_rq_2xx":                  3,
		"cluster.x.internal.upstream_rq_total":                    1, // no cluster "x": a real name
		"http.admin.downstream_rq_total":                          9,
		"http.inbound_http.downstream_rq_total":                   4,
		"http.outbound_0.0.0.0_80.downstream_rq_total":            6,
		"listener.admin.ssl.handshake":                            9,
		"listener.127.0.0.1_15006.ssl.handshake":                  2,
		"cluster.outbound|80||a.svc.ssl.handshake":                1,
		"cluster.outbound|80||a.svc.ssl.fail_verify_san":          1,
		"listener.127.0.0.1_15006.ssl.connection_error":           1,
		"listener.127.0.0.1_15006.downstream_cx_total":            7,
		"listener.admin.downstream_cx_total":                      9,
		"cluster.outbound|80||a.svc.upstream_cx_total":            1,
		"cluster.outbound|80||a.svc.upstream_rq_tx_reset":         1,
		"cluster.outbound|80||a.svc.upstream_rq_pending_overflow": 2,
	}}
	cs := Clusters(d)
	names := []string{}
	for _, c := range cs {
		names = append(names, c.Name)
	}
	if strings.Join(names, " ") != "a.b outbound|80||a.svc x.internal" {
		t.Fatalf("clusters %v", names)
	}
	if cs[0].Requests != 3 || cs[0].Rq2xx != 3 {
		t.Errorf("a.b %+v", cs[0])
	}
	if cs[1].Errors() != 3 || cs[1].TLSHandshakes != 1 {
		t.Errorf("outbound %+v", cs[1])
	}
	if InboundRequests(d) != 4 || OutboundRequests(d) != 6 {
		t.Errorf("in %d out %d", InboundRequests(d), OutboundRequests(d))
	}
	if tl := TLSHandshakes(d); tl != (TLS{Downstream: 2, DownstreamErrors: 1, Upstream: 1, VerifyFailures: 1}) {
		t.Errorf("tls %+v", tl)
	}
	if c := Connections(d); len(c) != 1 || c["127.0.0.1_15006"] != 7 {
		t.Errorf("connections %v", c)
	}
}

func TestSnapshotAllReportsWhichProxyFailed(t *testing.T) {
	e := startEnvoy(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	good := map[string]*Client{"a": NewClient(e.admin, nil), "b": NewClient(e.admin, nil)}
	snaps, err := SnapshotAll(ctx, good)
	if err != nil || len(snaps) != 2 || snaps["a"].Version == "" {
		t.Fatalf("SnapshotAll: %v %v", err, snaps)
	}
	diffs := CompareAll(snaps, snaps)
	if len(diffs) != 2 || InboundRequests(diffs["b"]) != 0 {
		t.Fatalf("diffs %v", diffs)
	}
	good["gone"] = NewClient(dead, nil)
	if _, err := SnapshotAll(ctx, good); err == nil || !strings.HasPrefix(err.Error(), "gone: ") {
		t.Fatalf("want an error naming the unreachable proxy, got %v", err)
	}
}
