// Package wire owns capturing the testbed's pod traffic and telling, for every TCP
// flow, whether its payload crossed the wire inside TLS (or HBONE) or in the clear.
// It keeps per-flow state only, never packets, and reads each direction's bytes in
// sequence order so a TLS stream can be followed record by record: a flow counts as
// encrypted only when every payload byte in both directions sat inside a TLS record.
package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Class is what a flow's payload was.
type Class string

const (
	ClassTLS       Class = "tls"
	ClassHBONE     Class = "hbone" // TLS to HBONE's port, 15008
	ClassHTTP      Class = "http"  // plaintext HTTP/1.x
	ClassH2C       Class = "h2c"   // plaintext HTTP/2 (the connection preface)
	ClassPlaintext Class = "plaintext"
	ClassNoPayload Class = "no-payload"
)

// HBONEPort is where Istio's HBONE (HTTP/2 CONNECT inside mTLS) listens.
const HBONEPort = 15008

// Encrypted reports whether the class carries its payload inside TLS.
func (c Class) Encrypted() bool { return c == ClassTLS || c == ClassHBONE }

// Flow is one TCP connection as seen on the wire.
type Flow struct {
	Client, Server netip.AddrPort
	Class          Class
	// TLSVersion, SNI and ALPN come from the handshake, when it was seen.
	TLSVersion string   `json:",omitempty"`
	SNI        string   `json:",omitempty"`
	ALPN       []string `json:",omitempty"`
	// PayloadBytes counts both directions' payload once (retransmissions and the
	// copies seen on a second bridge are not counted again).
	PayloadBytes int64
	// PlaintextBytes is payload outside TLS records: all of it for a plaintext flow;
	// for a TLS flow, bytes after its record framing broke.
	PlaintextBytes int64
	Packets        int64
	// PlaintextSample is the start of the first plaintext payload, printable bytes
	// only, as evidence.
	PlaintextSample string `json:",omitempty"`
	// Gaps counts segments that arrived after a hole in the sequence (the capture
	// missed one): framing is not judged past a gap.
	Gaps int `json:",omitempty"`
	// Midstream is set when the capture did not see the flow's SYN, so which side
	// is the client was inferred from the ports.
	Midstream bool     `json:",omitempty"`
	SeenOn    []string `json:",omitempty"`
}

func (f Flow) String() string {
	s := fmt.Sprintf("%s -> %s %s", f.Client, f.Server, f.Class)
	if f.TLSVersion != "" {
		s += " " + f.TLSVersion
	}
	if f.SNI != "" {
		s += " sni " + f.SNI
	}
	if len(f.ALPN) > 0 {
		s += " alpn " + strings.Join(f.ALPN, ",")
	}
	if f.PlaintextBytes > 0 && f.Class.Encrypted() {
		s += fmt.Sprintf(", %d plaintext bytes after the TLS framing broke", f.PlaintextBytes)
	}
	if f.PlaintextSample != "" {
		s += fmt.Sprintf(" %q", f.PlaintextSample)
	}
	return s
}

// maxFlows bounds the state a capture keeps; flows beyond it are counted, not kept.
const maxFlows = 1 << 16

type flowKey struct{ a, b netip.AddrPort } // a < b

func keyOf(src, dst netip.AddrPort) (flowKey, bool) {
	if src.Compare(dst) < 0 {
		return flowKey{src, dst}, true
	}
	return flowKey{dst, src}, false
}

// streamKind is what a direction's payload turned out to be.
type streamKind uint8

const (
	kindUnknown streamKind = iota
	kindTLS
	kindPlain
)

// maxHello is how much of a handshake record is kept to parse a Client- or
// ServerHello (they are far smaller in practice).
const maxHello = 8 << 10

type stream struct {
	seqKnown  bool
	next      uint32
	kind      streamKind
	plain     Class // for kindPlain: http, h2c or plaintext
	lost      bool  // a gap: framing no longer followed
	broken    bool  // bytes outside TLS records were seen
	hdr       []byte
	left      int    // bytes left in the current record
	hello     []byte // the first handshake record, while it is being assembled
	helloLen  int
	helloDone bool
	bytes     int64
	plainN    int64
	sample    string
}

