package wire

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

var (
	cli = netip.MustParseAddrPort("198.18.1.2:40000")
	srv = netip.MustParseAddrPort("198.18.2.3:9080")
)

// feedStream feeds a byte stream from src to dst as segments of the given size,
// after a handshake, with the sequence numbers TCP would give them.
func feedStreams(t *Tracker, toSrv, toCli []byte, size int) {
	t.Add(Segment{Src: cli, Dst: srv, Seq: 1000, SYN: true, Tap: "node0"})
	t.Add(Segment{Src: srv, Dst: cli, Seq: 5000, SYN: true, ACK: true, Tap: "node0"})
	seqC, seqS := uint32(1001), uint32(5001)
	for len(toSrv) > 0 || len(toCli) > 0 {
		if n := min(size, len(toSrv)); n > 0 {
			t.Add(Segment{Src: cli, Dst: srv, Seq: seqC, ACK: true, Payload: toSrv[:n], Tap: "node0"})
			seqC += uint32(n)
			toSrv = toSrv[n:]
		}
		if n := min(size, len(toCli)); n > 0 {
			t.Add(Segment{Src: srv, Dst: cli, Seq: seqS, ACK: true, Payload: toCli[:n], Tap: "node0"})
			seqS += uint32(n)
			toCli = toCli[n:]
		}
	}
}

// realTLS runs a real crypto/tls handshake and one exchange over an in-memory pipe and
// returns the bytes each side wrote.
func realTLS(t *testing.T, sni string, alpn []string, maxVersion uint16) (toSrv, toCli []byte) {
	t.Helper()
	cert := selfSigned(t)
	a, b := net.Pipe()
	var ca, sa bytes.Buffer
	ctap, stap := &tapConn{Conn: a, w: &ca}, &tapConn{Conn: b, w: &sa}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := tls.Server(stap, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: alpn})
		buf := make([]byte, 64)
		n, _ := s.Read(buf)
		s.Write(append([]byte("reply:"), buf[:n]...))
		s.Close()
	}()
	c := tls.Client(ctap, &tls.Config{ServerName: sni, NextProtos: alpn, InsecureSkipVerify: true, MaxVersion: maxVersion})
	if _, err := c.Write([]byte("GET /secret HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	c.Read(buf)
	a.Close() // not c.Close: its close_notify would wait 5 s for the server to read it
	wg.Wait()
	return ca.Bytes(), sa.Bytes()
}

type tapConn struct {
	net.Conn
	w *bytes.Buffer
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.w.Write(p)
	return c.Conn.Write(p)
}

func TestTLSFlowWithSNIAndALPN(t *testing.T) {
	for _, tc := range []struct {
		max  uint16
		want string
		size int
	}{{tls.VersionTLS13, "TLS 1.3", 1460}, {tls.VersionTLS12, "TLS 1.2", 7}} {
		toSrv, toCli := realTLS(t, "reviews.default.svc", []string{"h2", "istio"}, tc.max)
		tr := NewTracker()
		feedStreams(tr, toSrv, toCli, tc.size) // 7-byte segments split record headers
		fs := tr.Flows()
		if len(fs) != 1 {
			t.Fatalf("%d flows", len(fs))
		}
		f := fs[0]
		if f.Class != ClassTLS || f.TLSVersion != tc.want || f.SNI != "reviews.default.svc" || strings.Join(f.ALPN, ",") != "h2,istio" {
			t.Errorf("flow %s; want tls %s sni reviews.default.svc alpn h2,istio", f, tc.want)
		}
		if f.PlaintextBytes != 0 || f.Client != cli || f.Server != srv || f.Midstream {
			t.Errorf("flow %+v: plaintext %d, client %s", f, f.PlaintextBytes, f.Client)
		}
		if f.PayloadBytes != int64(len(toSrv)+len(toCli)) {
			t.Errorf("payload %d, want %d", f.PayloadBytes, len(toSrv)+len(toCli))
		}
	}
}

func TestPlaintextHTTPAndH2C(t *testing.T) {
	tr := NewTracker()
	feedStreams(tr, []byte("GET /reviews/0 HTTP/1.1\r\nHost: reviews\r\n\r\n"), []byte("HTTP/1.1 200 OK\r\n\r\n"), 10)
	f := tr.Flows()[0]
	if f.Class != ClassHTTP || !strings.HasPrefix(f.PlaintextSample, "GET /reviews/0") || f.PlaintextBytes == 0 {
		t.Errorf("plaintext HTTP seen as %s", f)
	}
	tr = NewTracker()
	feedStreams(tr, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), nil, 100)
	if f := tr.Flows()[0]; f.Class != ClassH2C {
		t.Errorf("h2c preface seen as %s", f)
	}
}

