package load

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/pki"
)

// notTravelling are the fields of Config that exist only in the sender's process; a
// generator rebuilds them (Spec.Config) or sets them itself.
var notTravelling = map[string]bool{
	"Dial": true, "TLS": true, "Client": true, "Progress": true, "RawLog": true,
	"AllowAnyTarget": true, "StreamIntervals": true,
}

// fill sets every settable field of v to a value that is not its zero, recursing into
// structs, pointers to structs and slices (one element), skipping skip's names at the
// top level.
func fill(t *testing.T, v reflect.Value, path string, skip map[string]bool) {
	t.Helper()
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if !f.IsExported() || skip[f.Name] {
				continue
			}
			fill(t, v.Field(i), path+"."+f.Name, nil)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), path, nil)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte("body of " + path))
			return
		}
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(t, s.Index(0), path+"[0]", nil)
		v.Set(s)
	case reflect.Map:
		if v.Type() != reflect.TypeFor[http.Header]() {
			t.Fatalf("%s: a map of %s; teach fill (and Spec) about it", path, v.Type())
		}
		v.Set(reflect.ValueOf(http.Header{"X-Field": {path}}))
	case reflect.String:
		v.SetString("http://198.18.0.1/" + strings.ToLower(strings.ReplaceAll(path, ".", "/")))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(7 + len(path)))
	case reflect.Uint64:
		v.SetUint(uint64(11 + len(path)))
	case reflect.Float64:
		v.SetFloat(1.5 + float64(len(path)))
	default:
		t.Fatalf("%s: a field of kind %s; teach fill (and Spec) about it", path, v.Kind())
	}
}

