package load

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startRawServer answers every request with a fixed 1 KiB response, as cheaply as
// possible, so that benchmarks measure the client.
func startRawServer(b *testing.B) string { return serveRaw(b, answerBench(true)) }

// startRawTLSServer is startRawServer over TLS; it returns a client config that trusts
// it.
func startRawTLSServer(b *testing.B, keepAlive bool) (string, *tls.Config) {
	cert, roots := testCert(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	url := serveRawOn(b, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}), "https", answerBench(keepAlive))
	return url, &tls.Config{RootCAs: roots}
}

func answerBench(keepAlive bool) func(c net.Conn) bool {
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1024\r\n\r\n" + strings.Repeat("x", 1024))
	return func(c net.Conn) bool {
		_, err := c.Write(resp)
		return err == nil && keepAlive
	}
}

func benchRoundTrip(b *testing.B, c Client, url string) {
	p, err := c.Prepare(Request{Method: "GET", URL: url})
	if err != nil {
		b.Fatal(err)
	}
	s := c.NewSession()
	defer s.Close()
	ctx := context.Background()
	var out Outcome
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := s.Do(ctx, p, time.Now().Add(10*time.Second), &out); err != nil || out.Status != 200 {
			b.Fatal(out.Status, err)
		}
	}
}

// BenchmarkHTTP1RoundTrip is the hot path of every model: write the prepared request,
// read and parse the response, over a real loopback connection.
func BenchmarkHTTP1RoundTrip(b *testing.B) {
	benchRoundTrip(b, NewHTTP1Client(ClientOptions{}), startRawServer(b))
}

// BenchmarkHTTPSRoundTrip is the same on a kept-alive TLS connection: the price of
// encryption on both ends, and whether the hot path still allocates nothing.
func BenchmarkHTTPSRoundTrip(b *testing.B) {
	url, tc := startRawTLSServer(b, true)
	benchRoundTrip(b, NewHTTP1Client(ClientOptions{TLS: tc}), url)
}

// BenchmarkHTTP1NoKeepAlive is a connection per request without TLS, beside which
// BenchmarkHTTPSNoKeepAlive shows what the resumed handshake adds.
func BenchmarkHTTP1NoKeepAlive(b *testing.B) {
	benchRoundTrip(b, NewHTTP1Client(ClientOptions{DisableKeepAlive: true}), serveRaw(b, answerBench(false)))
}

// BenchmarkHTTPSNoKeepAlive is a connection per request with a resumed TLS session:
// what --no-keepalive over HTTPS costs, the server's half of the handshake included.
func BenchmarkHTTPSNoKeepAlive(b *testing.B) {
	url, tc := startRawTLSServer(b, false)
	benchRoundTrip(b, NewHTTP1Client(ClientOptions{TLS: tc, DisableKeepAlive: true}), url)
}

// BenchmarkNetHTTPRoundTrip is the same through net/http, for comparison.
func BenchmarkNetHTTPRoundTrip(b *testing.B) {
	benchRoundTrip(b, NewNetHTTPClient(ClientOptions{}), startRawServer(b))
}

// BenchmarkReadResponse is response parsing alone.
func BenchmarkReadResponse(b *testing.B) {
	one := "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 04:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: 612\r\nConnection: keep-alive\r\n\r\n" + strings.Repeat("x", 612)
	stream := []byte(strings.Repeat(one, 64))
	rd := bytes.NewReader(stream)
	br := bufio.NewReaderSize(rd, 16<<10)
	b.SetBytes(int64(len(one)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%64 == 0 {
			rd.Reset(stream)
			br.Reset(rd)
		}
		if r, err := ReadResponse(br, false); err != nil || r.Status != 200 {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseBuffered is the epoll loop's in-place parsing of the same response:
// compare with BenchmarkReadResponse, which it replaces for the common shape.
func BenchmarkParseBuffered(b *testing.B) {
	one := []byte("HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 04:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: 612\r\nConnection: keep-alive\r\n\r\n" + strings.Repeat("x", 612))
	b.SetBytes(int64(len(one)))
	b.ReportAllocs()
	for b.Loop() {
		if r, used, st, err := parseBuffered(one, false); st != bufferedComplete || used != len(one) || r.Status != 200 {
			b.Fatal(st, used, err)
		}
	}
}

// BenchmarkRecord is the cost of recording one request (three histograms, counters,
// under the recorder's lock), without and with a raw log. The log goes to io.Discard:
// this loop makes rows some 30 times faster than any run, faster than a disk takes
// them, and writing them is the writer goroutine's work (BenchmarkClosedRun has it).
func BenchmarkRecord(b *testing.B) {
	for _, raw := range []bool{false, true} {
		b.Run("raw="+strconv.FormatBool(raw), func(b *testing.B) {
			now := time.Now()
			var l *rawLog
			if raw {
				var err error
				if l, err = newRawLog(io.Discard); err != nil {
					b.Fatal(err)
				}
			}
			r := newRecorder(now, time.Time{}, l)
			if l != nil {
				l.run(now)
			}
			t := timing{intended: now, sent: now.Add(3 * time.Microsecond), firstByte: now.Add(150 * time.Microsecond), done: now.Add(180 * time.Microsecond), status: 200, bytesIn: 612}
			b.ReportAllocs()
			for b.Loop() {
				r.record(&t)
			}
			// This loop never parks, so the writer may not run soon enough and rows may be
			// dropped: they were formatted all the same, which is the cost measured here.
			r.closeRaw()
		})
	}
}

// BenchmarkClosedRun is a whole closed run at full speed (the epoll loop), one request
// per op, without and with a raw log to a file. cpu-ns/req is the process's CPU per
// request, the in-process server's included: compare the two, not with wrk.
func BenchmarkClosedRun(b *testing.B) {
	url := startRawServer(b)
	for _, raw := range []bool{false, true} {
		b.Run("raw="+strconv.FormatBool(raw), func(b *testing.B) {
			cfg := Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: 4}, Count: int64(b.N)}
			if raw {
				f, err := os.Create(filepath.Join(b.TempDir(), "raw.csv"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				cfg.RawLog = f
			}
			b.ReportAllocs()
			b.ResetTimer()
			res, err := Run(context.Background(), cfg)
			b.StopTimer()
			if err != nil || res.Succeeded != int64(b.N) || (raw && res.RawLog.Rows != int64(b.N)) {
				b.Fatalf("err %v, ok %d of %d, raw log %+v", err, res.Succeeded, b.N, res.RawLog)
			}
			b.ReportMetric(float64(res.Health.CPUPerRequest.Nanoseconds()), "cpu-ns/req")
		})
	}
}
