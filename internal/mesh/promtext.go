package mesh

import (
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ReadPrometheusText parses what a proxy serves in Prometheus text format into the
// Counters and Gauges of ProxyCounters: every series above zero, keyed by SeriesKey,
// untyped samples counted as counters (proxies that write OpenMetrics-style TYPE lines
// leave their samples untyped for this parser). Histograms and summaries are left out:
// latency is measured by the load generator. each, when not nil, sees every sample kept
// or not, for what the caller reads from particular series (inbound counts, version).
func ReadPrometheusText(body io.Reader, each func(name string, labels map[string]string, v float64)) (meshkube.ProxyCounters, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return meshkube.ProxyCounters{}, err
	}
	pc := meshkube.ProxyCounters{Counters: map[string]uint64{}, Gauges: map[string]uint64{}}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			var v float64
			into := pc.Counters
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v, into = m.GetGauge().GetValue(), pc.Gauges
			case dto.MetricType_UNTYPED:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			if each != nil {
				each(name, labels, v)
			}
			if v > 0 {
				into[SeriesKey(name, labels)] += uint64(v)
			}
		}
	}
	return pc, nil
}
