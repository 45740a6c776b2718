package load

import (
	"bytes"
	"errors"
	"fmt"

	"golang.org/x/net/http2/hpack"
)

// statusDecoder decodes the HPACK header blocks (RFC 7541) of responses for the HTTP/2
// epoll loop. It keeps the dynamic table in step with the server's encoder and reports
// only what a response's first field says, its :status; once the values repeat and
// its table's entries have buffers, it allocates nothing. x/net's decoder makes a
// string of every field it decodes and keeps its table indexed by name and value:
// about 1.4 µs and 7 allocations per response of nginx, which inserts most of its
// fields in the table; this one takes about 0.3 µs (BenchmarkStatusDecoder).
type statusDecoder struct {
	size int // the table size the server's last size update chose
	used int // sum of the entries' sizes (RFC 7541 4.1)
	// ents is a ring of the table's entries, ents[newest] the one inserted last; an
	// entry takes at least 32 bytes.
	ents   [hpackTableSize / 32]hpackEntry
	newest int
	n      int
	name   bytes.Buffer // a literal's name, Huffman-decoded
	value  bytes.Buffer // a literal's value, Huffman-decoded
	// huff holds short strings as decoded, by their Huffman code: a server sends the
	// same values response after response (nginx: its name, the content's type,
	// length, date and etag), and decoding is most of what a block costs.
	huff map[string][]byte
}

type hpackEntry struct {
	field   []byte // name then value
	nameLen int
}

// hpackTableSize is the most the server's encoder may use: SETTINGS_HEADER_TABLE_SIZE
// is left at its default.
const hpackTableSize = 4096

// The Huffman cache's bounds: strings up to 64 bytes coded, 256 of them.
const (
	hpackHuffMaxLen  = 64
	hpackHuffEntries = 256
)

func newStatusDecoder() *statusDecoder {
	return &statusDecoder{size: hpackTableSize, huff: map[string][]byte{}}
}

var errHpack = errors.New("malformed HPACK header block")

// decode decodes one whole header block. status is the block's first field's value if
// that field is :status with a valid code, else -1 (bad says what came instead), or 0
// for an empty block.
func (d *statusDecoder) decode(b []byte) (status int, bad string, err error) {
	fields := 0
	for len(b) > 0 {
		c := b[0]
		var name, value []byte
		switch {
		case c&0x80 != 0: // indexed field (6.1)
			var idx uint64
			if idx, b, err = hpackInt(b, 7); err != nil {
				return 0, "", err
			}
			if name, value, err = d.at(idx); err != nil {
				return 0, "", err
			}
		case c&0xe0 == 0x20: // dynamic table size update (6.3), only before the fields
			var size uint64
			if size, b, err = hpackInt(b, 5); err != nil {
				return 0, "", err
			}
			if fields > 0 || size > hpackTableSize {
				return 0, "", fmt.Errorf("%w: table size update to %d", errHpack, size)
			}
			d.size = int(size)
			d.evict(0)
			continue
		default: // literal (6.2): with incremental indexing, without, never indexed
			prefix := uint8(4)
			if c&0xc0 == 0x40 {
				prefix = 6
			}
			// the strings are only decoded when the status or the table needs them
			need := fields == 0 || prefix == 6
			var idx uint64
			if idx, b, err = hpackInt(b, prefix); err != nil {
				return 0, "", err
			}
			if idx > 0 {
				if name, _, err = d.at(idx); err != nil {
					return 0, "", err
				}
			} else if name, b, err = d.str(b, &d.name, need); err != nil {
				return 0, "", err
			}
			if value, b, err = d.str(b, &d.value, need); err != nil {
				return 0, "", err
			}
		}
		if fields == 0 {
			status, bad = -1, ""
			if string(name) == ":status" {
				if status = statusCode(value); status < 0 {
					bad = string(value)
				}
			}
		}
		fields++
		if c&0xc0 == 0x40 {
			d.insert(name, value)
		}
	}
	return status, bad, nil
}

// at returns the field at index idx of the static and dynamic tables (2.3.3).
func (d *statusDecoder) at(idx uint64) (name, value []byte, err error) {
	switch {
	case idx == 0:
		return nil, nil, fmt.Errorf("%w: index 0", errHpack)
	case idx <= uint64(len(hpackStatic)):
		e := &hpackStatic[idx-1]
		return e.name, e.value, nil
	case idx-uint64(len(hpackStatic)) <= uint64(d.n):
		e := &d.ents[(d.newest-int(idx-uint64(len(hpackStatic))-1)+len(d.ents))%len(d.ents)]
		return e.field[:e.nameLen], e.field[e.nameLen:], nil
	}
	return nil, nil, fmt.Errorf("%w: index %d beyond the table", errHpack, idx)
}

