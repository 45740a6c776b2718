// Package plaintextprobe owns what a plaintext probe pod runs on a cluster under strict
// mTLS (`meshmark-pod plaintext-probe`): one plaintext request to each service of the
// app, as a caller outside the mesh, and the report of how each ended as the pod's
// termination message. Package kube creates the pods and reads their reports; this
// package links nothing of Kubernetes, so that the small in-pod binary can run it.
package plaintextprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
)

const (
	// Command is the subcommand a probe pod runs.
	Command = "plaintext-probe"
	// MessagePath is where a probe pod's container writes its report: the kubelet
	// copies it into the pod's status when the container ends.
	MessagePath = "/dev/termination-log"
	// MessageLimit is the most of a container's termination message the kubelet keeps.
	MessageLimit = 4096
	// requestsAtOnce bounds the requests one probe pod has in flight.
	requestsAtOnce = 8
	// ControlPatience is how long a probe pod calls the positive control again while
	// it refuses; controlRetry is the pause between two calls.
	ControlPatience = 15 * time.Second
	controlRetry    = 250 * time.Millisecond
)

// FormatTarget is a target as `plaintext-probe --target` takes it:
// SERVICE=HOST:PORT/PROTOCOL.
func FormatTarget(t meshprobe.PlaintextTarget) string {
	return t.Service + "=" + t.Addr + "/" + t.Protocol
}

// ParseTarget reads a target written by FormatTarget; the protocol may be left out
// (http).
func ParseTarget(s string) (meshprobe.PlaintextTarget, error) {
	service, rest, ok := strings.Cut(s, "=")
	if !ok || service == "" {
		return meshprobe.PlaintextTarget{}, fmt.Errorf("target %q: want SERVICE=HOST:PORT[/PROTOCOL]", s)
	}
	t := meshprobe.PlaintextTarget{Service: service, Addr: rest, Protocol: "http"}
	if i := strings.LastIndex(rest, "/"); i >= 0 {
		t.Addr, t.Protocol = rest[:i], rest[i+1:]
	}
	switch t.Protocol {
	case "http", "h2c", "grpc":
	default:
		return meshprobe.PlaintextTarget{}, fmt.Errorf("target %q: protocol %q, want http, h2c or grpc", s, t.Protocol)
	}
	if _, _, err := net.SplitHostPort(t.Addr); err != nil {
		return meshprobe.PlaintextTarget{}, fmt.Errorf("target %q: %w", s, err)
	}
	return t, nil
}

// Run is what a probe pod does: one plaintext request to each target
// (meshprobe.ProbePlaintext), a few at a time, through dial, and the report of how each
// ended, which fits MessageLimit. With a positive control (a service outside the mesh
// that must answer), the control is called first, again while it refuses, for up to
// ControlPatience, and reported last: a new Service is refused by kube-proxy until it
// has programmed its endpoints, a moment after they are ready, and only a pod that
// reached the control has shown that its refusals are the mesh's.
func Run(ctx context.Context, targets []meshprobe.PlaintextTarget, control *meshprobe.PlaintextTarget, dial meshprobe.DialFunc) []byte {
	var ctl meshprobe.PlaintextProbe
	if control != nil {
		deadline := time.Now().Add(ControlPatience)
		for {
			ctl = meshprobe.ProbePlaintext(ctx, dial, *control)
			if !ctl.Refused || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(controlRetry):
			}
		}
	}
	probes := make([]meshprobe.PlaintextProbe, len(targets))
	var wg sync.WaitGroup
	sem := make(chan struct{}, requestsAtOnce)
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			probes[i] = meshprobe.ProbePlaintext(ctx, dial, t)
		}()
	}
	wg.Wait()
	if control != nil {
		probes = append(probes, ctl)
	}
	return Report(probes)
}

// Report encodes probes as a JSON array within MessageLimit, shortening what each
// observed as far as needed. The targets are left out: the runner knows what it asked
// for.
func Report(probes []meshprobe.PlaintextProbe) []byte {
	for limit := 240; ; limit /= 2 {
		short := make([]meshprobe.PlaintextProbe, len(probes))
		for i, p := range probes {
			short[i] = meshprobe.PlaintextProbe{Service: p.Service, Refused: p.Refused, Observed: truncate(p.Observed, limit)}
		}
		out, _ := json.Marshal(short)
		if len(out) <= MessageLimit || limit == 0 {
			return out
		}
	}
}

// truncate cuts s to at most n bytes on a character boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
