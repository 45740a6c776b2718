package load

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"
)

// DialFunc opens a connection; the study runner passes one that dials from inside a
// network namespace.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Request is what the engine sends. URL must be absolute (http://host:port/path or
// https://...).
type Request struct {
	Method string
	URL    string
	Header http.Header
	Body   []byte
}

// Prepared is a request in the form a Client sends fastest (for the HTTP/1.1 client,
// its bytes on the wire). Encoded belongs to the Client that made it.
type Prepared struct {
	Request Request
	Encoded any
}

// Client turns requests into sessions' work. Protocols (HTTP/1.1, HTTP/2, gRPC)
// implement it; the load models only see this interface.
type Client interface {
	Prepare(r Request) (*Prepared, error)
	// NewSession returns one logical connection, used by one goroutine at a time.
	NewSession() Session
}

// Session sends requests one after another over (normally) one connection.
type Session interface {
	// Do sends p and reads the whole response, filling out. The request must be
	// complete by deadline. A non-2xx status is not an error.
	Do(ctx context.Context, p *Prepared, deadline time.Time, out *Outcome) error
	Close() error
}

// SplitSession is a Session that can write a request from one goroutine while another
// waits for its response. The open model writes from its scheduling thread at the
// intended time while the connection's own goroutine is already blocked reading, so no
// goroutine has to be woken for the send.
//
// The caller serialises Ready and Send with the transitions of the waiting goroutine
// (Idle before it waits, its actions after Await returns); Await must not change the
// session, so that Ready and Send can run while it blocks.
type SplitSession interface {
	Session
	// Ready reports whether Send can write p right away (a reusable connection is open).
	Ready(p *Prepared) bool
	// Idle prepares the open connection to wait for the next response without a
	// deadline, and to stop waiting when ctx ends.
	Idle(ctx context.Context)
	// Send writes p; the exchange must end by deadline. If the write fails, the pending
	// Await returns promptly.
	Send(p *Prepared, deadline time.Time) error
	// Await reads the next response. It leaves closing to the caller: on an error or
	// when out.Close is set, the caller must Close the session.
	Await(p *Prepared, out *Outcome) error
}

// Outcome is what a Session reports about one request.
type Outcome struct {
	Status    int
	FirstByte time.Time // when the first byte of the response was read
	BytesIn   int64     // response body bytes
	Dialed    bool      // a new connection was opened for this request
	Close     bool      // (Await only) the connection cannot carry another request
	// Detail says why a non-2xx response failed when its status alone does not (gRPC:
	// the status code and message); it is sampled in the report like transport errors.
	Detail string
}

// ErrorKind classifies a failed request.
type ErrorKind uint8

// Error kinds; KindNone means the response arrived with a 2xx status.
const (
	KindNone ErrorKind = iota
	KindRefused
	KindReset
	KindTimeout
	KindNon2xx
	KindOther
	// KindLookup is a name that did not resolve: no such host, or a resolver that did
	// not answer in time (a cluster's DNS down), which is not the target's timeout.
	KindLookup
	numKinds
)

var kindNames = [numKinds]string{"none", "refused", "reset", "timeout", "non2xx", "other", "lookup"}

func (k ErrorKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Classify maps a transport error to its kind.
func Classify(err error) ErrorKind {
	if err == nil {
		return KindNone
	}
	var ne net.Error
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns):
		return KindLookup
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindRefused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.As(err, &ne) && ne.Timeout():
		return KindTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return KindReset
	}
	return KindOther
}

// ClientOptions configure the built-in clients.
type ClientOptions struct {
	Dial             DialFunc // nil: a plain net.Dialer
	DisableKeepAlive bool     // a new connection per request
	// TLS configures https connections: roots, InsecureSkipVerify, client certificates
	// (mTLS), ServerName (empty: the URL's host). nil: system roots, no client
	// certificate. The clients copy it; NextProtos is theirs to set.
	TLS *tls.Config
	// ReadBufferSize is the per-connection read buffer; 0 means 16 KiB.
	ReadBufferSize int
	// Streams is how many sessions share one connection, each with its own request in
	// flight (HTTP/2 and gRPC only; 0 or 1: a connection per session). N sessions then
	// use ceil(N/Streams) connections: -c 64 with 8 streams is h2load -c 8 -m 8.
	Streams int
}

// streams is Streams with its default.
func (o ClientOptions) streams() int { return max(1, o.Streams) }

// connGroup hands out shared connections to sessions: every `size` sessions in a row
// share one, made by newConn. It is how multiplexing protocols put several streams on
// a connection while each session still carries one request at a time.
type connGroup[C any] struct {
	mu      sync.Mutex
	size    int
	cur     C
	members int
	newConn func() C
}

func (g *connGroup[C]) join() C {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.members == 0 || g.members == g.size {
		g.cur, g.members = g.newConn(), 0
	}
	g.members++
	return g.cur
}

// sharers counts the sessions of one shared connection that are not closed, so that the
// connection is closed with its last session, not under the others' feet.
type sharers struct {
	mu   sync.Mutex
	open int
}

// enter counts a new session.
func (s *sharers) enter() {
	s.mu.Lock()
	s.open++
	s.mu.Unlock()
}

// reopen marks a session in use again (a Do after its Close).
func (s *sharers) reopen(closed *bool) {
	if *closed {
		s.enter()
		*closed = false
	}
}

// leave marks a session closed and reports whether it was the last one open.
func (s *sharers) leave(closed *bool) bool {
	if *closed {
		return false
	}
	*closed = true
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	return s.open == 0
}

func (o ClientOptions) dial() DialFunc {
	dial := o.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return failedLookups(dial)
}

// lookupMemory is how long a dial remembers that an address's name did not resolve.
const lookupMemory = time.Second

// failedLookups wraps dial so that, for lookupMemory after an address's name failed to
// resolve, dials of it fail at once with the same error instead of asking the resolver
// again. Where the resolver does not answer (a cluster's DNS down), each dial would
// otherwise wait out the request's timeout, the sends queued behind it would end the run
// dropped, counted nowhere, and a run in which no request got through would report no
// errors; this way they fail, counted as lookup errors.
func failedLookups(dial DialFunc) DialFunc {
	type failure struct {
		err   error
		until time.Time
	}
	var mu sync.Mutex
	failed := map[string]failure{}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		f, ok := failed[addr]
		mu.Unlock()
		if ok && time.Now().Before(f.until) {
			return nil, f.err
		}
		conn, err := dial(ctx, network, addr)
		var dns *net.DNSError
		if err != nil && errors.As(err, &dns) && ctx.Err() != context.Canceled {
			mu.Lock()
			failed[addr] = failure{err, time.Now().Add(lookupMemory)}
			mu.Unlock()
		}
		return conn, err
	}
}