// insert adds a field to the dynamic table, evicting the oldest to make room; a field
// larger than the table empties it and is not added (4.4).
func (d *statusDecoder) insert(name, value []byte) {
	size := len(name) + len(value) + 32
	if size > d.size {
		d.evict(d.size)
		return
	}
	d.evict(size)
	// name and value may be the entry about to be reused (a field that names an older
	// one): copy through the scratch buffer first
	d.name.Reset()
	d.name.Write(name)
	d.name.Write(value)
	d.newest = (d.newest + 1) % len(d.ents)
	e := &d.ents[d.newest]
	e.field = append(e.field[:0], d.name.Bytes()...)
	e.nameLen = len(name)
	d.n++
	d.used += size
}

// evict drops the oldest entries until room more bytes fit.
func (d *statusDecoder) evict(room int) {
	for d.n > 0 && d.used+room > d.size {
		e := &d.ents[(d.newest-d.n+1+len(d.ents))%len(d.ents)]
		d.used -= len(e.field) + 32
		d.n--
	}
}

// hpackInt decodes an integer with an n-bit prefix (5.1).
func hpackInt(b []byte, n uint8) (uint64, []byte, error) {
	mask := uint64(1)<<n - 1
	v := uint64(b[0]) & mask
	b = b[1:]
	if v < mask {
		return v, b, nil
	}
	for shift := uint(0); len(b) > 0 && shift < 63; shift += 7 {
		c := b[0]
		b = b[1:]
		v += uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, b, nil
		}
	}
	return 0, nil, fmt.Errorf("%w: integer cut short or too large", errHpack)
}

// str decodes a string literal (5.2), a Huffman-coded one into buf unless it is in
// d.huff; with decode false it only skips it.
func (d *statusDecoder) str(b []byte, buf *bytes.Buffer, decode bool) (s, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("%w: string missing", errHpack)
	}
	huffman := b[0]&0x80 != 0
	n, b, err := hpackInt(b, 7)
	if err != nil {
		return nil, nil, err
	}
	if n > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: string longer than the block", errHpack)
	}
	s, rest = b[:n], b[n:]
	if !huffman || !decode {
		return s, rest, nil
	}
	if v, ok := d.huff[string(s)]; ok {
		return v, rest, nil
	}
	buf.Reset()
	if _, err := hpack.HuffmanDecode(buf, s); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errHpack, err)
	}
	if len(s) <= hpackHuffMaxLen {
		if len(d.huff) == hpackHuffEntries {
			clear(d.huff) // values that keep changing: start over
		}
		d.huff[string(s)] = bytes.Clone(buf.Bytes())
	}
	return buf.Bytes(), rest, nil
}

// statusCode parses a 3-digit status code; -1 if v is not one.
func statusCode(v []byte) int {
	if len(v) != 3 || v[0] < '1' || v[0] > '9' {
		return -1
	}
	code := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return -1
		}
		code = code*10 + int(c-'0')
	}
	return code
}

// hpackStatic is the static table (RFC 7541 Appendix A) as byte slices, so that
// looking a field up allocates nothing; of the values only the statuses can matter here.
var hpackStatic = func() (t [len(hpackStaticNames)]struct{ name, value []byte }) {
	for i, n := range hpackStaticNames {
		t[i].name = []byte(n)
	}
	for i, v := range hpackStaticStatus {
		t[7+i].value = []byte(v)
	}
	return t
}()

var hpackStaticNames = [...]string{
	":authority", ":method", ":method", ":path", ":path", ":scheme", ":scheme",
	":status", ":status", ":status", ":status", ":status", ":status", ":status",
	"accept-charset", "accept-encoding", "accept-language", "accept-ranges", "accept",
	"access-control-allow-origin", "age", "allow", "authorization", "cache-control",
	"content-disposition", "content-encoding", "content-language", "content-length",
	"content-location", "content-range", "content-type", "cookie", "date", "etag",
	"expect", "expires", "from", "host", "if-match", "if-modified-since",
	"if-none-match", "if-range", "if-unmodified-since", "last-modified", "link",
	"location", "max-forwards", "proxy-authenticate", "proxy-authorization", "range",
	"referer", "refresh", "retry-after", "server", "set-cookie",
	"strict-transport-security", "transfer-encoding", "user-agent", "vary", "via",
	"www-authenticate",
}

// hpackStaticStatus are the values of static entries 8 to 14.
var hpackStaticStatus = [...]string{"200", "204", "206", "304", "400", "404", "500"}
