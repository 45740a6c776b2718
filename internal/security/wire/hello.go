package wire

import "encoding/binary"

// helloInfo is what a ClientHello or ServerHello says about the connection.
type helloInfo struct {
	sni     string
	alpn    []string
	version string // the highest a client offers, or the one a server chose
}

var tlsVersions = map[uint16]string{0x0300: "SSL 3.0", 0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: "TLS 1.2", 0x0304: "TLS 1.3"}

// parseHello reads a handshake record's body holding a ClientHello (type 1) or a
// ServerHello (type 2). It never panics on malformed or truncated input; ok is false
// when the body is not a hello it can read.
func parseHello(b []byte) (h helloInfo, ok bool) {
	r := reader{b: b}
	typ := r.u8()
	r.u24() // handshake length; the body may be truncated at maxHello
	legacy := r.u16()
	r.skip(32) // random
	r.skip(int(r.u8()))
	switch typ {
	case 1:
		r.skip(int(r.u16())) // cipher suites
		r.skip(int(r.u8()))  // compression methods
	case 2:
		r.skip(2) // cipher suite
		r.skip(1) // compression method
	default:
		return h, false
	}
	if r.bad {
		return h, false
	}
	h.version = tlsVersions[legacy]
	exts := reader{b: r.bytes(int(r.u16()))}
	var best uint16
	for !exts.bad && len(exts.b) >= 4 {
		et := exts.u16()
		body := reader{b: exts.bytes(int(exts.u16()))}
		switch et {
		case 0: // server_name
			list := reader{b: body.bytes(int(body.u16()))}
			for !list.bad && len(list.b) > 0 {
				nt := list.u8()
				name := list.bytes(int(list.u16()))
				if nt == 0 && !list.bad {
					h.sni = string(name)
				}
			}
		case 16: // application_layer_protocol_negotiation
			list := reader{b: body.bytes(int(body.u16()))}
			for !list.bad && len(list.b) > 0 {
				p := list.bytes(int(list.u8()))
				if !list.bad {
					h.alpn = append(h.alpn, string(p))
				}
			}
		case 43: // supported_versions: a list in a ClientHello, the choice in a ServerHello
			if typ == 2 {
				best = body.u16()
			} else {
				list := reader{b: body.bytes(int(body.u8()))}
				for !list.bad && len(list.b) >= 2 {
					if v := list.u16(); tlsVersions[v] != "" && v > best {
						best = v
					}
				}
			}
		}
	}
	if v, known := tlsVersions[best]; known {
		h.version = v
	}
	return h, true
}

// reader reads big-endian fields and remembers running out of bytes.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) skip(n int) { r.bytes(n) }

func (r *reader) u8() uint8 {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u24() uint32 {
	if b := r.bytes(3); b != nil {
		return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
	}
	return 0
}
