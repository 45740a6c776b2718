package mesh

import (
	"fmt"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"strings"
	"time"
)

// Enrollment is the equivalence evidence stored with every result: which pods a mesh
// really carries, what traffic its proxies saw during the probe, and whether mTLS holds.
type Enrollment struct {
	Mesh string   `json:"mesh"`
	MTLS MTLSMode `json:"mtls"` // as configured
	// Pass is true when every expectation held; Failures says why not.
	Pass      bool            `json:"pass"`
	Failures  []string        `json:"failures,omitempty"`
	Pods      []PodEnrollment `json:"pods"`
	CheckedAt time.Time       `json:"checked_at"`
	// PlaintextRefused is set under strict mTLS: whether a plaintext request from
	// outside the mesh to every service pod was refused.
	PlaintextRefused *bool `json:"plaintext_refused,omitempty"`
	// Plaintext is, where the mesh promises to refuse plaintext, how each plaintext
	// request from outside the mesh ended: on Kubernetes one per meshed service (from a
	// probe pod outside the mesh, to the service's cluster name), on the local testbed
	// one per service pod (from a pod outside the mesh, to the pod's address).
	Plaintext []meshprobe.PlaintextProbe `json:"plaintext,omitempty"`
	// PlaintextControl is how the positive controls of those requests ended: requests
	// from the same caller that must be answered for its refusals to count, since a
	// caller that reaches nothing sees every service "refuse". On Kubernetes the same
	// plaintext request to a service outside the mesh; on the local testbed a request
	// the pod's own proxy must answer (with a mesh certificate to a sidecar; for
	// ambient, TLS to HBONE's port, where ztunnel presents the pod's certificate).
	PlaintextControl []meshprobe.PlaintextProbe `json:"plaintext_control,omitempty"`
	// Traffic is, on Kubernetes, the short burst of load sent through the mesh before
	// the first measurement and what every proxy counted of it: the proof that each
	// pod's proxy carried traffic, which the local checks' probes give. Each pod's row
	// has what its own proxy counted.
	Traffic *TrafficProof `json:"traffic,omitempty"`
}

// TrafficProof is a burst of requests from the load generators to the entry service,
// through the mesh, and what the mesh's proxies counted of it. It is not a trial: it
// only proves that the proxies are on the app's path.
type TrafficProof struct {
	// Rate is the burst's requests per second and Seconds its length; both are zero
	// when no burst was sent (Notes say why).
	Rate    float64 `json:"rate,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	// Sent and Succeeded (2xx) count the burst's requests; Errors are its failed ones
	// by kind (refused, reset, timeout, non2xx, other).
	Sent      int64            `json:"sent"`
	Succeeded int64            `json:"succeeded"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	// Held is how many proxies were held to the burst; Proven says that every one of
	// them counted its share and the burst was answered.
	Held   int  `json:"held"`
	Proven bool `json:"proven"`
	// Proxies is what each proxy counted into each service over the burst.
	Proxies []ProxyTraffic `json:"proxies,omitempty"`
	// Notes say what was not held to the burst, and why.
	Notes []string `json:"notes,omitempty"`
}

// ProxyTraffic is what one proxy counted over a TrafficProof's burst.
type ProxyTraffic struct {
	Component string `json:"component"`
	// Pod is the proxy's pod, or its node for a node proxy.
	Pod     string            `json:"pod"`
	Unit    string            `json:"unit,omitempty"`
	Inbound map[string]uint64 `json:"inbound,omitempty"`
	Err     string            `json:"error,omitempty"`
}

