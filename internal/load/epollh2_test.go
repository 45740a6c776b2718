package load

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// runH2Epoll runs cfg and fails the test unless the HTTP/2 epoll loop drove it.
func runH2Epoll(t *testing.T, cfg Config) *Result {
	t.Helper()
	before := h2EpollRuns.Load()
	res := run(t, cfg)
	if h2EpollRuns.Load() != before+1 {
		t.Fatalf("the run did not take the HTTP/2 epoll loop")
	}
	return res
}

// goroutinePath is a closed model's rate high enough never to wait, which makes the
// engine take the goroutine path: what the epoll loop's results are compared with.
const goroutinePath = 1e9

// TestH2CPathsAgree: the epoll loop and the goroutine client count the same responses
// and classify the same failures alike: statuses, RST_STREAM from the server, timeouts,
// a server that is not HTTP/2, a refused connection.
func TestH2CPathsAgree(t *testing.T) {
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/reset":
			panic(http.ErrAbortHandler) // the server resets the stream (INTERNAL_ERROR)
		case "/stuck":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		default:
			io.WriteString(w, "hello")
		}
	})
	h1 := startServer(t, func(w http.ResponseWriter, r *http.Request) {})
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + closed.Addr().String() + "/"
	closed.Close()
	for _, tc := range []struct {
		name, url string
		count     int64
		want      Errors
		bytes     int64
	}{
		{"ok", s.url, 40, Errors{}, 40 * 5},
		{"503", s.url + "fail", 40, Errors{Non2xx: 40}, 0},
		{"reset", s.url + "reset", 40, Errors{Other: 40}, 0},
		{"timeout", s.url + "stuck", 4, Errors{Timeout: 4}, 0},
		{"not HTTP/2", h1, 3, Errors{Reset: 3}, 0}, // its answer reads as a frame cut short
		{"refused", refused, 3, Errors{Refused: 3}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, rate := range []float64{0, goroutinePath} {
				cfg := Config{Request: Request{URL: tc.url}, Closed: &ClosedModel{Connections: 4, Rate: rate}, Count: tc.count,
					Client: NewH2Client(ClientOptions{Streams: 2}, nil), Timeout: 200 * time.Millisecond}
				before := h2EpollRuns.Load()
				res := run(t, cfg)
				path := "goroutines"
				if h2EpollRuns.Load() != before {
					path = "epoll"
				}
				if (path == "epoll") != (rate == 0) {
					t.Fatalf("rate %v ran the %s path", rate, path)
				}
				if res.Completed != tc.count || res.Errors != tc.want || res.BytesIn != tc.bytes {
					t.Errorf("%s: completed %d, errors %+v, bytes %d; want %d, %+v, %d; samples %v",
						path, res.Completed, res.Errors, res.BytesIn, tc.count, tc.want, tc.bytes, res.ErrorSamples)
				}
				if tc.name == "reset" && (len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], "INTERNAL_ERROR")) {
					t.Errorf("%s: reset streams sampled as %v", path, res.ErrorSamples)
				}
			}
		})
	}
	if n := s.conns.Load(); n != 16 {
		t.Errorf("the server saw %d connections, want 16 (2 per run): failed streams must not cost theirs", n)
	}
}

// TestH2CEpollTimeoutKeepsConnection: a response later than the timeout is counted as a
// timeout and its stream reset (the server's handler sees the cancellation), and the
// requests after it go over the same connection.
func TestH2CEpollTimeoutKeepsConnection(t *testing.T) {
	var n atomic.Int64
	cancelled := make(chan struct{})
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) != 1 {
			return
		}
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(5 * time.Second):
		}
	})
	res := runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 1}, Count: 5,
		Client: NewH2Client(ClientOptions{}, nil), Timeout: 100 * time.Millisecond})
	if res.Errors.Timeout != 1 || res.Succeeded != 4 {
		t.Fatalf("errors %+v, ok %d; want 1 timeout and 4 responses; %v", res.Errors, res.Succeeded, res.ErrorSamples)
	}
	if res.Elapsed < 100*time.Millisecond || res.Elapsed > time.Second {
		t.Errorf("the run took %v, with one request timing out after 100 ms", res.Elapsed)
	}
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second):
		t.Errorf("the server never saw the timed-out stream reset")
	}
	if s.conns.Load() != 1 || res.Health.Connections != 1 {
		t.Errorf("server saw %d connections, client dialed %d; want 1: a timeout keeps the connection", s.conns.Load(), res.Health.Connections)
	}
}

