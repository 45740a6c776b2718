package mesh

import (
	"context"
	"fmt"
	"net"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// ProbeHTTP sends one HTTP/1.1 GET from inside pod `from` to addr (ip:port) with the
// given Host header, on a fresh connection.
func ProbeHTTP(ctx context.Context, sub substrate.Substrate, from topology.Pod, addr, host, path string) (meshprobe.ProbeResult, error) {
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return sub.DialContext(ctx, from, network, a)
	}
	r, err := meshprobe.ProbeHTTPWith(ctx, dial, meshprobe.ProbeRequest{Addr: addr, Host: host, Path: path})
	if err != nil {
		return meshprobe.ProbeResult{}, fmt.Errorf("probe %s -> %s (Host %s): %w", from.Name, addr, host, err)
	}
	return r, nil
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