type flow struct {
	Flow
	fromA bool // the A side of the key is the client
	known bool // client side decided
	toSrv stream
	toCli stream
	tap   string
}

// Tracker follows TCP flows packet by packet. It is not safe for concurrent use.
type Tracker struct {
	flows   map[flowKey]*flow
	order   []flowKey
	Dropped int64 // flows not kept because of maxFlows
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{flows: map[flowKey]*flow{}} }

// Segment is one TCP segment's facts, as the capture decoded them.
type Segment struct {
	Src, Dst netip.AddrPort
	Seq      uint32
	SYN, ACK bool
	Payload  []byte
	Tap      string // where it was captured
}

// Add feeds one segment. Copies of a flow's segments seen on another tap are
// ignored: each flow is followed on the tap that saw it first, where its segments
// arrive in the order the kernel forwarded them.
func (t *Tracker) Add(s Segment) {
	k, srcIsA := keyOf(s.Src, s.Dst)
	f := t.flows[k]
	if f == nil {
		if len(t.flows) >= maxFlows {
			t.Dropped++
			return
		}
		f = &flow{tap: s.Tap}
		t.flows[k] = f
		t.order = append(t.order, k)
	}
	if s.Tap != f.tap {
		if !contains(f.SeenOn, s.Tap) {
			f.SeenOn = append(f.SeenOn, s.Tap)
		}
		return
	}
	if len(f.SeenOn) == 0 {
		f.SeenOn = []string{s.Tap}
	}
	f.Packets++
	if !f.known && s.SYN {
		// SYN comes from the client, SYN-ACK from the server
		f.fromA, f.known = srcIsA == !s.ACK, true
	}
	fromClient := isClientPort(s.Src, s.Dst)
	if f.known {
		fromClient = srcIsA == f.fromA
	}
	st := &f.toCli
	if fromClient {
		st = &f.toSrv
	}
	if s.SYN {
		st.seqKnown, st.next = true, s.Seq+1
		return
	}
	payload := s.Payload
	if len(payload) == 0 {
		return
	}
	if !st.seqKnown {
		st.seqKnown, st.next = true, s.Seq
	}
	switch off := int32(s.Seq - st.next); {
	case off < 0: // a retransmission, in whole or in part
		if int(-off) >= len(payload) {
			return
		}
		payload = payload[-off:]
	case off > 0: // a hole: the capture missed a segment
		f.Gaps++
		st.lost = true
	}
	st.next = s.Seq + uint32(len(s.Payload))
	st.feed(payload)
}

// isClientPort guesses, without a handshake, that src is the client: the side with
// the higher (ephemeral) port.
func isClientPort(src, dst netip.AddrPort) bool { return src.Port() > dst.Port() }

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// feed consumes in-order payload of one direction.
func (st *stream) feed(p []byte) {
	st.bytes += int64(len(p))
	if st.kind == kindUnknown {
		st.kind, st.plain = classifyStart(p)
	}
	if st.kind == kindPlain {
		st.plainN += int64(len(p))
		st.keepSample(p)
		return
	}
	if st.lost {
		return // framing unknown past a hole: neither judged good nor bad
	}
	for len(p) > 0 {
		if st.broken {
			st.plainN += int64(len(p))
			st.keepSample(p)
			return
		}
		if st.left > 0 {
			n := min(st.left, len(p))
			st.keepHello(p[:n])
			st.left -= n
			p = p[n:]
			continue
		}
		need := 5 - len(st.hdr)
		n := min(need, len(p))
		st.hdr = append(st.hdr, p[:n]...)
		p = p[n:]
		if len(st.hdr) < 5 {
			return
		}
		typ, major, length := st.hdr[0], st.hdr[1], int(binary.BigEndian.Uint16(st.hdr[3:5]))
		if typ < 20 || typ > 23 || major != 3 || length > 1<<14+2048 {
			st.broken = true // not a TLS record: the bytes from here on are not protected
			st.plainN += 5
			st.keepSample(st.hdr)
			st.hdr = st.hdr[:0]
			continue
		}
		st.hdr = st.hdr[:0]
		st.left = length
		if typ == 22 && !st.helloDone && st.hello == nil {
			st.hello = make([]byte, 0, min(length, maxHello))
			st.helloLen = min(length, maxHello)
		}
	}
}

