package workload

import (
	"io"
	"net/http"
	"net/url"
	"testing"
)

// discardWriter is the least a ResponseWriter can do, so that the handler's own cost shows.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

func benchGraph(b *testing.B, script string) *Graph {
	src := "name: g\nservices:\n  - name: a\n    isEntrypoint: true\n    responseSize: 1KiB\n" + script + "  - name: b\n    responseSize: 1KiB\n"
	g, err := Parse("bench.yaml", []byte(src))
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkHandlerNoCalls is the handler alone answering a request whose script makes
// no calls; allocations here are per request in production.
func BenchmarkHandlerNoCalls(b *testing.B) {
	g := benchGraph(b, "")
	srv, err := NewServer(g, ServerOptions{Service: "b", Pod: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	req := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Header: http.Header{"X-Request-Id": {"r"}}, Body: http.NoBody}
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		srv.ServeHTTP(w, req)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkServeNoCalls is a whole request over loopback with keep-alive (client costs
// included, both on this machine), run with -cpu 1 to see one core's rate.
func BenchmarkServeNoCalls(b *testing.B) {
	g := benchGraph(b, "")
	urls := startPods(b, g, []testPod{{"b", "v1"}}, nil)
	benchLoopback(b, urls["b"]+"/")
}

// BenchmarkServeOneCall adds one upstream call (a → b) to each request.
func BenchmarkServeOneCall(b *testing.B) {
	g := benchGraph(b, "    script: [call: b]\n")
	urls := startPods(b, g, []testPod{{"a", "v1"}, {"b", "v1"}}, nil)
	benchLoopback(b, urls["a"]+"/")
}

func benchLoopback(b *testing.B, target string) {
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, DisableCompression: true}}
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Get(target)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
