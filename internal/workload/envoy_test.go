package workload

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// findEnvoy looks where the project installs Envoy: $MESHMARK_ENVOY, .tools/bin/envoy at
// the repository root, then PATH.
func findEnvoy() string {
	if p := os.Getenv("MESHMARK_ENVOY"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../.tools/bin/envoy"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("envoy")
	return p
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startEnvoy runs a real Envoy forwarding 127.0.0.1:<returned port> to upstream, the way a
// sidecar sits between two services.
func startEnvoy(t *testing.T, upstream string) string {
	envoy := findEnvoy()
	if envoy == "" {
		t.Skip("no Envoy: set MESHMARK_ENVOY or run meshmark setup")
	}
	host, port, _ := net.SplitHostPort(upstream)
	listen := freePort(t)
	config := fmt.Sprintf(`
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: out
          route_config:
            virtual_hosts:
            - name: b
              domains: ["*"]
              routes: [{match: {prefix: "/"}, route: {cluster: b}}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: b
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: b
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}
`, listen, host, port)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, envoy, "--config-yaml", config, "--disable-hot-restart", "--concurrency", "1", "-l", "warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", listen)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoy did not listen on %s: %s", addr, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestThroughEnvoy checks that traces survive a real proxy between services and that the
// proxy's own error replies (which carry no trace) become 502s naming the proxy's code.
func TestThroughEnvoy(t *testing.T) {
	g := mustParse(t, "name: g\nservices:\n  - name: a\n    script: [call: b]\n  - name: b\n    errorRate: 0%\n")
	bURL := startPods(t, g, []testPod{{"b", "v1"}}, nil)["b"]
	proxy := startEnvoy(t, strings.TrimPrefix(bURL, "http://"))
	urls := startPods(t, g, []testPod{{"a", "v1"}}, map[string]string{"b": proxy})
	for i := 0; i < 20; i++ {
		resp, body, tr := get(t, urls["a"]+"/", nil)
		if resp.StatusCode != 200 || len(tr.Calls) != 1 || tr.Calls[0].Service != "b" || tr.Calls[0].Pod != "b-v1-0" {
			t.Fatalf("status %d through envoy: %s", resp.StatusCode, body)
		}
	}

	// an Envoy whose upstream is gone answers 503 itself
	deadProxy := startEnvoy(t, "127.0.0.1:1")
	urls = startPods(t, g, []testPod{{"a", "v1"}}, map[string]string{"b": deadProxy})
	resp, body, tr := get(t, urls["a"]+"/", nil)
	if resp.StatusCode != 502 || len(tr.Calls) != 1 || tr.Calls[0].Code != 503 || !strings.Contains(tr.Calls[0].Error, "no meshmark trace") {
		t.Errorf("status %d with a dead upstream behind envoy: %s", resp.StatusCode, body)
	}
}
