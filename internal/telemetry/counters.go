package telemetry

import (
	"sort"
	"strings"
)

// Stat names embed user-chosen names (cluster names, stat prefixes) that may contain
// dots, e.g. "cluster.outbound|9080||reviews.default.svc.cluster.local.upstream_rq_total",
// so names are matched by known prefix and suffix rather than split on dots.

// byScope sums counters named "<scope>.<name>.<suffix>" per name, skipping names for
// which skip returns true.
func (d Diff) byScope(scope, suffix string, skip func(name string) bool) map[string]uint64 {
	out := map[string]uint64{}
	pre, suf := scope+".", "."+suffix
	for stat, v := range d.Counters {
		if !strings.HasPrefix(stat, pre) || !strings.HasSuffix(stat, suf) || len(stat) <= len(pre)+len(suf) {
			continue
		}
		name := stat[len(pre) : len(stat)-len(suf)]
		if skip != nil && skip(name) {
			continue
		}
		out[name] += v
	}
	return out
}

// Counter returns one counter's change (0 when absent).
func (d Diff) Counter(name string) uint64 { return d.Counters[name] }

// The stat-prefix convention of mesh profiles: every HTTP connection manager's
// stat_prefix starts with "inbound" when it serves traffic arriving at the pod and
// with "outbound" when it serves traffic the pod's workload sends (Istio's own naming).
const (
	InboundPrefix  = "inbound"
	OutboundPrefix = "outbound"
)

// HTTPRequests returns downstream_rq_total per HTTP connection manager stat prefix,
// excluding the admin interface.
func HTTPRequests(d Diff) map[string]uint64 {
	return d.byScope("http", "downstream_rq_total", func(p string) bool { return p == "admin" })
}

// InboundRequests is the number of requests the proxy's inbound HTTP connection
// managers (stat_prefix "inbound...") received.
func InboundRequests(d Diff) uint64 { return sumPrefixed(HTTPRequests(d), InboundPrefix) }

// OutboundRequests is the number of requests the proxy's outbound HTTP connection
// managers (stat_prefix "outbound...") received from the workload.
func OutboundRequests(d Diff) uint64 { return sumPrefixed(HTTPRequests(d), OutboundPrefix) }

