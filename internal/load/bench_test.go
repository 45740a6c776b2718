package load

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// startRawServer answers every request with a fixed 1 KiB response, as cheaply as
// possible, so that benchmarks measure the client.
func startRawServer(b *testing.B) string {
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1024\r\n\r\n" + strings.Repeat("x", 1024))
	return serveRaw(b, func(c net.Conn) bool {
		_, err := c.Write(resp)
		return err == nil
	})
}

func benchRoundTrip(b *testing.B, c Client) {
	url := startRawServer(b)
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
func BenchmarkHTTP1RoundTrip(b *testing.B) { benchRoundTrip(b, NewHTTP1Client(ClientOptions{})) }

// BenchmarkNetHTTPRoundTrip is the same through net/http, for comparison.
func BenchmarkNetHTTPRoundTrip(b *testing.B) { benchRoundTrip(b, NewNetHTTPClient(ClientOptions{})) }

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

// BenchmarkRecord is the cost of recording one request (three histograms, counters,
// under the recorder's lock).
func BenchmarkRecord(b *testing.B) {
	now := time.Now()
	r := newRecorder(now, nil)
	t := timing{intended: now, sent: now.Add(3 * time.Microsecond), firstByte: now.Add(150 * time.Microsecond), done: now.Add(180 * time.Microsecond), status: 200, bytesIn: 612}
	b.ReportAllocs()
	for b.Loop() {
		r.record(&t)
	}
}
