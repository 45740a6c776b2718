package load

import (
	"net"
	"strings"
	"testing"
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

// TestClosedPathsAgree runs the closed model's epoll loop and its goroutine path (the
// one any custom Client takes) over the same response shapes: same counts, same bytes.
func TestClosedPathsAgree(t *testing.T) {
	big := strings.Repeat("b", 100<<10)
	shapes := []struct {
		name  string
		resp  string
		close bool
		body  int64
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false, 5},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", false, 5},
		{"big body", "HTTP/1.1 200 OK\r\nContent-Length: 102400\r\n\r\n" + big, false, 100 << 10},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true, 2},
		{"until close", "HTTP/1.0 200 OK\r\n\r\nuntil-close", true, 11},
		{"closes without saying", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, 2},
		{"503", "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", false, 0},
	}
	const count = 60
	for _, sh := range shapes {
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
