package load

import (
	"net"
	"strings"
	"testing"
	"time"
)

// startShapeServer answers each request with resp; closeAfter closes the connection
// after every response (as HTTP/1.0 servers and "Connection: close" do).
func startShapeServer(t *testing.T, resp string, closeAfter bool) string {
	t.Helper()
	return serveRaw(t, func(c net.Conn) bool {
		_, err := c.Write([]byte(resp))
		return err == nil && !closeAfter
	})
}

// responseShapes are the ways a response can be framed and end, which every path of
// the engine must count alike.
var responseShapes = []struct {
	name  string
	resp  string
	close bool // the server closes the connection after it
	body  int64
}{
	{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false, 5},
	{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", false, 5},
	{"big body", "HTTP/1.1 200 OK\r\nContent-Length: 102400\r\n\r\n" + strings.Repeat("b", 100<<10), false, 100 << 10},
	{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true, 2},
	{"until close", "HTTP/1.0 200 OK\r\n\r\nuntil-close", true, 11},
	{"closes without saying", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, 2},
	{"503", "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", false, 0},
}

// TestClosedPathsAgree runs the closed model's epoll loop and its goroutine path (the
// one any custom Client takes) over the same response shapes: same counts, same bytes.
func TestClosedPathsAgree(t *testing.T) {
	const count = 60
	for _, sh := range responseShapes {
		t.Run(sh.name, func(t *testing.T) {
			url := startShapeServer(t, sh.resp, sh.close)
			for _, client := range []Client{nil, NewHTTP1Client(ClientOptions{})} {
				res := run(t, Config{Request: Request{URL: url}, Closed: &ClosedModel{Connections: 3}, Count: count, Client: client})
				path := "epoll"
				if client != nil {
					path = "goroutines"
				}
				if res.Completed != count || res.Latency.TotalCount() != count || res.BytesIn != count*sh.body {
					t.Errorf("%s: completed %d, timed %d, bytes %d; want %d, %d, %d; errors %+v %v",
						path, res.Completed, res.Latency.TotalCount(), res.BytesIn, count, count, count*sh.body, res.Errors, res.ErrorSamples)
				}
				wantErrs := int64(0)
				if strings.Contains(sh.resp, " 503 ") {
					wantErrs = count
				}
				if res.Errors.Total() != wantErrs {
					t.Errorf("%s: errors %+v %v, want %d", path, res.Errors, res.ErrorSamples, wantErrs)
				}
				if wantConns := int64(3); sh.close {
					if res.Health.Connections != count {
						t.Errorf("%s: %d connections for %d responses that each closed theirs", path, res.Health.Connections, count)
					}
				} else if res.Health.Connections < 1 || res.Health.Connections > wantConns {
					// Keep-alive: never more than one connection per worker. Fewer is
					// allowed: on a busy machine a worker may start after the count ran out.
					t.Errorf("%s: %d connections, want 1..%d", path, res.Health.Connections, wantConns)
				}
			}
		})
	}
}

// TestOpenPathsAgree runs the open model's epoll loop and its goroutine path over the
// same response shapes: same counts, same bytes, one connection per response where the
// server closes them.
func TestOpenPathsAgree(t *testing.T) {
	const count = 60
	for _, sh := range responseShapes {
		t.Run(sh.name, func(t *testing.T) {
			url := startShapeServer(t, sh.resp, sh.close)
			for _, client := range []Client{nil, NewHTTP1Client(ClientOptions{})} {
				path := "epoll"
				if client != nil {
					path = "goroutines"
				}
				before := openEpollRuns.Load()
				res := run(t, Config{Request: Request{URL: url}, Count: count, Client: client,
					Open: &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 2000}, Connections: 2}})
				if ran := openEpollRuns.Load() > before; ran != (client == nil) {
					t.Errorf("%s: epoll loop ran: %v", path, ran)
				}
				if res.Sent != count || res.Completed != count || res.Latency.TotalCount() != count || res.BytesIn != count*sh.body {
					t.Errorf("%s: sent %d, completed %d, timed %d, bytes %d; want %d, %d, %d, %d; errors %+v %v",
						path, res.Sent, res.Completed, res.Latency.TotalCount(), res.BytesIn, count, count, count, count*sh.body, res.Errors, res.ErrorSamples)
				}
				if res.Health.SendLag.TotalCount() != count || res.Service.TotalCount() != count {
					t.Errorf("%s: %d send lags, %d service times for %d requests", path, res.Health.SendLag.TotalCount(), res.Service.TotalCount(), count)
				}
				wantErrs := int64(0)
				if strings.Contains(sh.resp, " 503 ") {
					wantErrs = count
				}
				if res.Errors.Total() != wantErrs {
					t.Errorf("%s: errors %+v %v, want %d", path, res.Errors, res.ErrorSamples, wantErrs)
				}
				if c := res.Health.Connections; sh.close && c != count || !sh.close && (c < 1 || c > count) {
					t.Errorf("%s: %d connections for %d responses (server closes: %v)", path, c, count, sh.close)
				}
				if r := res.RequestedRate; r < 1900 || r > 2100 {
					t.Errorf("%s: requested rate %.0f, want 2000", path, r)
				}
			}
		})
	}
}

// TestOpenPathsAgreeAtTheCap: a server slower than the schedule with in-flight capped
// makes both paths queue sends (late), then send every one of them.
func TestOpenPathsAgreeAtTheCap(t *testing.T) {
	url := startDelayServer(t, 5*time.Millisecond)
	const count = 100
	for _, client := range []Client{nil, NewHTTP1Client(ClientOptions{})} {
		res := run(t, Config{Request: Request{URL: url}, Count: count, Client: client,
			Open: &OpenModel{Schedule: ScheduleSpec{Arrival: Constant, Rate: 1000}, Connections: 1, MaxInFlight: 2}})
		h := res.Health
		if res.Completed != count || res.Succeeded != count || h.Late == 0 || h.Dropped != 0 || h.PeakInFlight != 2 || h.Connections != 2 {
			t.Errorf("client %v: completed %d, succeeded %d, late %d, dropped %d, peak %d, connections %d; want %d, %d, >0, 0, 2, 2",
				client, res.Completed, res.Succeeded, h.Late, h.Dropped, h.PeakInFlight, h.Connections, count, count)
		}
		// a late send waited for a connection: its latency from the intended time
		// includes the wait, its service time does not
		if l, s := res.Latency.Quantile(99), res.Service.Quantile(99); l < s+10*time.Millisecond {
			t.Errorf("client %v: latency p99 %v, service p99 %v: the queueing does not show", client, l, s)
		}
	}
}