func sumPrefixed(m map[string]uint64, prefix string) uint64 {
	var n uint64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// TLS counts TLS handshakes and failures on both sides of a proxy.
type TLS struct {
	// Downstream: handshakes the proxy completed as a server on its listeners.
	Downstream, DownstreamErrors uint64
	// Upstream: handshakes the proxy completed as a client towards its clusters.
	Upstream, UpstreamErrors uint64
	// NoClientCert counts downstream handshakes where the client sent no certificate
	// (with mTLS required these fail; with permissive TLS they are plain TLS).
	NoClientCert uint64
	// VerifyFailures counts certificate verification failures on either side
	// (fail_verify_error, fail_verify_san, fail_verify_no_cert, fail_verify_cert_hash).
	VerifyFailures uint64
}

// TLSHandshakes sums the ssl.* counters of every listener (except admin) and cluster.
func TLSHandshakes(d Diff) TLS {
	var t TLS
	notAdmin := func(n string) bool { return n == "admin" }
	sum := func(scope, suffix string) uint64 {
		var s uint64
		for _, v := range d.byScope(scope, suffix, notAdmin) {
			s += v
		}
		return s
	}
	t.Downstream = sum("listener", "ssl.handshake")
	t.DownstreamErrors = sum("listener", "ssl.connection_error")
	t.NoClientCert = sum("listener", "ssl.no_certificate")
	t.Upstream = sum("cluster", "ssl.handshake")
	t.UpstreamErrors = sum("cluster", "ssl.connection_error")
	for _, f := range []string{"fail_verify_error", "fail_verify_san", "fail_verify_no_cert", "fail_verify_cert_hash"} {
		t.VerifyFailures += sum("listener", "ssl."+f) + sum("cluster", "ssl."+f)
	}
	return t
}

// ClusterStats is one upstream cluster's traffic over the diff.
type ClusterStats struct {
	Name                     string
	Requests                 uint64 // upstream_rq_total
	Rq2xx, Rq4xx, Rq5xx      uint64
	Retries                  uint64 // upstream_rq_retry
	Timeouts                 uint64 // upstream_rq_timeout
	PendingOverflow          uint64 // upstream_rq_pending_overflow (circuit breaker)
	Connections              uint64 // upstream_cx_total
	ConnectFailures          uint64 // upstream_cx_connect_fail
	ConnectTimeouts          uint64 // upstream_cx_connect_timeout
	ResetsBeforeResponse     uint64 // upstream_rq_rx_reset + upstream_rq_tx_reset
	DestroyedWithActiveRq    uint64 // upstream_cx_destroy_with_active_rq
	TLSHandshakes, TLSErrors uint64
}

// Errors is every upstream failure a caller would notice: 5xx, timeouts, overflow,
// connect failures and resets.
func (c ClusterStats) Errors() uint64 {
	return c.Rq5xx + c.Timeouts + c.PendingOverflow + c.ConnectFailures + c.ResetsBeforeResponse
}

// Clusters returns per-cluster upstream statistics, sorted by name.
func Clusters(d Diff) []ClusterStats {
	type field struct {
		suffix string
		set    func(*ClusterStats, uint64)
	}
	fields := []field{
		{"upstream_rq_total", func(c *ClusterStats, v uint64) { c.Requests += v }},
		{"upstream_rq_2xx", func(c *ClusterStats, v uint64) { c.Rq2xx += v }},
		{"upstream_rq_4xx", func(c *ClusterStats, v uint64) { c.Rq4xx += v }},
		{"upstream_rq_5xx", func(c *ClusterStats, v uint64) { c.Rq5xx += v }},
		{"upstream_rq_retry", func(c *ClusterStats, v uint64) { c.Retries += v }},
		{"upstream_rq_timeout", func(c *ClusterStats, v uint64) { c.Timeouts += v }},
		{"upstream_rq_pending_overflow", func(c *ClusterStats, v uint64) { c.PendingOverflow += v }},
		{"upstream_cx_total", func(c *ClusterStats, v uint64) { c.Connections += v }},
		{"upstream_cx_connect_fail", func(c *ClusterStats, v uint64) { c.ConnectFailures += v }},
		{"upstream_cx_connect_timeout", func(c *ClusterStats, v uint64) { c.ConnectTimeouts += v }},
		{"upstream_rq_rx_reset", func(c *ClusterStats, v uint64) { c.ResetsBeforeResponse += v }},
		{"upstream_rq_tx_reset", func(c *ClusterStats, v uint64) { c.ResetsBeforeResponse += v }},
		{"upstream_cx_destroy_with_active_rq", func(c *ClusterStats, v uint64) { c.DestroyedWithActiveRq += v }},
		{"ssl.handshake", func(c *ClusterStats, v uint64) { c.TLSHandshakes += v }},
		{"ssl.connection_error", func(c *ClusterStats, v uint64) { c.TLSErrors += v }},
	}
	byName := map[string]*ClusterStats{}
	for _, f := range fields {
		for name, v := range d.byScope("cluster", f.suffix, nil) {
			c := byName[name]
			if c == nil {
				c = &ClusterStats{Name: name}
				byName[name] = c
			}
			f.set(c, v)
		}
	}
	out := make([]ClusterStats, 0, len(byName))
	for name, c := range byName {
		if isSubScope(name, byName) {
			continue
		}
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Connections returns downstream_cx_total per listener (keyed by the listener's stat
// name: its stat_prefix or "<ip>_<port>"), excluding admin.
func Connections(d Diff) map[string]uint64 {
	return d.byScope("listener", "downstream_cx_total", func(n string) bool {
		return n == "admin" || strings.HasPrefix(n, "admin.") || isPerThread(n)
	})
}

// isPerThread reports whether a listener stat name is one of Envoy's per-thread
// copies ("<listener>.worker_0", "<listener>.main_thread") of the listener's own stat.
func isPerThread(name string) bool {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return false
	}
	last := name[i+1:]
	return last == "main_thread" || strings.HasPrefix(last, "worker_")
}

// isSubScope reports whether name is a sub-scope Envoy adds under a cluster's own stats
// ("X.external", "X.internal", "X.canary", "X.zone.<from>.<to>") rather than a cluster.
func isSubScope(name string, clusters map[string]*ClusterStats) bool {
	for _, sub := range []string{".external", ".internal", ".canary"} {
		if base, ok := strings.CutSuffix(name, sub); ok && clusters[base] != nil {
			return true
		}
	}
	if i := strings.Index(name, ".zone."); i > 0 && clusters[name[:i]] != nil {
		return true
	}
	return false
}