// Every field of Config and of its models that says what load to send arrives at the
// generator as it was set: a field added to them later fails here, naming it, until
// Spec carries it.
func TestSpecCarriesEveryField(t *testing.T) {
	var cfg Config
	fill(t, reflect.ValueOf(&cfg).Elem(), "Config", notTravelling)
	data, err := json.Marshal(NewSpec(cfg))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ParseSpec(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	got, err := spec.Config(nil)
	if err != nil {
		t.Fatal(err)
	}
	want, gv := reflect.ValueOf(cfg), reflect.ValueOf(got)
	for i := 0; i < want.NumField(); i++ {
		name := want.Type().Field(i).Name
		if notTravelling[name] {
			continue
		}
		if !reflect.DeepEqual(want.Field(i).Interface(), gv.Field(i).Interface()) {
			t.Errorf("Config.%s arrived as %+v, sent %+v", name, gv.Field(i).Interface(), want.Field(i).Interface())
		}
	}
}

// A spec names its version, and a generator refuses another, or anything it does not
// know, with the reason.
func TestParseSpecRefuses(t *testing.T) {
	good, err := json.Marshal(NewSpec(Config{Request: Request{URL: "http://127.0.0.1/"}, Count: 1, Closed: &ClosedModel{Connections: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(good), fmt.Sprintf(`"version":%d`, SpecVersion)) {
		t.Errorf("a spec without its version: %s", good)
	}
	if _, err := ParseSpec(good); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"version":2,"request":{"url":"http://127.0.0.1/"}}`, "load spec version 2: this meshmark reads version 1 only"},
		{`{"request":{"url":"http://127.0.0.1/"}}`, "load spec: no version (this meshmark reads version 1)"},
		{`{"version":1,"request":{"url":"http://127.0.0.1/"},"rate":10}`, `unknown field "rate"`},
		{`{"version":1} {}`, "after top-level value"},
		{`[1]`, "load spec: json: cannot unmarshal array"},
	} {
		if _, err := ParseSpec([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.doc, err, tc.want)
		}
	}
	if _, err := (Spec{Version: 3}).Config(nil); err == nil || !strings.Contains(err.Error(), "load spec version 3") {
		t.Errorf("a spec of another version built: %v", err)
	}
}

// Each protocol rebuilds its own client, and one that cannot carry the spec's request
// is refused before any load.
func TestSpecProtocols(t *testing.T) {
	base := func(url string, p Protocol) Spec {
		s := NewSpec(Config{Request: Request{Method: "GET", URL: url}, Count: 1, Closed: &ClosedModel{Connections: 1}})
		s.Protocol = p
		return s
	}
	for _, tc := range []struct {
		spec   Spec
		client string // the client's type, "" for the engine's own HTTP/1.1 client
		err    string
	}{
		{base("http://127.0.0.1:80/", ""), "", ""},
		{base("http://127.0.0.1:80/", ProtocolHTTP1), "", ""},
		{base("http://127.0.0.1:80/", ProtocolH2C), "*load.h2Client", ""},
		{base("https://127.0.0.1:443/", ProtocolH2), "*load.h2Client", ""},
		{base("http://127.0.0.1:50051/grpc.health.v1.Health/Check", ProtocolGRPC), "*load.grpcClient", ""},
		{base("https://127.0.0.1/", ProtocolH2C), "", "protocol h2c is cleartext HTTP/2"},
		{base("http://127.0.0.1/", ProtocolH2), "", "protocol h2 is HTTP/2 over TLS"},
		{base("http://127.0.0.1/x", ProtocolGRPC), "", "want http://host:port/METHOD"},
		{base("http://127.0.0.1/", "h3"), "", `protocol "h3": want http1, h2, h2c or grpc`},
		{func() Spec { s := base("http://127.0.0.1/", ProtocolHTTP1); s.Streams = 4; return s }(), "", "streams > 1 needs a multiplexing protocol"},
	} {
		cfg, err := tc.spec.Config(nil)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %s: %v, want %q", tc.spec.Protocol, tc.spec.Request.URL, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s %s: %v", tc.spec.Protocol, tc.spec.Request.URL, err)
		case tc.client == "" && cfg.Client != nil, tc.client != "" && fmt.Sprintf("%T", cfg.Client) != tc.client:
			t.Errorf("%s %s: client %T, want %s", tc.spec.Protocol, tc.spec.Request.URL, cfg.Client, tc.client)
		}
	}
}

// The TLS material travels as PEM, and the generator verifies the server and presents
// the client certificate with it: a server that requires a client certificate signed
// by its CA answers the rebuilt load, and refuses it without the certificate.
func TestSpecTLS(t *testing.T) {
	ca, err := pki.NewCA("meshmark.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer([]string{"server.test"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue("spiffe://meshmark.test/client", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := server.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	defer srv.Close()

	run := func(ts *TLSSpec) *Result {
		s := NewSpec(Config{Request: Request{URL: srv.URL}, Count: 3, Closed: &ClosedModel{Connections: 1}, Timeout: 5 * time.Second})
		s.TLS = ts
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseSpec(data)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := back.Config(nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	full := &TLSSpec{ServerName: "server.test", CAPEM: string(ca.CertPEM()), CertPEM: string(client.CertPEM), KeyPEM: string(client.KeyPEM)}
	if res := run(full); res.Succeeded != 3 {
		t.Errorf("with the CA and the client certificate: %d of 3 answered (%v)", res.Succeeded, res.ErrorSamples)
	}
	if res := run(&TLSSpec{ServerName: "server.test", CAPEM: string(ca.CertPEM())}); res.Succeeded != 0 {
		t.Errorf("without the client certificate: %d answered, want the server to refuse", res.Succeeded)
	}
	for _, tc := range []struct {
		ts   TLSSpec
		want string
	}{
		{TLSSpec{CAPEM: "not a certificate"}, "tls ca_pem holds no PEM certificate"},
		{TLSSpec{CertPEM: string(client.CertPEM)}, "tls cert_pem and key_pem go together"},
		{TLSSpec{CertPEM: string(client.CertPEM), KeyPEM: string(server.KeyPEM)}, "tls cert_pem and key_pem:"},
	} {
		s := NewSpec(Config{Request: Request{URL: srv.URL}, Count: 1, Closed: &ClosedModel{Connections: 1}})
		s.TLS = &tc.ts
		if _, err := s.Config(nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.ts, err, tc.want)
		}
	}
}
