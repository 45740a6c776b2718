package envoysidecar

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// Stats are Envoy admin counters and gauges by name.
type Stats map[string]uint64

// ParseStats reads the text format of Envoy's /stats endpoint ("name: value" per
// line). Histogram lines ("name: P0(...) ...") are skipped; anything else malformed is
// an error naming the line.
func ParseStats(text string) (Stats, error) {
	out := Stats{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			continue
		}
		i := strings.LastIndex(l, ": ")
		if i <= 0 {
			return nil, fmt.Errorf("envoy stats line %d: no \"name: value\" in %q", line, truncate(l))
		}
		name, val := l[:i], l[i+2:]
		if strings.HasPrefix(val, "P0(") || strings.HasPrefix(val, "No recorded values") || strings.HasPrefix(val, `"`) {
			continue // histogram summary or text readout
		}
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("envoy stats line %d: value of %s: %q is not a counter", line, name, truncate(val))
		}
		out[name] = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("envoy stats line %d: %w", line+1, err)
	}
	return out, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Sum adds every stat whose name has the prefix and the suffix.
func (s Stats) Sum(prefix, suffix string) uint64 {
	var n uint64
	for k, v := range s {
		if strings.HasPrefix(k, prefix) && strings.HasSuffix(k, suffix) {
			n += v
		}
	}
	return n
}

// Traffic is what the enrollment check reads from one sidecar.
type Traffic struct {
	InboundMTLS, InboundPlaintext, Outbound uint64
	// Answered counts inbound requests the local app completed.
	Answered uint64
	// Retries counts outbound requests the sidecar had to retry.
	Retries uint64
}

// TrafficOf extracts the enrollment counters; the names come from the stat prefixes
// the generator gives the connection managers and clusters.
func TrafficOf(s Stats) Traffic {
	return Traffic{
		InboundMTLS:      s.Sum("http.inbound_", "_mtls.downstream_rq_total"),
		InboundPlaintext: s.Sum("http.inbound_", "_plaintext.downstream_rq_total"),
		Outbound:         s.Sum("http.outbound_", ".downstream_rq_total"),
		// Only the cluster-wide counter: dynamic stats add per-code copies
		// (cluster.inbound|P||.external.upstream_rq_completed).
		Answered: s.Sum("cluster.inbound|", "||.upstream_rq_completed"),
		Retries:  s.Sum("cluster.outbound|", ".upstream_rq_retry"),
	}
}

// Sub is t minus an earlier reading.
func (t Traffic) Sub(before Traffic) Traffic {
	d := func(a, b uint64) uint64 {
		if a < b { // the proxy restarted; the later reading is all we know
			return a
		}
		return a - b
	}
	return Traffic{
		InboundMTLS:      d(t.InboundMTLS, before.InboundMTLS),
		InboundPlaintext: d(t.InboundPlaintext, before.InboundPlaintext),
		Outbound:         d(t.Outbound, before.Outbound),
		Answered:         d(t.Answered, before.Answered),
		Retries:          d(t.Retries, before.Retries),
	}
}
