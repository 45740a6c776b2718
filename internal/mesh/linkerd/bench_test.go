package linkerd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/mesh/none"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
)

// benchRate is the request rate every mesh is measured at: low enough that neither
// proxy nor the shared 2-core machine saturates, so latency is per-request work, not
// queueing.
const benchRate = 200

// BenchmarkPerHopLinkerdVsEnvoy sends keep-alive HTTP/1.1 requests at benchRate from
// the load generator's pod to productpage's service address in the same testbed: with
// no mesh, through two Envoy sidecars (envoy-sidecar) and through two linkerd2-proxies
// (linkerd), one after the other in the same run, both with strict mTLS (so the client
// pod is meshed too, as in BenchmarkSidecarHopPerProtocol of envoysidecar, which
// measures Envoy alone on loopback) and 2 worker threads. It reports the median and p99
// latency, the added median latency per proxy hop against no mesh, and the proxies'
// CPU time per request (utime+stime of every sidecar process, from /proc).
//
//	go test -run '^$' -bench PerHop -benchtime 2000x ./internal/mesh/linkerd/
func BenchmarkPerHopLinkerdVsEnvoy(b *testing.B) {
	bd := newBedWith(b, testbed.Options{})
	ctx := context.Background()
	var baseP50 time.Duration
	for _, m := range []struct {
		name, profile string
		raw           map[string]any
	}{
		{"none", none.Name, nil},
		{"envoy-mtls-strict", envoysidecar.Name, map[string]any{"mtls": "strict"}},
		{"linkerd-mtls-strict", Name, map[string]any{"mtls": "strict"}},
	} {
		p, err := mesh.New(m.profile, m.raw)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Install(ctx, bd.tb, bd.app); err != nil {
			b.Fatal(err)
		}
		b.Run(m.name, func(b *testing.B) {
			p50 := measure(b, bd)
			if m.name == "none" {
				baseP50 = p50
			} else if baseP50 > 0 {
				b.ReportMetric(float64(p50-baseP50)/2/float64(time.Microsecond), "added-µs/hop")
			}
		})
		if err := p.Uninstall(ctx, bd.tb); err != nil {
			b.Fatal(err)
		}
	}
}

// measure sends b.N paced requests and reports latency and sidecar CPU per request.
func measure(b *testing.B, bd bed) time.Duration {
	from := bd.app.Clients[0]
	url := "http://" + mesh.Addr(bd.app.Service("productpage").VIP, 9080) + "/"
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return bd.tb.DialContext(ctx, from, network, a)
		},
		MaxIdleConnsPerHost: 1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	send := func() {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("HTTP %d", resp.StatusCode)
		}
	}
	for range 50 { // warm connections, discovery and the proxies' caches
		send()
	}
	cpu0 := sidecarCPU(b, bd.tb)
	lat := make([]time.Duration, 0, b.N)
	tick := time.NewTicker(time.Second / benchRate)
	defer tick.Stop()
	b.ResetTimer()
	for range b.N {
		<-tick.C
		t0 := time.Now()
		send()
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	cpu := sidecarCPU(b, bd.tb) - cpu0
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	b.ReportMetric(float64(p50)/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(p99)/float64(time.Microsecond), "p99-µs")
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(b.N), "proxy-cpu-µs/req")
	b.ReportMetric(0, "ns/op") // paced: wall time per op is the pacing, not a cost
	return p50
}

// sidecarCPU is the CPU time (user+system) of every running sidecar the testbed
// started, from /proc/<pid>/stat in clock ticks of 10 ms.
func sidecarCPU(b *testing.B, tb *testbed.Testbed) time.Duration {
	var total time.Duration
	for _, p := range tb.Processes() {
		if p.Spec().Role != substrate.RoleSidecar {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
		if err != nil {
			continue // stopped earlier
		}
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
		// After the command: state is field 3 of stat(5), utime 14 and stime 15.
		ut, err1 := strconv.ParseUint(f[11], 10, 64)
		st, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			b.Fatalf("/proc/%d/stat: %q", p.PID(), data)
		}
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}
