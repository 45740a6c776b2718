package load

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReadResponse(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		head   bool
		status int
		body   int64
		close  bool
		rest   string // what must remain unread
		errIs  error
	}{
		{name: "content-length", in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT", status: 200, body: 5, rest: "NEXT"},
		{name: "lf only", in: "HTTP/1.1 404 Not Found\nContent-Length: 2\n\nhi", status: 404, body: 2},
		{name: "no reason", in: "HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n", status: 200},
		{name: "chunked", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\nNEXT", status: 200, body: 15, rest: "NEXT"},
		{name: "interim 100", in: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx", status: 201, body: 1},
		{name: "head ignores length", in: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nNEXT", head: true, status: 200, rest: "NEXT"},
		{name: "204 no body", in: "HTTP/1.1 204 No Content\r\n\r\nNEXT", status: 204, rest: "NEXT"},
		{name: "until close", in: "HTTP/1.0 200 OK\r\n\r\nabcdef", status: 200, body: 6, close: true},
		{name: "http/1.0 keep-alive", in: "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx", status: 200, body: 1},
		{name: "http/1.0 default close", in: "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", status: 200, body: 1, close: true},
		{name: "connection close", in: "HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", status: 503, close: true},
		{name: "bad status", in: "HTTP/2 200 OK\r\n\r\n", errIs: ErrMalformedResponse},
		{name: "status letters", in: "HTTP/1.1 2x0 OK\r\n\r\n", errIs: ErrMalformedResponse},
		{name: "bad length", in: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", errIs: ErrMalformedResponse},
		{name: "conflicting lengths", in: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", errIs: ErrMalformedResponse},
		{name: "bad chunk", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", errIs: ErrMalformedResponse},
		{name: "header without colon", in: "HTTP/1.1 200 OK\r\nbogus\r\n\r\n", errIs: ErrMalformedResponse},
		{name: "short body", in: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", status: 200, body: 3, errIs: io.ErrUnexpectedEOF},
		{name: "line too long", in: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n", errIs: ErrMalformedResponse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rd := strings.NewReader(c.in)
			br := bufio.NewReaderSize(rd, 4096)
			got, err := ReadResponse(br, c.head)
			if c.errIs != nil {
				if !errors.Is(err, c.errIs) {
					t.Fatalf("error = %v, want %v", err, c.errIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.Status != c.status || got.BodyBytes != c.body || got.Close != c.close {
				t.Fatalf("got %+v, want status %d body %d close %v", got, c.status, c.body, c.close)
			}
			rest, _ := br.Peek(br.Buffered())
			if string(rest) != c.rest {
				t.Fatalf("left %q unread, want %q", rest, c.rest)
			}
		})
	}
}

func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, head bool) {
		br := bufio.NewReaderSize(strings.NewReader(string(in)), 64)
		got, err := ReadResponse(br, head)
		if err != nil {
			return
		}
		if got.Status < 100 || got.Status > 999 {
			t.Fatalf("accepted status %d", got.Status)
		}
		if got.BodyBytes < 0 || got.BodyBytes > int64(len(in)) {
			t.Fatalf("body of %d bytes from %d bytes of input", got.BodyBytes, len(in))
		}
	})
}

// The epoll loop's in-place parser must read every response it takes exactly as
// ReadResponse does, and hand every other shape over to it.
func TestParseBufferedAgreesWithReadResponse(t *testing.T) {
	for _, c := range []struct {
		in   string
		head bool
		want bufferedState
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloNEXT", false, bufferedComplete},
		{"HTTP/1.1 200 OK\r\nServer: nginx\r\ncontent-length: 3\r\nConnection: keep-alive\r\n\r\nok\n", false, bufferedComplete},
		{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nNEXT", true, bufferedComplete},
		{"HTTP/1.1 204 No Content\r\n\r\nNEXT", false, bufferedComplete},
		{"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", false, bufferedComplete},
		{"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", false, bufferedComplete},
		{"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", false, bufferedIncomplete},
		{"HTTP/1.1 200 OK\r\nContent-Len", false, bufferedOther},
		{"HTTP/1.1 404 Not Found\nContent-Length: 2\n\nhi", false, bufferedOther},
		{"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 2\r\n\r\nhi", false, bufferedOther},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", false, bufferedOther},
		{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx", false, bufferedOther},
		{"HTTP/1.0 200 OK\r\n\r\nuntil close", false, bufferedOther},
		{"HTTP/2 200 OK\r\n\r\n", false, bufferedError},
		{"HTTP/1.1 200 OK\r\nbogus\r\n\r\n", false, bufferedError},
		{"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", false, bufferedError},
	} {
		_, _, st, _ := parseBuffered([]byte(c.in), c.head)
		if st != c.want {
			t.Errorf("%q: state %d, want %d", c.in, st, c.want)
		}
		checkParseBuffered(t, []byte(c.in), c.head)
	}
}

// FuzzParseBuffered: on any input, what the in-place parser concludes ReadResponse
// concludes too.
func FuzzParseBuffered(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\nrest",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, head bool) { checkParseBuffered(t, in, head) })
}

func checkParseBuffered(t *testing.T, in []byte, head bool) {
	t.Helper()
	got, used, st, perr := parseBuffered(in, head)
	br := bufio.NewReaderSize(strings.NewReader(string(in)), max(len(in), 16))
	want, err := ReadResponse(br, head)
	switch st {
	case bufferedComplete:
		if err != nil || got != want || used != len(in)-br.Buffered() {
			t.Fatalf("%q: in place %+v using %d bytes; ReadResponse %+v, %v, using %d", in, got, used, want, err, len(in)-br.Buffered())
		}
	case bufferedIncomplete:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%q: in place incomplete; ReadResponse %+v, %v", in, want, err)
		}
	case bufferedError:
		if perr == nil || err == nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			t.Fatalf("%q: in place error %v; ReadResponse %+v, %v", in, perr, want, err)
		}
	}
}
