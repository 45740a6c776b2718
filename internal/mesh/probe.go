package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// ProbeResult is one probe request's outcome.
type ProbeResult struct {
	Status int
	Body   string // first 4 KiB
	// ProxyGenerated is set when the response came from a proxy that could not reach
	// the workload (Envoy's "upstream connect error", "no healthy upstream"): the pod
	// did not answer even though a status came back.
	ProxyGenerated bool
}

// ProbeTimeout bounds one probe request; generous because the machine is shared.
const ProbeTimeout = 5 * time.Second

// ProbeHTTP sends one HTTP/1.1 GET from inside pod `from` to addr (ip:port) with the
// given Host header, on a fresh connection.
func ProbeHTTP(ctx context.Context, sub substrate.Substrate, from topology.Pod, addr, host, path string) (ProbeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return sub.DialContext(ctx, from, network, a)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return ProbeResult{}, err
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("probe %s -> %s (Host %s): %w", from.Name, addr, host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r := ProbeResult{Status: resp.StatusCode, Body: string(body)}
	r.ProxyGenerated = resp.StatusCode >= 500 && ProxyGeneratedBody(r.Body)
	return r, nil
}

// ProxyGeneratedBody recognises the bodies Envoy writes when it could not reach the
// upstream at all.
func ProxyGeneratedBody(body string) bool {
	for _, marker := range []string{"upstream connect error", "no healthy upstream", "upstream request timeout"} {
		if strings.Contains(body, marker) {
			return true
		}
	}
	return false
}

// Prober picks the pod probes are sent from: the first client, else the first pod.
func Prober(app *topology.App) (topology.Pod, bool) {
	if len(app.Clients) > 0 {
		return app.Clients[0], true
	}
	pods := app.Pods()
	if len(pods) == 0 {
		return topology.Pod{}, false
	}
	return pods[0], true
}

// Addr is ip:port.
func Addr(ip fmt.Stringer, port int) string {
	return net.JoinHostPort(ip.String(), fmt.Sprint(port))
}
