package load

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// TestStatusDecoderAgrees: block after block of x/net's encoder, with fields that fill
// and evict the table, fields too large for it, size updates and never-indexed fields,
// the decoder finds the status x/net's decoder finds. Statuses outside the static table
// are inserted and then referenced in the dynamic table, so a table out of step with
// the encoder's shows as a wrong status or an error.
func TestStatusDecoderAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	ref := hpack.NewDecoder(hpackTableSize, nil)
	d := newStatusDecoder()
	statuses := []string{"200", "204", "503", "429", "201", "302", "404", "100"}
	names := []string{"server", "date", "content-type", "etag", "x-custom", "x-trace-id", "set-cookie", "vary"}
	text := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(0x20 + rng.IntN(0x5f))
		}
		return string(b)
	}
	for i := range 20000 {
		if rng.IntN(300) == 0 {
			enc.SetMaxDynamicTableSize(uint32(rng.IntN(hpackTableSize + 1)))
		}
		if rng.IntN(300) == 0 {
			enc.SetMaxDynamicTableSize(hpackTableSize)
		}
		buf.Reset()
		fields := []hpack.HeaderField{{Name: ":status", Value: statuses[rng.IntN(len(statuses))]}}
		for range rng.IntN(7) {
			n := rng.IntN(40)
			if rng.IntN(50) == 0 {
				n = 5000 // larger than the table: empties it
			}
			fields = append(fields, hpack.HeaderField{Name: names[rng.IntN(len(names))], Value: text(n), Sensitive: rng.IntN(10) == 0})
		}
		for _, f := range fields {
			enc.WriteField(f)
		}
		want, err := ref.DecodeFull(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		status, bad, err := d.decode(buf.Bytes())
		if err != nil || strconv.Itoa(status) != want[0].Value || bad != "" {
			t.Fatalf("block %d (% x): status %d %q, %v; want %s", i, buf.Bytes(), status, bad, err, want[0].Value)
		}
	}
}

func TestStatusDecoderRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		block  []byte
		status int
		bad    string
	}{
		{"not a status first", []byte{0x82, 0x88}, -1, ""},           // :method GET
		{"bad status", []byte{0x08, 0x03, 'a', 'b', 'c'}, -1, "abc"}, // :status literal
		{"two-digit status", []byte{0x08, 0x02, '9', '9'}, -1, "99"},
		{"empty", nil, 0, ""},
	} {
		status, bad, err := newStatusDecoder().decode(tc.block)
		if err != nil || status != tc.status || bad != tc.bad {
			t.Errorf("%s: %d %q %v; want %d %q", tc.name, status, bad, err, tc.status, tc.bad)
		}
	}
	for name, block := range map[string][]byte{
		"index 0":                   {0x80},
		"index beyond the table":    {0xbe}, // 62, with an empty dynamic table
		"string cut short":          {0x08, 0x05, '2', '0'},
		"integer cut short":         {0xff},
		"size update too large":     {0x3f, 0xe2, 0x1f}, // 4097
		"size update after a field": {0x88, 0x20},
		"bad Huffman":               {0x08, 0x81, 0xff},
	} {
		if _, _, err := newStatusDecoder().decode(block); !errors.Is(err, errHpack) {
			t.Errorf("%s: %v, want a malformed block", name, err)
		}
	}
}

func BenchmarkStatusDecoder(b *testing.B) {
	// nginx's response headers, each inserted into the table as nginx does
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{{":status", "200"}, {"server", "nginx/1.22.1"}, {"date", "Tue, 24 Nov 2026 19:45:29 GMT"},
		{"content-type", "text/html"}, {"content-length", "612"}, {"last-modified", "Tue, 24 Nov 2026 19:44:22 GMT"},
		{"etag", "\"6b05e916-264\""}, {"accept-ranges", "bytes"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := buf.Bytes()
	d := newStatusDecoder()
	b.ReportAllocs()
	for b.Loop() {
		if status, _, err := d.decode(block); status != 200 || err != nil {
			b.Fatal(status, err)
		}
	}
}

// FuzzStatusDecoder: whatever a server sends, the decoder returns an error or a result,
// never panics, and blocks that reference the table it built stay in range.
func FuzzStatusDecoder(f *testing.F) {
	f.Add([]byte{0x88}, []byte{0xbe})
	f.Add([]byte{0x48, 0x03, '5', '0', '3'}, []byte{0xbe})
	f.Add([]byte{0x3f, 0xe1, 0x1f, 0x40, 0x01, 'a', 0x01, 'b'}, []byte{0x20, 0xbe})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		d := newStatusDecoder()
		for _, block := range [][]byte{a, b, a} {
			status, _, err := d.decode(block)
			if err == nil && status != 0 && status != -1 && (status < 100 || status > 999) {
				t.Fatalf("status %d", status)
			}
			if d.used > d.size || d.n > len(d.ents) {
				t.Fatalf("table holds %d bytes in %d entries, size %d", d.used, d.n, d.size)
			}
		}
	})
}
