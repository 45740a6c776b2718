package load

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const benchServerEnv = "MESHMARK_BENCH_SERVER"

// TestProtocolBenchServer is not a test: BenchmarkProtocols runs the test binary again
// with this test alone to serve from another process, so that the benchmark's CPU
// figures are the client's own and the server's are read from /proc apart.
func TestProtocolBenchServer(t *testing.T) {
	if os.Getenv(benchServerEnv) == "" {
		t.Skip("runs only as BenchmarkProtocols' server process")
	}
	// net/http with HTTP/1.1 and h2c on one port: the same server for both HTTP
	// protocols, and for gRPC through grpc-go's ServeHTTP.
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Protocols: p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		io.WriteString(w, "ok")
	})}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(hl)
	go gs.Serve(gl)
	fmt.Printf("ADDRS %s %s\n", hl.Addr(), gl.Addr())
	io.Copy(io.Discard, os.Stdin) // until the benchmark closes our stdin
}

type benchServer struct {
	httpAddr, grpcAddr string
	pid                int
	stdin              io.Closer // held open: the server runs until it closes
}

// cpu is the server process's user+system time so far, at the kernel's tick resolution.
func (s *benchServer) cpu(b *testing.B) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime is field 14, the 12th after the name
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

var (
	benchServerOnce sync.Once
	benchServerInst *benchServer
	benchServerErr  error
)

func startBenchServer(b *testing.B) *benchServer {
	benchServerOnce.Do(func() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProtocolBenchServer$")
		cmd.Env = append(os.Environ(), benchServerEnv+"=1")
		stdin, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if benchServerErr = cmd.Start(); benchServerErr != nil {
			return
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) != 3 || f[0] != "ADDRS" {
			benchServerErr = fmt.Errorf("bench server said %q: %v", line, err)
			cmd.Process.Kill()
			return
		}
		benchServerInst = &benchServer{httpAddr: f[1], grpcAddr: f[2], pid: cmd.Process.Pid, stdin: stdin}
	})
	if benchServerErr != nil {
		b.Fatal(benchServerErr)
	}
	return benchServerInst
}

// BenchmarkProtocols runs the closed model with 4 connections, b.N requests, for each
// client against one server process (net/http serving HTTP/1.1 and h2c, gRPC through
// it and through grpc-go's own server), reporting requests per second and CPU per
// request of the client process and of the server process. Responses are two bytes
// ("ok", or a SERVING health check), so the figures are per-request overhead. Run with
// a fixed count, e.g. -benchtime 20000x.
func BenchmarkProtocols(b *testing.B) {
	srv := startBenchServer(b)
	grpcClient, err := NewGRPCClient(ClientOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		url    string
		client Client
	}{
		{"http1-epoll", "http://" + srv.httpAddr + "/", nil},
		{"http1", "http://" + srv.httpAddr + "/", NewHTTP1Client(ClientOptions{})},
		{"h2c", "http://" + srv.httpAddr + "/", NewH2Client(ClientOptions{}, nil)},
		{"grpc-via-nethttp", "http://" + srv.httpAddr, grpcClient},
		{"grpc-native-server", "http://" + srv.grpcAddr, grpcClient},
	} {
		b.Run(c.name, func(b *testing.B) {
			cpu0 := srv.cpu(b)
			res, err := Run(context.Background(), Config{
				Request: Request{URL: c.url},
				Closed:  &ClosedModel{Connections: 4},
				Count:   int64(b.N),
				Client:  c.client,
			})
			if err != nil {
				b.Fatal(err)
			}
			if res.Succeeded != int64(b.N) {
				b.Fatalf("ok %d of %d: %+v %v", res.Succeeded, b.N, res.Errors, res.ErrorSamples)
			}
			server := srv.cpu(b) - cpu0
			b.ReportMetric(res.AchievedRate, "req/s")
			b.ReportMetric(float64(res.Health.CPUPerRequest.Nanoseconds())/1e3, "client-µs/req")
			b.ReportMetric(float64(server.Nanoseconds())/1e3/float64(b.N), "server-µs/req")
			b.ReportMetric(float64(res.Service.Quantile(50).Microseconds()), "p50-µs")
		})
	}
}
