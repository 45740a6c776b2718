package workload

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const mixedGraph = `
name: mixed
services:
  - name: web
    isEntrypoint: true
    script:
      - - call: emoji
        - call: voting
  - name: emoji
    protocol: grpc
    responseSize: 2KiB
    script: [call: ratings]
  - name: voting
    protocol: h2c
  - name: ratings
    protocol: grpc
`

// protocolSpy wraps a service's handler and records which protocol its requests came in.
type protocolSpy struct {
	h1, h2, grpc atomic.Int64
	next         http.Handler
}

func (p *protocolSpy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"):
		p.grpc.Add(1)
	case r.ProtoMajor == 2:
		p.h2.Add(1)
	default:
		p.h1.Add(1)
	}
	p.next.ServeHTTP(w, r)
}

// TestProtocolPerService: each callee is called in its own protocol, and the trace of the
// whole graph comes back through gRPC and HTTP/2 alike.
func TestProtocolPerService(t *testing.T) {
	g := mustParse(t, mixedGraph)
	if g.Service("voting").Protocol != ProtocolHTTP2 || g.Service("emoji").Protocol != ProtocolGRPC || g.Service("web").Protocol != ProtocolHTTP {
		t.Fatalf("protocols parsed: web %s, emoji %s, voting %s", g.Service("web").Protocol, g.Service("emoji").Protocol, g.Service("voting").Protocol)
	}
	spies := map[string]*protocolSpy{}
	urls := startPodsWrapped(t, g, []testPod{{"web", "v1"}, {"emoji", "v1"}, {"voting", "v1"}, {"ratings", "v1"}}, func(svc string, h http.Handler) http.Handler {
		spies[svc] = &protocolSpy{next: h}
		return spies[svc]
	})
	for i := 0; i < 5; i++ {
		resp, body, tr := get(t, urls["web"]+"/", http.Header{"X-Request-Id": {"abc"}})
		if resp.StatusCode != 200 || tr.Code != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if len(tr.Calls) != 2 || tr.Calls[0].Service != "emoji" || tr.Calls[1].Service != "voting" {
			t.Fatalf("web calls %+v", tr.Calls)
		}
		em := tr.Calls[0]
		if em.Code != 200 || len(em.Calls) != 1 || em.Calls[0].Service != "ratings" || em.Calls[0].Code != 200 || em.Pad != "" {
			t.Fatalf("emoji node through gRPC: %+v", em)
		}
	}
	for svc, want := range map[string]string{"emoji": "grpc", "ratings": "grpc", "voting": "h2"} {
		s := spies[svc]
		got := map[string]int64{"h1": s.h1.Load(), "h2": s.h2.Load(), "grpc": s.grpc.Load()}
		if got[want] != 5 || got["h1"]+got["h2"]+got["grpc"] != 5 {
			t.Errorf("%s received %v, want all 5 as %s", svc, got, want)
		}
	}
}

// TestGRPCServiceAnswersCallsHealthAndHTTP: a gRPC service answers any unary method with
// its trace, the standard health check, and plain HTTP on the same port.
func TestGRPCServiceAnswersCallsHealthAndHTTP(t *testing.T) {
	g := mustParse(t, mixedGraph)
	urls := startPods(t, g, []testPod{{"ratings", "v1"}}, nil)
	addr := strings.TrimPrefix(urls["ratings"], "http://")
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(passCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
	for _, method := range []string{CallMethod, "/emojivoto.v1.EmojiService/ListAll"} {
		var resp []byte
		var header metadata.MD
		req := []byte("anything")
		if err := cc.Invoke(ctx, method, &req, &resp, grpc.Header(&header)); err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if !strings.HasPrefix(string(resp), `{"service":"ratings"`) || len(header.Get(grpcTraceBytesKey)) != 1 {
			t.Errorf("%s answered %q with header %v", method, resp, header)
		}
	}
	resp, body, tr := get(t, urls["ratings"]+"/", nil)
	if resp.StatusCode != 200 || tr.Service != "ratings" {
		t.Errorf("plain HTTP to a gRPC service: %d %s", resp.StatusCode, body)
	}
}

// TestGRPCFailureCarriesTrace: a failing gRPC callee answers a non-OK status with its
// trace in the trailer, and its caller reports the failure with that trace.
func TestGRPCFailureCarriesTrace(t *testing.T) {
	g := mustParse(t, strings.Replace(mixedGraph, "  - name: ratings\n    protocol: grpc\n", "  - name: ratings\n    protocol: grpc\n    errorRate: 100%\n", 1))
	urls := startPods(t, g, []testPod{{"web", "v1"}, {"emoji", "v1"}, {"voting", "v1"}, {"ratings", "v1"}}, nil)
	resp, body, tr := get(t, urls["web"]+"/", nil)
	if resp.StatusCode != 502 || len(tr.Calls) != 2 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	em := tr.Calls[0]
	if em.Code != 502 || len(em.Calls) != 1 || em.Calls[0].Code != 500 || em.Calls[0].Error != "injected fault" {
		t.Errorf("emoji node %+v: want 502 with ratings' injected fault inside", em)
	}
	// Straight to emoji over gRPC: Unavailable, with the trace in the trailer.
	cc, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(urls["emoji"], "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(passCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var out []byte
	var trailer metadata.MD
	in := []byte{}
	err = cc.Invoke(context.Background(), CallMethod, &in, &out, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || !strings.Contains(strings.Join(trailer.Get(grpcTraceKey), ""), `"service":"ratings"`) {
		t.Errorf("emoji over gRPC: %v, trailer %v", err, trailer)
	}
}
