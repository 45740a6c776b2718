// Package meshprobe sends the single requests meshmark judges a mesh by (is a pod
// served, does a caller without a mesh identity get refused) and says how each ended.
// It depends on the standard library alone, so that the in-pod binary's plaintext
// probe (cmd/meshmark-pod) links none of the mesh registry or its images.
package meshprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ProbeResult is one probe request's outcome.
type ProbeResult struct {
	Status int
	Body   string // first 4 KiB
	// ProxyGenerated is set when the response came from a proxy that could not reach
	// the workload (Envoy's "upstream connect error", "no healthy upstream", or
	// linkerd2-proxy's own error, which it names in its l5d-proxy-error header): the pod
	// did not answer even though a status came back.
	ProxyGenerated bool
}

// ProbeTimeout bounds one probe request; generous because the machine is shared.
const ProbeTimeout = 5 * time.Second

// DialFunc opens a connection as net.Dialer's DialContext does: from inside a pod of
// the local testbed (substrate.Substrate's DialContext), or from wherever the process
// runs (a probe pod on a cluster).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ProbeRequest is one probe request: a GET of Path on a fresh connection to Addr
// (host:port), with Host as its Host header (empty: Addr's).
type ProbeRequest struct {
	Addr, Host, Path string
	// H2C sends the request as cleartext HTTP/2 with prior knowledge, as gRPC and h2c
	// clients do, instead of HTTP/1.1.
	H2C bool
}

// ProbeHTTPWith sends one GET on a fresh connection from the caller's dialer, within
// ProbeTimeout.
func ProbeHTTPWith(ctx context.Context, dial DialFunc, pr ProbeRequest) (ProbeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
	if pr.H2C {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+pr.Addr+pr.Path, nil)
	if err != nil {
		return ProbeResult{}, err
	}
	if pr.Host != "" {
		req.Host = pr.Host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return ProbeResult{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r := ProbeResult{Status: resp.StatusCode, Body: string(body)}
	r.ProxyGenerated = resp.StatusCode >= 500 && (ProxyGeneratedBody(r.Body) || resp.Header.Get(linkerdProxyError) != "")
	return r, nil
}

// linkerdProxyError is the header linkerd2-proxy puts on the responses it makes itself.
const linkerdProxyError = "l5d-proxy-error"

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

// tlsOnlyAnswer is what Go's HTTPS servers (and proxies built on them) answer a
// plaintext request with, instead of a TLS alert: the request was not served.
const tlsOnlyAnswer = "Client sent an HTTP request to an HTTPS server"

// Refusal says how a call without the right identity ended, in a user's words, and
// whether it was kept from the application: a connection error (reset, closed, a TLS
// listener's alert), a proxy's own error page, a 401/403 (a mesh's policy, such as
// Linkerd's answer to a caller its default policy does not admit), or a server that
// speaks TLS only. Any other answer came from the application: served.
func Refusal(res ProbeResult, err error) (observed string, refused bool) {
	switch {
	case err != nil:
		return "refused: " + connWords(err), true
	case res.Status == 401 || res.Status == 403:
		return fmt.Sprintf("denied: HTTP %d %.80q", res.Status, res.Body), true
	case res.ProxyGenerated:
		return fmt.Sprintf("stopped by the proxy: HTTP %d %.80q", res.Status, res.Body), true
	case res.Status == http.StatusBadRequest && strings.Contains(res.Body, tlsOnlyAnswer):
		return fmt.Sprintf("refused: the server speaks TLS only (HTTP %d %.80q)", res.Status, res.Body), true
	}
	return fmt.Sprintf("served: HTTP %d", res.Status), false
}

// connWords names how a connection failed in the words a user would look for.
func connWords(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed without an answer"
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "no answer in time"
	}
	return err.Error()
}

// PlaintextTarget is a meshed service for a caller with no mesh identity to call in
// plaintext: the service, the address a caller dials (host:port, such as the service's
// cluster name and port) and the protocol it speaks ("http", "h2c" or "grpc"), which
// the request speaks too, so that a proxy that merely cannot parse a request of
// another protocol is not taken for one that refuses plaintext.
type PlaintextTarget struct {
	Service, Addr, Protocol string
}

// PlaintextProbe is how one plaintext request from outside the mesh to a meshed
// service ended.
type PlaintextProbe struct {
	Service string `json:"service"`
	// Target is what was called: the service's address and protocol.
	Target  string `json:"target,omitempty"`
	Refused bool   `json:"refused"`
	// Observed is what came back, in Refusal's words; for a request that was served,
	// with the start of the answer, which names the pod that gave it.
	Observed string `json:"observed"`
}

// TallyOutcomes counts the ways the probes ended, most common first: "4× refused:
// connection reset, 1× served: HTTP 200".
func TallyOutcomes(probes []PlaintextProbe) string {
	count := map[string]int{}
	for _, p := range probes {
		count[p.Observed]++
	}
	ways := slices.Collect(maps.Keys(count))
	slices.SortFunc(ways, func(a, b string) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, w := range ways {
		out = append(out, fmt.Sprintf("%d× %s", count[w], w))
	}
	return strings.Join(out, ", ")
}

// DescribeProof says in one line how plaintext requests from outside a mesh ended and
// whether their positive controls were answered, as the progress and the report show
// it on either platform.
func DescribeProof(probes, controls []PlaintextProbe) string {
	refused, answered := 0, 0
	for _, p := range probes {
		if p.Refused {
			refused++
		}
	}
	for _, c := range controls {
		if !c.Refused {
			answered++
		}
	}
	return fmt.Sprintf("plaintext from outside the mesh refused %d of %d times (%s); positive controls answered %d of %d (%s)",
		refused, len(probes), TallyOutcomes(probes), answered, len(controls), TallyOutcomes(controls))
}

// ProbePlaintext sends one plaintext GET / to the target in its protocol, as a caller
// with no mesh identity would, and judges the outcome with Refusal. The path is the
// workload's own, which runs its script: a kubelet probe path (the workload's health
// check) would not do, since Linkerd admits unauthenticated callers to a pod's probe
// paths by default.
func ProbePlaintext(ctx context.Context, dial DialFunc, t PlaintextTarget) PlaintextProbe {
	res, err := ProbeHTTPWith(ctx, dial, ProbeRequest{Addr: t.Addr, Path: "/", H2C: t.Protocol == "h2c" || t.Protocol == "grpc"})
	observed, refused := Refusal(res, err)
	if !refused {
		observed += fmt.Sprintf(" %.100q", res.Body)
	}
	return PlaintextProbe{Service: t.Service, Target: fmt.Sprintf("%s (%s)", t.Addr, t.Protocol), Refused: refused, Observed: observed}
}
