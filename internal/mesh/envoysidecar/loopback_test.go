package envoysidecar

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/pki"
	"github.com/meshmark/meshmark/internal/topology"
)

// These tests run real Envoys on loopback, without namespaces or iptables: listeners
// that would receive redirected traffic are bound on spare 127.0.0.0/8 addresses
// instead, so the generated routes, clusters, TLS contexts and filter chains are the
// production ones.

// runningEnvoy is an Envoy started from a generated bootstrap.
type runningEnvoy struct {
	admin string // host:port
	pid   int
}

func startEnvoy(t testing.TB, b []byte) runningEnvoy {
	t.Helper()
	envoy := envoyBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "envoy.json")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(dir, "admin")
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(envoy, "-c", cfg, "--concurrency", "1", "--disable-hot-restart",
		"--admin-address-path", adminPath, "--log-level", "warning")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logf.Name())
			t.Logf("envoy log:\n%s", log)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("envoy exited: %v\n%s", err, log)
		default:
		}
		if a, err := os.ReadFile(adminPath); err == nil && len(a) > 0 {
			admin := strings.TrimSpace(string(a))
			if resp, err := http.Get("http://" + admin + "/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return runningEnvoy{admin: admin, pid: cmd.Process.Pid}
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("envoy not ready within 30s")
	return runningEnvoy{}
}

func (e runningEnvoy) stats(t testing.TB) Stats {
	t.Helper()
	resp, err := http.Get("http://" + e.admin + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	s, err := ParseStats(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// versionServer answers every request with its name and the caller identity Envoy
// forwarded (x-forwarded-client-cert).
func versionServer(t testing.TB, addr, name string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s", name, r.Header.Get("X-Forwarded-Client-Cert"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

// freePortOn finds a port free on every one of the given loopback addresses.
func freePortOn(t testing.TB, addrs ...string) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", addrs[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ok := true
		var held []net.Listener
		for _, a := range addrs[1:] {
			l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", a, port))
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		ln.Close()
		for _, l := range held {
			l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatal("no common free port")
	return 0
}

func get(t testing.TB, client *http.Client, url, host string) (string, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return string(b), nil
}

func TestOutboundSidecarSplitsTrafficByWeight(t *testing.T) {
	port := freePortOn(t, "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.9")
	versions := map[string]string{"v1": "127.0.0.2", "v2": "127.0.0.3", "v3": "127.0.0.4"}
	weights := map[string]int{"v1": 20, "v2": 30, "v3": 50}
	svc := topology.Service{Name: "reviews", VIP: netip.MustParseAddr("198.19.128.3"), Port: port, Protocol: "http"}
	for _, v := range []string{"v1", "v2", "v3"} {
		versionServer(t, fmt.Sprintf("%s:%d", versions[v], port), v)
		svc.Versions = append(svc.Versions, topology.Version{Name: v, Weight: weights[v], Endpoints: []topology.Pod{{
			Name: "reviews-" + v, Service: "reviews", IP: netip.MustParseAddr(versions[v]), Port: port,
		}}})
	}
	app := &topology.App{Name: "t", Namespace: "default", Services: []topology.Service{svc}}
	client := topology.Pod{Name: "loadgen", IP: netip.MustParseAddr("127.0.0.9")}
	opts, _ := mesh.ParseOptions(map[string]any{"concurrency": 1})
	g := generator{app: app, pod: client, opts: opts, mode: mesh.MTLSOff, lay: layout{
		outboundAddr: "127.0.0.9", inboundAddr: "127.0.0.9", adminAddr: "127.0.0.9", bindVirtualAt: "127.0.0.9",
	}}
	b, err := g.bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := MarshalBootstrap(b)
	e := startEnvoy(t, js)

	hc := &http.Client{Timeout: 10 * time.Second}
	const n = 600
	counts := map[string]int{}
	for i := range n {
		body, err := get(t, hc, fmt.Sprintf("http://127.0.0.9:%d/", port), fmt.Sprintf("reviews:%d", port))
		if err != nil {
			t.Fatalf("request %d through the sidecar: %v", i, err)
		}
		counts[strings.SplitN(body, "|", 2)[0]]++
	}
	for v, w := range weights {
		got := 100 * float64(counts[v]) / n
		// Binomial sd at n=600 is at most ~2 points; 8 points is well past noise but
		// catches an ignored split (33 each) or a swapped weight.
		if got < float64(w)-8 || got > float64(w)+8 {
			t.Errorf("version %s got %.1f%% of traffic, want %d%% ± 8 (counts %v)", v, got, w, counts)
		}
	}
	if tr := TrafficOf(e.stats(t)); tr.Outbound != n {
		t.Errorf("outbound stats count %d requests, sent %d", tr.Outbound, n)
	}
}

// meshPair is a client sidecar and a server sidecar on loopback, with the server's app
// behind its inbound listener.
type meshPair struct {
	port       int
	serverIP   string // where the server sidecar's inbound listener is (the "pod IP")
	clientSide runningEnvoy
	serverSide runningEnvoy
	ca         *pki.CA
}

func startMeshPair(t testing.TB, mode mesh.MTLSMode) meshPair {
	t.Helper()
	return startMeshPairFor(t, mode, "http", func(addr string) { versionServer(t, addr, "reviews") })
}

// startMeshPairFor is startMeshPair for a service speaking protocol, whose app serve
// starts on the address it is given.
func startMeshPairFor(t testing.TB, mode mesh.MTLSMode, protocol string, serve func(addr string)) meshPair {
	t.Helper()
	const serverIP, appIP, clientIP = "127.0.0.12", "127.0.0.11", "127.0.0.13"
	port := freePortOn(t, serverIP, appIP, clientIP)
	serve(fmt.Sprintf("%s:%d", appIP, port))
	ca, err := pki.NewCA("cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverPod := topology.Pod{Name: "reviews-v1", Service: "reviews", Version: "v1", IP: netip.MustParseAddr(serverIP), Port: port,
		Identity: topology.SPIFFEID("cluster.local", "default", "reviews")}
	clientPod := topology.Pod{Name: "productpage", Service: "productpage", IP: netip.MustParseAddr(clientIP),
		Identity: topology.SPIFFEID("cluster.local", "default", "productpage")}
	app := &topology.App{Name: "t", Namespace: "default", Services: []topology.Service{{
		Name: "reviews", VIP: netip.MustParseAddr("198.19.128.3"), Port: port, Protocol: protocol,
		Versions: []topology.Version{{Name: "v1", Weight: 100, Endpoints: []topology.Pod{serverPod}}},
	}}}
	opts, _ := mesh.ParseOptions(map[string]any{"concurrency": 1})
	build := func(pod topology.Pod, lay layout) []byte {
		var certs CertPaths
		if mode != mesh.MTLSOff {
			certs = writeCerts(t, ca, t.TempDir(), pod.Identity)
		}
		b, err := generator{app: app, pod: pod, opts: opts, mode: mode, certs: certs, lay: lay}.bootstrap()
		if err != nil {
			t.Fatal(err)
		}
		js, _ := MarshalBootstrap(b)
		return js
	}
	server := startEnvoy(t, build(serverPod, layout{
		outboundAddr: serverIP, inboundAddr: serverIP, inboundPort: uint32(port), adminAddr: serverIP, appAddr: appIP,
	}))
	client := startEnvoy(t, build(clientPod, layout{
		outboundAddr: clientIP, inboundAddr: clientIP, adminAddr: clientIP, bindVirtualAt: clientIP,
	}))
	return meshPair{port: port, serverIP: serverIP, clientSide: client, serverSide: server, ca: ca}
}

// throughMesh sends a request app -> client sidecar -> (m)TLS -> server sidecar -> app.
func (m meshPair) throughMesh(t testing.TB) (string, error) {
	return get(t, &http.Client{Timeout: 10 * time.Second}, fmt.Sprintf("http://127.0.0.13:%d/", m.port), fmt.Sprintf("reviews:%d", m.port))
}

// direct dials the server pod's inbound listener from outside the mesh, optionally
// with a client certificate.
func (m meshPair) direct(t testing.TB, cert *tls.Certificate) (string, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	scheme := "http"
	if cert != nil {
		scheme = "https"
		tr.TLSClientConfig = &tls.Config{
			Certificates:       []tls.Certificate{*cert},
			InsecureSkipVerify: true, // SPIFFE: verify the URI SAN below, not a host name
			VerifyConnection: func(cs tls.ConnectionState) error {
				id, err := m.ca.PeerID(cs.PeerCertificates)
				if err != nil {
					return err
				}
				if id != "spiffe://cluster.local/ns/default/sa/reviews" {
					return fmt.Errorf("server identity %s", id)
				}
				return nil
			},
		}
	}
	return get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, fmt.Sprintf("%s://%s:%d/", scheme, m.serverIP, m.port), "reviews")
}

func issue(t testing.TB, ca *pki.CA, id string) *tls.Certificate {
	t.Helper()
	leaf, err := ca.Issue(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestStrictMTLSRefusesPlaintextAndAcceptsMeshCertificates(t *testing.T) {
	m := startMeshPair(t, mesh.MTLSStrict)

	body, err := m.throughMesh(t)
	if err != nil {
		t.Fatalf("sidecar-to-sidecar mTLS request failed: %v", err)
	}
	if !strings.Contains(body, "URI=spiffe://cluster.local/ns/default/sa/productpage") {
		t.Errorf("app did not learn the caller's SPIFFE ID from the mesh; got %q", body)
	}

	if body, err := m.direct(t, nil); err == nil {
		t.Fatalf("strict mTLS served a plaintext request: %q", body)
	}

	probe := issue(t, m.ca, "spiffe://cluster.local/ns/default/sa/meshmark-probe")
	body, err = m.direct(t, probe)
	if err != nil {
		t.Fatalf("strict mTLS refused a client with a mesh certificate: %v", err)
	}
	if !strings.Contains(body, "sa/meshmark-probe") {
		t.Errorf("app saw caller %q, want the probe identity", body)
	}

	foreignCA, _ := pki.NewCA("cluster.local", time.Hour)
	if body, err := m.direct(t, issue(t, foreignCA, "spiffe://cluster.local/ns/default/sa/intruder")); err == nil {
		t.Fatalf("strict mTLS accepted a certificate from a foreign CA: %q", body)
	}

	// A TLS client without a certificate must not get through either.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, RootCAs: x509.NewCertPool()}}
	if _, err := get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, fmt.Sprintf("https://%s:%d/", m.serverIP, m.port), "reviews"); err == nil {
		t.Fatal("strict mTLS accepted TLS without a client certificate")
	}

	tr2 := TrafficOf(m.serverSide.stats(t))
	if tr2.InboundMTLS != 2 || tr2.InboundPlaintext != 0 {
		t.Errorf("server sidecar counted mtls=%d plaintext=%d inbound requests, want 2 and 0", tr2.InboundMTLS, tr2.InboundPlaintext)
	}
	if tr2.Answered != 2 {
		t.Errorf("server sidecar saw the app complete %d requests, want 2", tr2.Answered)
	}
	if out := TrafficOf(m.clientSide.stats(t)).Outbound; out != 1 {
		t.Errorf("client sidecar counted %d outbound requests, want 1", out)
	}
}

func TestPermissiveMTLSAcceptsBoth(t *testing.T) {
	m := startMeshPair(t, mesh.MTLSPermissive)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, f := range []func() (string, error){
		func() (string, error) { return m.throughMesh(t) },
		func() (string, error) { return m.direct(t, nil) },
		func() (string, error) {
			return m.direct(t, issue(t, m.ca, "spiffe://cluster.local/ns/default/sa/meshmark-probe"))
		},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("permissive refused a request: %v", err)
	}
	tr := TrafficOf(m.serverSide.stats(t))
	if tr.InboundMTLS != 2 || tr.InboundPlaintext != 1 {
		t.Errorf("server sidecar counted mtls=%d plaintext=%d, want 2 and 1", tr.InboundMTLS, tr.InboundPlaintext)
	}
}

func TestMTLSOffIsPlaintextOnTheWire(t *testing.T) {
	m := startMeshPair(t, mesh.MTLSOff)
	body, err := m.throughMesh(t)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(body, "spiffe://") {
		t.Errorf("mtls off still forwarded a client identity: %q", body)
	}
	tr := TrafficOf(m.serverSide.stats(t))
	if tr.InboundMTLS != 0 || tr.InboundPlaintext != 1 || tr.Answered != 1 {
		t.Errorf("server sidecar counted mtls=%d plaintext=%d answered=%d, want 0, 1, 1", tr.InboundMTLS, tr.InboundPlaintext, tr.Answered)
	}
	if _, err := m.direct(t, issue(t, m.ca, "spiffe://cluster.local/ns/default/sa/x")); err == nil {
		t.Error("mtls off accepted a TLS handshake on the app port")
	}
}

// BenchmarkRequestThroughSidecars measures one keep-alive HTTP/1.1 request on
// loopback: straight to the app, and app -> client sidecar -> server sidecar -> app
// with mTLS off and strict (one Envoy worker each). The difference is the per-request
// cost of the two proxy hops on this machine, without namespaces or iptables.
func BenchmarkRequestThroughSidecars(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		port := freePortOn(b, "127.0.0.11")
		versionServer(b, fmt.Sprintf("127.0.0.11:%d", port), "reviews")
		benchGet(b, fmt.Sprintf("http://127.0.0.11:%d/", port), "reviews")
	})
	for _, mode := range []mesh.MTLSMode{mesh.MTLSOff, mesh.MTLSStrict} {
		b.Run("sidecars-mtls-"+string(mode), func(b *testing.B) {
			m := startMeshPair(b, mode)
			benchGet(b, fmt.Sprintf("http://127.0.0.13:%d/", m.port), fmt.Sprintf("reviews:%d", m.port))
		})
	}
}

func benchGet(b *testing.B, url, host string) {
	client := &http.Client{Timeout: 10 * time.Second}
	if _, err := get(b, client, url, host); err != nil { // warm the connections
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := get(b, client, url, host); err != nil {
			b.Fatal(err)
		}
	}
}
