package envoysidecar

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/workload"
)

// BenchmarkSidecarHopPerProtocol measures, side by side in one run, a request to a
// one-service app directly and through a client and a server sidecar with strict mTLS,
// for each protocol the workload speaks: the round trip (ns/op) and the CPU both Envoys
// spent per request (envoy-cpu-µs/op). Each protocol uses the load engine's own client
// for it; one request in flight at a time.
func BenchmarkSidecarHopPerProtocol(b *testing.B) {
	for _, protocol := range workload.Protocols {
		serve := func(addr string) { serveGraph(b, addr, protocol) }
		b.Run(protocol+"/direct", func(b *testing.B) {
			port := freePortOn(b, "127.0.0.11")
			addr := fmt.Sprintf("127.0.0.11:%d", port)
			serve(addr)
			benchProtocol(b, protocol, addr, nil)
		})
		b.Run(protocol+"/sidecars-mtls-strict", func(b *testing.B) {
			m := startMeshPairFor(b, mesh.MTLSStrict, protocol, serve)
			benchProtocol(b, protocol, fmt.Sprintf("127.0.0.13:%d", m.port), []int{m.clientSide.pid, m.serverSide.pid})
		})
	}
}

// serveGraph runs the workload service "reviews" of a one-service graph on addr.
func serveGraph(b *testing.B, addr, protocol string) {
	b.Helper()
	g, err := workload.Parse("bench.yaml", []byte("name: bench\nservices:\n  - name: reviews\n    protocol: "+protocol+"\n    responseSize: 1KiB\n"))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := workload.NewServer(g, workload.ServerOptions{Service: "reviews", Pod: "reviews-v1-0"})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
}

func benchProtocol(b *testing.B, protocol, addr string, envoys []int) {
	var client load.Client
	req := load.Request{Method: "GET", URL: "http://" + addr + "/", Header: map[string][]string{"Host": {"reviews:" + strings.Split(addr, ":")[1]}}}
	switch protocol {
	case workload.ProtocolHTTP:
		client = load.NewHTTP1Client(load.ClientOptions{})
	case workload.ProtocolHTTP2:
		client = load.NewH2Client(load.ClientOptions{}, nil)
	case workload.ProtocolGRPC:
		c, err := load.NewGRPCClient(load.ClientOptions{})
		if err != nil {
			b.Fatal(err)
		}
		client, req.Method, req.URL = c, "POST", req.URL[:len(req.URL)-1]+workload.CallMethod
	}
	p, err := client.Prepare(req)
	if err != nil {
		b.Fatal(err)
	}
	s := client.NewSession()
	defer s.Close()
	var out load.Outcome
	do := func() {
		if err := s.Do(context.Background(), p, time.Now().Add(10*time.Second), &out); err != nil || out.Status != 200 {
			b.Fatalf("%s request: status %d, %v", protocol, out.Status, err)
		}
	}
	do() // open the connections
	cpu0 := cpuTicks(b, envoys)
	b.ResetTimer()
	for b.Loop() {
		do()
	}
	b.StopTimer()
	if len(envoys) > 0 {
		b.ReportMetric(float64(cpuTicks(b, envoys)-cpu0)*1e6/float64(clockTicks)/float64(b.N), "envoy-cpu-µs/op")
	}
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times on Linux.
const clockTicks = 100

// cpuTicks sums user and system time of the processes.
func cpuTicks(b *testing.B, pids []int) int64 {
	var n int64
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatal(err)
		}
		// Fields after the command name, which is in parentheses and may hold spaces.
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		for _, i := range []int{11, 12} { // utime, stime (fields 14 and 15 of the line)
			v, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			n += v
		}
	}
	return n
}
