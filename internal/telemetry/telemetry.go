// Package telemetry owns what meshmark reads from a proxy's own admin interface: it
// snapshots an Envoy admin endpoint (/stats, /clusters, /server_info) before and after
// an experiment and diffs the counters, so the equivalence check and the report can see
// how many requests each proxy carried, its upstream errors and retries, connections
// and TLS handshakes.
package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// Client reads one Envoy admin endpoint.
type Client struct {
	// BaseURL is the admin endpoint, e.g. "http://127.0.0.1:15000".
	BaseURL string
	HTTP    *http.Client
}

// DialFunc opens a connection, e.g. from inside a pod's network namespace
// (substrate.Substrate.DialContext bound to the pod).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// NewClient returns a Client for the admin endpoint at addr ("host:port"). When dial is
// nil the host network namespace is used.
func NewClient(addr string, dial DialFunc) *Client {
	tr := &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 10 * time.Second}
	if dial != nil {
		tr.DialContext = dial
	}
	return &Client{BaseURL: "http://" + addr, HTTP: &http.Client{Transport: tr, Timeout: 20 * time.Second}}
}

// Host is one upstream endpoint of a cluster as /clusters reports it.
type Host struct {
	Address string // "ip:port"
	Healthy bool
	// Health is Envoy's health status (e.g. "HEALTHY", "UNHEALTHY") and any failure flags.
	Health string
}

// Cluster is one upstream cluster as /clusters reports it.
type Cluster struct {
	Name  string
	Hosts []Host
}

// Snapshot is an Envoy's counters and gauges at one instant.
type Snapshot struct {
	Time time.Time
	// Version is Envoy's release, e.g. "1.40.0"; BuildVersion is the full string
	// from /server_info (commit/version/status/build type/TLS library).
	Version      string
	BuildVersion string
	Counters     map[string]uint64
	Gauges       map[string]uint64
	Clusters     []Cluster
}

// Snapshot reads /server_info, the counters and gauges of /stats and /clusters.
func (c *Client) Snapshot(ctx context.Context) (Snapshot, error) {
	s := Snapshot{Time: time.Now()}
	var info struct {
		Version string `json:"version"`
	}
	if err := c.getJSON(ctx, "/server_info", &info); err != nil {
		return s, err
	}
	s.BuildVersion = info.Version
	s.Version = releaseOf(info.Version)
	var err error
	if s.Counters, err = c.stats(ctx, "Counters"); err != nil {
		return s, err
	}
	if s.Gauges, err = c.stats(ctx, "Gauges"); err != nil {
		return s, err
	}
	var clusters struct {
		ClusterStatuses []struct {
			Name         string `json:"name"`
			HostStatuses []struct {
				Address struct {
					SocketAddress struct {
						Address   string `json:"address"`
						PortValue int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
				HealthStatus map[string]any `json:"health_status"`
			} `json:"host_statuses"`
		} `json:"cluster_statuses"`
	}
	if err := c.getJSON(ctx, "/clusters?format=json", &clusters); err != nil {
		return s, err
	}
	for _, cs := range clusters.ClusterStatuses {
		cl := Cluster{Name: cs.Name}
		for _, h := range cs.HostStatuses {
			sa := h.Address.SocketAddress
			host := Host{Address: net.JoinHostPort(sa.Address, fmt.Sprint(sa.PortValue))}
			host.Health, host.Healthy = healthOf(h.HealthStatus)
			cl.Hosts = append(cl.Hosts, host)
		}
		s.Clusters = append(s.Clusters, cl)
	}
	return s, nil
}

// healthOf turns /clusters' health_status object into a short description: the EDS
// status plus every failed_* flag that is set. A host is healthy when its EDS status is
// HEALTHY (or absent) and no failure flag is set.
func healthOf(m map[string]any) (string, bool) {
	eds, _ := m["eds_health_status"].(string)
	healthy := eds == "" || eds == "HEALTHY"
	parts := []string{}
	if eds != "" {
		parts = append(parts, eds)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v, ok := m[k].(bool); ok && v && strings.HasPrefix(k, "failed") {
			parts = append(parts, k)
			healthy = false
		}
	}
	return strings.Join(parts, ","), healthy
}

// releaseOf extracts "1.40.0" from "9e55.../1.40.0/Clean/RELEASE/BoringSSL".
func releaseOf(build string) string {
	parts := strings.Split(build, "/")
	if len(parts) >= 2 {
		return parts[1]
	}
	return build
}

func (c *Client) stats(ctx context.Context, typ string) (map[string]uint64, error) {
	var body struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := c.getJSON(ctx, "/stats?format=json&type="+typ, &body); err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(body.Stats))
	for _, st := range body.Stats {
		if st.Name == "" {
			continue // the histograms entry
		}
		var v uint64
		if len(st.Value) > 0 {
			if err := json.Unmarshal(st.Value, &v); err != nil {
				// Gauges are unsigned in Envoy; anything else is not a counter or gauge.
				continue
			}
		}
		out[st.Name] = v
	}
	return out, nil
}

func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("envoy admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("envoy admin %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("envoy admin %s%s: %s: %.200s", c.BaseURL, path, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("envoy admin %s%s: bad JSON: %w", c.BaseURL, path, err)
	}
	return nil
}

// Diff is what changed between two snapshots of the same Envoy.
type Diff struct {
	From, To time.Time
	Version  string
	// Counters holds after-before for every counter in the after snapshot; a counter
	// that went backwards (the proxy restarted) holds its after value and is listed in
	// Resets.
	Counters map[string]uint64
	Resets   []string
	// Gauges are the after values.
	Gauges map[string]uint64
}

// Compare diffs two snapshots taken before and after an experiment.
func Compare(before, after Snapshot) Diff {
	d := Diff{From: before.Time, To: after.Time, Version: after.Version,
		Counters: make(map[string]uint64, len(after.Counters)), Gauges: after.Gauges}
	for name, a := range after.Counters {
		b := before.Counters[name]
		if a < b {
			d.Counters[name] = a
			d.Resets = append(d.Resets, name)
			continue
		}
		d.Counters[name] = a - b
	}
	sort.Strings(d.Resets)
	return d
}

// ForPod returns a Client for an admin endpoint at addr reached from inside pod, e.g.
// a sidecar's admin on 127.0.0.1:15000 in that pod's network namespace.
func ForPod(sub substrate.Substrate, pod topology.Pod, addr string) *Client {
	return NewClient(addr, func(ctx context.Context, network, a string) (net.Conn, error) {
		return sub.DialContext(ctx, pod, network, a)
	})
}

// SnapshotAll snapshots several proxies (keyed by any name, e.g. pod or pod/component)
// concurrently and returns every snapshot, or the first error.
func SnapshotAll(ctx context.Context, clients map[string]*Client) (map[string]Snapshot, error) {
	type result struct {
		name string
		snap Snapshot
		err  error
	}
	ch := make(chan result, len(clients))
	for name, c := range clients {
		go func() {
			s, err := c.Snapshot(ctx)
			ch <- result{name, s, err}
		}()
	}
	out := make(map[string]Snapshot, len(clients))
	var firstErr error
	for range clients {
		r := <-ch
		if r.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", r.name, r.err)
		}
		out[r.name] = r.snap
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// CompareAll diffs matching snapshots of SnapshotAll taken before and after.
func CompareAll(before, after map[string]Snapshot) map[string]Diff {
	out := make(map[string]Diff, len(after))
	for name, a := range after {
		out[name] = Compare(before[name], a)
	}
	return out
}