// PodEnrollment is what the check found for one pod.
type PodEnrollment struct {
	Pod     string `json:"pod"`
	Service string `json:"service,omitempty"` // empty for clients
	// Meshed says whether the profile enrolls this pod at all.
	Meshed bool `json:"meshed"`
	// Sidecar says whether a proxy answered on the pod's admin endpoint.
	Sidecar bool `json:"sidecar"`
	// Answered says whether the pod served a probe request.
	Answered bool `json:"answered"`
	// Request counts from the proxy's own stats after the probe.
	InboundRequests  uint64 `json:"inbound_requests"`
	InboundMTLS      uint64 `json:"inbound_mtls_requests"`
	InboundPlaintext uint64 `json:"inbound_plaintext_requests"`
	OutboundRequests uint64 `json:"outbound_requests"`
	// OutsidePlaintext is how many of InboundPlaintext were the check's own requests
	// from outside the mesh to a pod that accepts plaintext (permissive mTLS).
	OutsidePlaintext uint64 `json:"outside_plaintext_requests,omitempty"`
	// MTLSObserved is "mtls", "plaintext", "mixed" (both seen inbound) or "none"
	// (no inbound traffic seen), of the mesh's own traffic: OutsidePlaintext is left
	// out.
	MTLSObserved string   `json:"mtls_observed"`
	Notes        []string `json:"notes,omitempty"`
}

// ObserveInbound records what a pod's proxy counted inbound while the check probed it,
// of which outside were the check's own plaintext requests from outside the mesh to a
// pod that accepts plaintext. Those say only that permissive mode accepts plaintext,
// which it promises, so MTLSObserved leaves them out and tells what the requests from
// the mesh's own pods used; a note says how many there were. Where the pod must refuse
// plaintext, pass outside 0: a plaintext request it served is then seen as such.
func (r *PodEnrollment) ObserveInbound(mtls, plaintext, outside uint64) {
	outside = min(outside, plaintext)
	r.InboundMTLS, r.InboundPlaintext, r.InboundRequests = mtls, plaintext, mtls+plaintext
	r.OutsidePlaintext = outside
	r.MTLSObserved = ObservedMode(mtls, plaintext-outside)
	if outside > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d plaintext %s from outside the mesh (the check's own) accepted, as permissive mTLS allows; "+
			"left out of what the mesh's traffic used", outside, map[bool]string{true: "request", false: "requests"}[outside == 1]))
	}
}

// Fail records a failure and clears Pass.
func (e *Enrollment) Fail(format string, args ...any) {
	e.Pass = false
	e.Failures = append(e.Failures, fmt.Sprintf(format, args...))
}

// JudgePlaintext records the plaintext requests from outside the mesh to a mesh that
// promises to refuse them, with their positive controls, and judges them alike on every
// platform: each request that was served fails the check, naming the service and what
// it answered; refusal counts as proven only when at least one request was made and
// every control was answered, and a control that was not fails the check as unproven.
func (e *Enrollment) JudgePlaintext(probes, controls []meshprobe.PlaintextProbe) {
	e.Plaintext = append(e.Plaintext, probes...)
	e.PlaintextControl = append(e.PlaintextControl, controls...)
	refused := len(probes) > 0
	for _, p := range probes {
		if !p.Refused {
			refused = false
			e.Fail("service %s served a plaintext request from outside the mesh (%s): %s", p.Service, p.Target, p.Observed)
		}
	}
	for _, c := range controls {
		if c.Refused {
			refused = false
			e.Fail("refusal of plaintext unproven: the positive control %s (%s) was not answered: %s", c.Service, c.Target, c.Observed)
		}
	}
	switch {
	case len(probes) == 0:
		e.Fail("refusal of plaintext unproven: no service was called in plaintext")
	case len(controls) == 0:
		refused = false
		e.Fail("refusal of plaintext unproven: no positive control was answered")
	}
	e.PlaintextRefused = &refused
}

// Summary is one line for terminals and logs.
func (e Enrollment) Summary() string {
	meshed := 0
	for _, p := range e.Pods {
		if p.Meshed {
			meshed++
		}
	}
	verdict := "PASS"
	if !e.Pass {
		verdict = "FAIL: " + strings.Join(e.Failures, "; ")
	}
	return fmt.Sprintf("%s (mtls %s): %d/%d pods meshed, %s", e.Mesh, orDash(string(e.MTLS)), meshed, len(e.Pods), verdict)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ObservedMode classifies inbound counts.
func ObservedMode(mtls, plaintext uint64) string {
	switch {
	case mtls > 0 && plaintext > 0:
		return "mixed"
	case mtls > 0:
		return "mtls"
	case plaintext > 0:
		return "plaintext"
	}
	return "none"
}