// sampleLen is how much plaintext a flow keeps as evidence.
const sampleLen = 64

func (st *stream) keepSample(p []byte) {
	if len(st.sample) < sampleLen {
		st.sample += printable(p, sampleLen-len(st.sample))
	}
}

// keepHello collects the body of the first handshake record.
func (st *stream) keepHello(b []byte) {
	if st.hello == nil || st.helloDone {
		return
	}
	n := min(st.helloLen-len(st.hello), len(b))
	st.hello = append(st.hello, b[:n]...)
	if len(st.hello) >= st.helloLen {
		st.helloDone = true
	}
}

// classifyStart decides a direction's kind from its first payload bytes.
func classifyStart(p []byte) (streamKind, Class) {
	if len(p) >= 3 && p[0] >= 20 && p[0] <= 23 && p[1] == 3 {
		return kindTLS, ""
	}
	s := string(p[:min(len(p), 24)])
	if strings.HasPrefix(s, "PRI * HTTP/2.0") {
		return kindPlain, ClassH2C
	}
	if strings.HasPrefix(s, "HTTP/1.") {
		return kindPlain, ClassHTTP
	}
	for _, m := range []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "PATCH ", "OPTIONS ", "CONNECT ", "TRACE "} {
		if strings.HasPrefix(s, m) {
			return kindPlain, ClassHTTP
		}
	}
	return kindPlain, ClassPlaintext
}

func printable(p []byte, n int) string {
	var b strings.Builder
	for _, c := range p {
		if b.Len() >= n {
			break
		}
		if c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		} else if c == '\r' || c == '\n' {
			b.WriteByte(' ')
		} else {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// Flows returns every flow seen, in the order they were first seen.
func (t *Tracker) Flows() []Flow {
	out := make([]Flow, 0, len(t.order))
	for _, k := range t.order {
		f := t.flows[k]
		out = append(out, f.result(k))
	}
	return out
}

func (f *flow) result(k flowKey) Flow {
	r := f.Flow
	r.Client, r.Server = k.a, k.b
	switch {
	case f.known && !f.fromA, !f.known && isClientPort(k.b, k.a):
		r.Client, r.Server = k.b, k.a
	}
	r.Midstream = !f.known
	r.PayloadBytes = f.toSrv.bytes + f.toCli.bytes
	r.PlaintextBytes = f.toSrv.plainN + f.toCli.plainN
	r.SeenOn = append([]string(nil), f.SeenOn...)
	if len(r.SeenOn) > 1 {
		sort.Strings(r.SeenOn[1:])
	}
	switch {
	case f.toSrv.kind == kindUnknown && f.toCli.kind == kindUnknown:
		r.Class = ClassNoPayload
	case f.toSrv.kind == kindPlain:
		r.Class = f.toSrv.plain
	case f.toCli.kind == kindPlain:
		r.Class = f.toCli.plain
	case r.Server.Port() == HBONEPort:
		r.Class = ClassHBONE
	default:
		r.Class = ClassTLS
	}
	if r.Class == ClassHTTP || r.Class == ClassH2C || r.Class == ClassPlaintext {
		r.PlaintextSample = f.toSrv.sample
		if r.PlaintextSample == "" {
			r.PlaintextSample = f.toCli.sample
		}
	} else if r.PlaintextBytes > 0 {
		r.PlaintextSample = f.toSrv.sample + f.toCli.sample
	}
	if ch, ok := parseHello(f.toSrv.hello); ok {
		r.SNI, r.ALPN, r.TLSVersion = ch.sni, ch.alpn, ch.version
	}
	if sh, ok := parseHello(f.toCli.hello); ok && sh.version != "" {
		r.TLSVersion = sh.version // the server's choice
	}
	return r
}
