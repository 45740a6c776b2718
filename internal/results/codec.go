package results

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// EncodeHistogram returns h in the HdrHistogram V2 compressed encoding, base64 text,
// which every HdrHistogram implementation can read. A nil histogram encodes as "".
func EncodeHistogram(h *hdrhistogram.Histogram) (string, error) {
	if h == nil {
		return "", nil
	}
	b, err := h.Encode(histogramEncodingTag)
	if err != nil {
		return "", fmt.Errorf("encode histogram: %w", err)
	}
	return string(b), nil
}

// DecodeHistogram reverses EncodeHistogram; "" decodes to nil.
func DecodeHistogram(s string) (*hdrhistogram.Histogram, error) {
	if s == "" {
		return nil, nil
	}
	h, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("decode histogram: %w", err)
	}
	return h, nil
}

// NewGeneratedConfig records a generated configuration file with its SHA-256.
func NewGeneratedConfig(name, mesh, component string, content []byte) GeneratedConfig {
	return GeneratedConfig{Name: name, Mesh: mesh, Component: component, Content: content, SHA256: SHA256Hex(content)}
}

// SHA256Hex is the lower-case hex SHA-256 of b.
func SHA256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Throughput is successful requests per second completed inside the measured window
// (or, for trials stored before that was counted, of those intended in it).
func (t *Trial) Throughput() float64 {
	d := t.Duration().Seconds()
	if d <= 0 {
		return 0
	}
	return float64(t.Result.Served()) / d
}

// Served is the successful requests the target served inside the measured window:
// Window.Succeeded, or Requests less Errors for trials stored before it was counted.
func (r *TrialResult) Served() int64 {
	if r.Window != nil {
		return r.Window.Succeeded
	}
	return r.Requests - r.Errors
}

// ErrorRate is the fraction of requests that failed, 0 when there were none.
func (r *TrialResult) ErrorRate() float64 {
	if r.Requests <= 0 {
		return 0
	}
	return float64(r.Errors) / float64(r.Requests)
}

// HasFlag reports whether the trial result carries flag f.
func (r *TrialResult) HasFlag(f string) bool {
	for _, x := range r.Flags {
		if x == f {
			return true
		}
	}
	return false
}

// JSON forms carry histograms inline as V2 base64 so that an export is lossless.

type trialResultJSON TrialResult

// MarshalJSON writes the result with its histograms as V2 base64 strings.
func (r TrialResult) MarshalJSON() ([]byte, error) {
	lat, err := EncodeHistogram(r.Latency)
	if err != nil {
		return nil, err
	}
	svc, err := EncodeHistogram(r.ServiceTime)
	if err != nil {
		return nil, err
	}
	ans, err := EncodeHistogram(r.AnsweredLatency)
	if err != nil {
		return nil, err
	}
	fail, err := EncodeHistogram(r.FailedLatency)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		trialResultJSON
		Latency         string `json:"latency_hdr,omitempty"`
		ServiceTime     string `json:"service_time_hdr,omitempty"`
		AnsweredLatency string `json:"answered_latency_hdr,omitempty"`
		FailedLatency   string `json:"failed_latency_hdr,omitempty"`
	}{trialResultJSON(r), lat, svc, ans, fail})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (r *TrialResult) UnmarshalJSON(b []byte) error {
	var v struct {
		trialResultJSON
		Latency         string `json:"latency_hdr"`
		ServiceTime     string `json:"service_time_hdr"`
		AnsweredLatency string `json:"answered_latency_hdr"`
		FailedLatency   string `json:"failed_latency_hdr"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = TrialResult(v.trialResultJSON)
	var err error
	if r.Latency, err = DecodeHistogram(v.Latency); err != nil {
		return fmt.Errorf("latency_hdr: %w", err)
	}
	if r.ServiceTime, err = DecodeHistogram(v.ServiceTime); err != nil {
		return fmt.Errorf("service_time_hdr: %w", err)
	}
	if r.AnsweredLatency, err = DecodeHistogram(v.AnsweredLatency); err != nil {
		return fmt.Errorf("answered_latency_hdr: %w", err)
	}
	if r.FailedLatency, err = DecodeHistogram(v.FailedLatency); err != nil {
		return fmt.Errorf("failed_latency_hdr: %w", err)
	}
	r.CompleteOld()
	return nil
}

// CompleteOld completes a result read back from a run stored before failures were
// timed: its latency histogram held the answered requests only, so that is its
// AnsweredLatency, and its FailedLatency stays nil (not recorded).
func (r *TrialResult) CompleteOld() {
	if r.AnsweredLatency == nil && r.FailedLatency == nil {
		r.AnsweredLatency = r.Latency
	}
}

type intervalJSON Interval

// MarshalJSON writes the interval with its histogram as V2 base64.
func (iv Interval) MarshalJSON() ([]byte, error) {
	h, err := EncodeHistogram(iv.Histogram)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		intervalJSON
		Histogram string `json:"hdr,omitempty"`
	}{intervalJSON(iv), h})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (iv *Interval) UnmarshalJSON(b []byte) error {
	var v struct {
		intervalJSON
		Histogram string `json:"hdr"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*iv = Interval(v.intervalJSON)
	var err error
	if iv.Histogram, err = DecodeHistogram(v.Histogram); err != nil {
		return fmt.Errorf("interval hdr: %w", err)
	}
	return nil
}

type generatorJSON GeneratorHealth

// MarshalJSON writes the generator health with its send-lag histogram as V2 base64.
func (g GeneratorHealth) MarshalJSON() ([]byte, error) {
	h, err := EncodeHistogram(g.SendLag)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		generatorJSON
		SendLag string `json:"send_lag_hdr,omitempty"`
	}{generatorJSON(g), h})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (g *GeneratorHealth) UnmarshalJSON(b []byte) error {
	var v struct {
		generatorJSON
		SendLag string `json:"send_lag_hdr"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*g = GeneratorHealth(v.generatorJSON)
	var err error
	if g.SendLag, err = DecodeHistogram(v.SendLag); err != nil {
		return fmt.Errorf("send_lag_hdr: %w", err)
	}
	return nil
}