// TestH2CEpollLargeResponses: responses larger than the stream window, adding up to more
// than the connection window, arrive whole: the client returns what it consumed.
func TestH2CEpollLargeResponses(t *testing.T) {
	body := bytes.Repeat([]byte("r"), 3*h2eStreamWindow/2+1000)
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	count := int64(2*h2eConnWindow/len(body) + 1)
	res := runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 2}, Count: count,
		Client: NewH2Client(ClientOptions{Streams: 2}, nil), Timeout: 20 * time.Second})
	if res.Succeeded != count || res.BytesIn != count*int64(len(body)) {
		t.Fatalf("ok %d of %d, bytes %d of %d; errors %+v %v", res.Succeeded, count, res.BytesIn, count*int64(len(body)), res.Errors, res.ErrorSamples)
	}
	if s.conns.Load() != 1 {
		t.Errorf("server saw %d connections, want 1", s.conns.Load())
	}
}

// TestH2CEpollRequestBodies: bodies of several frames, through a server window smaller
// than one body, arrive whole and intact on every stream.
func TestH2CEpollRequestBodies(t *testing.T) {
	body := make([]byte, 100<<10+7)
	for i := range body {
		body[i] = byte(rand.N(256))
	}
	want := sha256.Sum256(body)
	var bad atomic.Int64
	// startH2C's server drains bodies before its handler could check them: a server of
	// its own, with receive windows smaller than a body
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	var served atomic.Int64
	srv := &http.Server{Protocols: p, HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 32 << 10, MaxReceiveBufferPerConnection: 64 << 10},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, err := io.ReadAll(r.Body)
			if err != nil || sha256.Sum256(got) != want || r.ContentLength != int64(len(body)) {
				bad.Add(1)
			}
			served.Add(1)
		})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	res := runH2Epoll(t, Config{Request: Request{Method: "POST", URL: "http://" + ln.Addr().String() + "/", Body: body},
		Closed: &ClosedModel{Connections: 4}, Count: 40, Client: NewH2Client(ClientOptions{Streams: 2}, nil), Timeout: 10 * time.Second})
	if res.Succeeded != 40 || served.Load() != 40 || bad.Load() != 0 {
		t.Errorf("ok %d, served %d, bodies wrong %d; errors %+v %v", res.Succeeded, served.Load(), bad.Load(), res.Errors, res.ErrorSamples)
	}
}

// TestH2CEpollGoAway: a server that sends GOAWAY every 30 requests, taking no stream
// above the last it names. The run goes on over new connections; the streams the
// server turned away are sent again there, once: the server answers every request of
// the count exactly once and the client counts each once.
func TestH2CEpollGoAway(t *testing.T) {
	const perConn, count = 30, 200
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns, answered, turnedAway atomic.Int64
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serveGoAway(c, perConn, &answered, &turnedAway)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	res := runH2Epoll(t, Config{Request: Request{URL: "http://" + ln.Addr().String() + "/"}, Closed: &ClosedModel{Connections: 4}, Count: count,
		Client: NewH2Client(ClientOptions{Streams: 4}, nil), Timeout: 5 * time.Second})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done: // the client closed every connection, and the server read all it sent
	case <-time.After(5 * time.Second):
		t.Fatal("connections still open after the run")
	}
	if res.Succeeded != count || res.Errors.Total() != 0 || answered.Load() != count {
		t.Errorf("ok %d, errors %+v %v, server answered %d; want %d each", res.Succeeded, res.Errors, res.ErrorSamples, answered.Load(), count)
	}
	if turnedAway.Load() == 0 {
		t.Errorf("no stream was above a GOAWAY's last stream id: the test did not test the move")
	}
	if n := conns.Load(); n < count/perConn || res.Health.Connections != n {
		t.Errorf("server saw %d connections, client dialed %d; want %d+", n, res.Health.Connections, count/perConn)
	}
}

