package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
)

func freePort(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

// startApp serves one service of a one-service graph on loopback.
func startApp(t *testing.T, protocol string) string {
	t.Helper()
	g, err := workload.Parse("g.yaml", []byte("name: g\nservices:\n  - name: web\n    protocol: "+protocol+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := workload.NewServer(g, workload.ServerOptions{Service: "web", Pod: "web-v1-0"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// startGateway runs a real Envoy with the gateway's bootstrap on loopback ports.
func startGateway(t *testing.T, up Upstream) string {
	t.Helper()
	return startGatewayIn(t, "gw-0", up)
}

// startGatewayIn is startGateway naming pod as the gateway's pod.
func startGatewayIn(t *testing.T, pod string, up Upstream) string {
	t.Helper()
	envoy, err := prereq.Envoy()
	if err != nil {
		t.Skipf("no envoy (make test installs it): %v", err)
	}
	at := Listen{Addr: "127.0.0.1", Port: freePort(t), AdminPort: freePort(t)}
	cfg, err := Bootstrap(pod, up, at)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gateway.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(envoy, "-c", path, "--concurrency", "1", "--disable-hot-restart", "--log-level", "warning")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", at.AdminPort))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway envoy not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("127.0.0.1:%d", at.Port)
}

// TestGatewayAddsOneHop: a request through the gateway reaches the entry service (its
// trace is the service's own) and carries the gateway's hop header, for HTTP/1.1 and
// gRPC services alike.
func TestGatewayAddsOneHop(t *testing.T) {
	app := startApp(t, "http")
	gw := startGateway(t, Upstream{Service: "web", Addr: app, Protocol: "http"})
	resp, err := http.Get("http://" + gw + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(HopHeader) != "gw-0" || !strings.HasPrefix(string(body), `{"service":"web","version":"v1","pod":"web-v1-0","code":200`) {
		t.Fatalf("through the gateway: %d, hop %q, body %.120s", resp.StatusCode, resp.Header.Get(HopHeader), body)
	}
	// Straight to the app: no hop header, the same service answers.
	resp, err = http.Get("http://" + app + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get(HopHeader) != "" {
		t.Errorf("direct request carries the hop header")
	}

	gapp := startApp(t, "grpc")
	ggw := startGateway(t, Upstream{Service: "web", Addr: gapp, Protocol: "grpc"})
	cc, err := grpc.NewClient("passthrough:///"+ggw, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var header metadata.MD
	var out []byte
	in := []byte{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = cc.Invoke(ctx, workload.CallMethod, &in, &out, grpc.Header(&header), grpc.ForceCodecV2(rawCodec{}))
	if err != nil || !strings.HasPrefix(string(out), `{"service":"web"`) || strings.Join(header.Get(HopHeader), "") != "gw-0" {
		t.Fatalf("gRPC through the gateway: %v, %q, header %v", err, out, header)
	}
}

// TestGatewayOnAClusterResolvesItsUpstream: as on Kubernetes, the gateway reaches the
// entry service by its DNS name (here localhost, from /etc/hosts, as a Service's name
// is from the cluster's DNS) and names the pod it runs in by its hostname, which is the
// pod's name there.
func TestGatewayOnAClusterResolvesItsUpstream(t *testing.T) {
	app := startApp(t, "http")
	_, port, _ := net.SplitHostPort(app)
	gw := startGatewayIn(t, PodHostname, Upstream{Service: "web", Addr: "localhost:" + port, Protocol: "http"})
	resp, err := http.Get("http://" + gw + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	host, _ := os.Hostname()
	if resp.StatusCode != 200 || resp.Header.Get(HopHeader) != host || !strings.HasPrefix(string(body), `{"service":"web"`) {
		t.Fatalf("through the gateway: %d, hop %q (want %q), body %.120s", resp.StatusCode, resp.Header.Get(HopHeader), host, body)
	}
}

// rawCodec sends and receives *[]byte as they are.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// The Host toward the upstream is the service's name, or the mesh's own name for it
// when the upstream is a mesh proxy that routes by it (traefik-mesh).
func TestGatewayHostRewrite(t *testing.T) {
	for _, c := range []struct {
		up   Upstream
		want string
	}{
		{Upstream{Service: "web", Addr: "198.19.128.1:8080"}, `"hostRewriteLiteral":"web"`},
		{Upstream{Service: "web", Addr: "198.18.1.1:5000", Host: "web.default.traefik.mesh:5000"}, `"hostRewriteLiteral":"web.default.traefik.mesh:5000"`},
	} {
		b, err := Bootstrap("gw-0", c.up, Listen{})
		if err != nil {
			t.Fatal(err)
		}
		// protojson varies its whitespace from build to build on purpose; compare the
		// compacted form.
		var compact bytes.Buffer
		if err := json.Compact(&compact, b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(compact.String(), c.want) {
			t.Errorf("%+v: bootstrap lacks %s", c.up, c.want)
		}
	}
}