// A stream that starts as TLS and then carries bytes outside any record is not
// encrypted: the bytes after the framing broke are counted as plaintext.
func TestTLSThenPlaintextIsCaught(t *testing.T) {
	toSrv, toCli := realTLS(t, "x", nil, tls.VersionTLS13)
	toSrv = append(toSrv, []byte("GET /leak HTTP/1.1\r\n\r\n")...)
	tr := NewTracker()
	feedStreams(tr, toSrv, toCli, 1460)
	f := tr.Flows()[0]
	if f.PlaintextBytes == 0 || !strings.Contains(f.PlaintextSample, "GET /leak") {
		t.Errorf("plaintext after TLS not caught: %s (%d plaintext bytes)", f, f.PlaintextBytes)
	}
}

// Retransmissions and the copy another bridge saw are not counted twice; a hole stops
// judging the framing rather than calling the rest plaintext.
func TestRetransmitsCopiesAndHoles(t *testing.T) {
	toSrv, toCli := realTLS(t, "x", nil, tls.VersionTLS13)
	tr := NewTracker()
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1000, SYN: true, Tap: "node0"})
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1000, SYN: true, Tap: "node1"})
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1001, ACK: true, Payload: toSrv[:100], Tap: "node0"})
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1001, ACK: true, Payload: toSrv[:100], Tap: "node0"}) // retransmitted
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1001, ACK: true, Payload: toSrv[:100], Tap: "node1"}) // the other bridge's copy
	tr.Add(Segment{Src: cli, Dst: srv, Seq: 1001 + 150, ACK: true, Payload: toSrv[150:], Tap: "node0"})
	tr.Add(Segment{Src: srv, Dst: cli, Seq: 1, ACK: true, Payload: toCli, Tap: "node0"})
	f := tr.Flows()[0]
	if f.PayloadBytes != int64(100+len(toSrv)-150+len(toCli)) {
		t.Errorf("payload %d counted", f.PayloadBytes)
	}
	if f.Gaps != 1 || f.PlaintextBytes != 0 || f.Class != ClassTLS {
		t.Errorf("hole: %s, gaps %d, plaintext %d", f, f.Gaps, f.PlaintextBytes)
	}
	if strings.Join(f.SeenOn, ",") != "node0,node1" {
		t.Errorf("seen on %v", f.SeenOn)
	}
}

// Without the SYN, the ephemeral port says who the client is; HBONE is TLS to 15008.
func TestMidstreamAndHBONE(t *testing.T) {
	toSrv, toCli := realTLS(t, "", []string{"h2"}, tls.VersionTLS13)
	hbone := netip.MustParseAddrPort("198.18.2.3:15008")
	tr := NewTracker()
	tr.Add(Segment{Src: hbone, Dst: cli, Seq: 77, ACK: true, Payload: toCli, Tap: "node0"})
	tr.Add(Segment{Src: cli, Dst: hbone, Seq: 5, ACK: true, Payload: toSrv, Tap: "node0"})
	f := tr.Flows()[0]
	if f.Class != ClassHBONE || f.Client != cli || !f.Midstream {
		t.Errorf("flow %s (client %s, midstream %v), want hbone from %s", f, f.Client, f.Midstream, cli)
	}
}

func FuzzParseHello(f *testing.F) {
	toSrv, toCli := realTLS(&testing.T{}, "seed.example", []string{"h2"}, tls.VersionTLS13)
	f.Add(toSrv[5:])
	f.Add(toCli[5:])
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		parseHello(b)
		tr := NewTracker()
		feedStreams(tr, b, b, 13)
		tr.Flows()
	})
}
