package load

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// silentResolver is a DNS server on loopback that reads every query and answers none,
// as a cluster's DNS that is down; a resolver pointed at it times out.
func silentResolver(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// TestLookupsThatFailAreCountedErrors: with the target's name unresolvable because the
// resolver does not answer, every request of the run is counted, as a lookup error,
// rather than stalling behind the first lookup and ending the run dropped with no error
// at all (as runs on a cluster whose DNS was down did).
func TestLookupsThatFailAreCountedErrors(t *testing.T) {
	resolver := silentResolver(t)
	var lookups atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		lookups.Add(1)
		ips, err := resolver.LookupHost(ctx, host)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(ips[0], port))
	}
	res, err := Run(context.Background(), Config{
		Request:        Request{URL: "http://front.mesh.svc.cluster.local:9080/"},
		Open:           &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 50}},
		Duration:       2 * time.Second,
		Timeout:        time.Second,
		Dial:           dial,
		AllowAnyTarget: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("completed %d, errors %+v, dropped %d, aborted %d, lookups %d", res.Completed, res.Errors, res.Health.Dropped, res.Health.Aborted, lookups.Load())
	if res.Errors.Lookup != res.Completed || res.Errors.Total() != res.Completed {
		t.Errorf("errors %+v of %d completed: want every one a lookup error", res.Errors, res.Completed)
	}
	// 100 sends intended over 2 s; each lookup stalls for the 1 s timeout, so without
	// remembering the failure about two would be counted and the rest dropped.
	if res.Completed < 90 || res.Health.Dropped > 10 {
		t.Errorf("%d requests counted, %d dropped: want the 100 intended counted as failed lookups", res.Completed, res.Health.Dropped)
	}
	if n := lookups.Load(); n > 5 {
		t.Errorf("the resolver was asked %d times in a 2 s run: a failed lookup is remembered for %s", n, lookupMemory)
	}
}

func TestClassifyLookup(t *testing.T) {
	_, err := net.Dial("tcp", "nosuch.invalid:80") // any resolver: none knows .invalid (RFC 6761)
	if err == nil {
		t.Skip("nosuch.invalid resolved here")
	}
	var dns *net.DNSError
	if !errors.As(err, &dns) {
		t.Skipf("no DNS error for nosuch.invalid: %v", err)
	}
	if k := Classify(err); k != KindLookup || k.String() != "lookup" {
		t.Errorf("Classify(%v) = %s, want lookup", err, k)
	}
	timedOut := &net.OpError{Op: "dial", Err: &net.DNSError{Err: "i/o timeout", Name: "x", IsTimeout: true}}
	if k := Classify(timedOut); k != KindLookup {
		t.Errorf("a lookup that timed out is %s, want lookup (not the target's timeout)", k)
	}
}