// serveGoAway serves one connection: after perConn requests it sends GOAWAY naming the
// last one, answers it, and turns away (reads, does not answer) every later stream.
func serveGoAway(c net.Conn, perConn int, answered, turnedAway *atomic.Int64) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil) // every block is decoded, answered or not
	if fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100}) != nil {
		return
	}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	n, last := 0, uint32(0)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return // the client closes the connection once its streams are done
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.MetaHeadersFrame:
			if last != 0 && f.StreamID > last {
				turnedAway.Add(1)
				continue
			}
			if n++; n == perConn {
				last = f.StreamID
				if fr.WriteGoAway(last, http2.ErrCodeNo, nil) != nil {
					return
				}
			}
			hbuf.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hbuf.Bytes(), EndHeaders: true}) != nil ||
				fr.WriteData(f.StreamID, true, []byte("ok")) != nil {
				return
			}
			answered.Add(1)
		}
	}
}

// TestH2CEpollHardStop: a run cancelled while every stream waits on a stuck server
// returns at once, its requests counted as aborted.
func TestH2CEpollHardStop(t *testing.T) {
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := h2EpollRuns.Load()
	began := time.Now()
	res, err := Run(ctx, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 4}, Duration: time.Minute,
		Client: NewH2Client(ClientOptions{Streams: 2}, nil)})
	if err == nil || res == nil || !res.Incomplete || h2EpollRuns.Load() != before+1 {
		t.Fatalf("cancelled run: err %v, result %v", err, res)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("cancelled run took %v to return", d)
	}
	if res.Health.Aborted != 4 || res.Completed != 0 {
		t.Errorf("aborted %d, completed %d; want the 4 in flight aborted", res.Health.Aborted, res.Completed)
	}
}

// TestH2CEpollRawLog: the loop records through the same recorder, so the raw log has
// a row per request.
func TestH2CEpollRawLog(t *testing.T) {
	s := startH2C(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	var log bytes.Buffer
	res := runH2Epoll(t, Config{Request: Request{URL: s.url}, Closed: &ClosedModel{Connections: 4}, Count: 100,
		Client: NewH2Client(ClientOptions{Streams: 2}, nil), RawLog: &log})
	rows := parseRawLog(t, log.Bytes())
	if len(rows) != 100 || res.Completed != 100 {
		t.Fatalf("%d rows, %d completed; want 100", len(rows), res.Completed)
	}
	for _, r := range rows {
		if !(0 <= r.intended && r.intended <= r.sent && r.sent <= r.firstByte && r.firstByte <= r.done) || r.status != "200" || r.bytesIn != 2 {
			t.Fatalf("row %+v", r)
		}
	}
}

func TestOnlyIndexed(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want bool
	}{
		{[]byte{0x82, 0x86}, true},
		{[]byte{0xff, 0x80, 0x01, 0x82}, true}, // index 127+128: continued in a second byte
		{[]byte{0x82, 0x41, 0x01, 'a'}, false}, // a literal that inserts
		{[]byte{0x3f, 0xe1, 0x1f}, false},      // a table size update
		{nil, false},
	} {
		if got := onlyIndexed(tc.b); got != tc.want {
			t.Errorf("onlyIndexed(% x) = %v, want %v", tc.b, got, tc.want)
		}
	}
}
