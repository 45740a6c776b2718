package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/csv"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestLoadCommandBadInputExitsTwo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	for _, args := range [][]string{
		{"load"},
		{"load", "http://8.8.8.8/"},
		{"load", "http://example.com/"},
		{"load", "ftp://127.0.0.1/"},
		{"load", srv.URL, "--rate", "abc"},
		{"load", srv.URL, "--rate", "10", "--poisson", "10"},
		{"load", srv.URL, "--steps", "1:2:3"},
		{"load", srv.URL, "--ramp", "x:1"},
		{"load", srv.URL, "--format", "xml"},
		{"load", srv.URL, "-H", "no colon"},
		{"load", srv.URL, "--users", "2", "--think", "5s-1s"},
		{"load", srv.URL, "--no-such-flag"},
		{"load", srv.URL, "--rate", "10", "--limit", "5"},
		{"load", srv.URL, "--protocol", "h3"},
		{"load", srv.URL, "--protocol", "h2"},
		{"load", srv.URL, "--grpc-method", "/grpc.health.v1.Health/Check"},
		{"load", srv.URL, "--protocol", "h2c", "--grpc-method", "/a.B/C"},
		{"load", "https://127.0.0.1:8443/", "--protocol", "h2c"},
		{"load", srv.URL, "--protocol", "grpc", "--no-keepalive"},
		{"load", srv.URL, "--protocol", "grpc", "-m", "POST"},
		{"load", srv.URL, "--protocol", "grpc", "--grpc-method", "NoSlash"},
		{"load", srv.URL, "--protocol", "grpc", "--grpc-method", "/a.B/C/D"},
		{"load", srv.URL + "/a.B/C", "--protocol", "grpc"},
		{"load", srv.URL + "/?x=1", "--protocol", "grpc"},
		{"load", "http://127.0.0.1/", "--protocol", "grpc"},
		{"load", "https://127.0.0.1:8443/", "--protocol", "grpc"},
		{"load", "http://8.8.8.8:50051/", "--protocol", "grpc"},
		{"load", srv.URL, "--protocol", "grpc", "-H", "grpc-timeout: 1S"},
		{"load", srv.URL, "--streams", "4"},
		{"load", srv.URL, "--protocol", "h2c", "--streams", "0"},
		{"load", srv.URL, "--protocol", "h2c", "--streams", "4", "--no-keepalive"},
		{"load", srv.URL, "--rate", "10", "--spin", "sometimes"},
		{"load", srv.URL, "--rate", "10", "--spin", "-5us"},
		{"load", srv.URL, "--spin", "100us"},
		{"load", srv.URL, "--max-inflight", "5"},
	} {
		if code := Main(args); code != 2 {
			t.Errorf("meshmark %v: exit code %d, want 2", args, code)
		}
	}
}

// TestLoadCommandProtocols runs h2c and gRPC from the command line against servers that
// only count what arrives over HTTP/2.
func TestLoadCommandProtocols(t *testing.T) {
	var h2 atomic.Int64
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2.Add(1)
		}
	}))
	hs.Config.Protocols = p
	hs.Start()
	defer hs.Close()
	res := loadJSON(t, hs.URL, "--protocol", "h2c", "-c", "2", "-n", "30")
	if res.Succeeded != 30 || h2.Load() != 30 {
		t.Errorf("h2c: ok %d, HTTP/2 requests served %d; want 30, 30", res.Succeeded, h2.Load())
	}
	res = loadJSON(t, hs.URL, "--protocol", "h2c", "-c", "4", "--streams", "4", "-n", "40")
	if res.Succeeded != 40 || res.Health.Connections != 1 {
		t.Errorf("h2c -c 4 --streams 4: ok %d over %d connections; want 40 over 1", res.Succeeded, res.Health.Connections)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return h(ctx, req)
	}))
	hc := health.NewServer()
	hc.SetServingStatus("probe", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hc)
	go gs.Serve(ln)
	defer gs.Stop()
	target := "http://" + ln.Addr().String()
	res = loadJSON(t, target, "--protocol", "grpc", "-c", "2", "-n", "30")
	if res.Succeeded != 30 || res.StatusCodes[200] != 30 || calls.Load() != 30 || res.Target != target+load.HealthCheckMethod {
		t.Errorf("grpc health check: ok %d, codes %v, server calls %d, target %q; errors %v", res.Succeeded, res.StatusCodes, calls.Load(), res.Target, res.ErrorSamples)
	}
	// the request message from a file, sent as is: HealthCheckRequest{service: "probe"}
	body := filepath.Join(t.TempDir(), "req.bin")
	if err := os.WriteFile(body, []byte("\x0a\x05probe"), 0o644); err != nil {
		t.Fatal(err)
	}
	res = loadJSON(t, target+"/", "--protocol", "grpc", "--grpc-method", "grpc.health.v1.Health/Check", "--body-file", body, "-n", "5")
	if res.Succeeded != 5 {
		t.Errorf("grpc with a request message: ok %d, errors %v", res.Succeeded, res.ErrorSamples)
	}
	res = loadJSONAllFailed(t, target, "--protocol", "grpc", "--body", "\x0a\x04nope", "-n", "5")
	if res.Errors.Non2xx != 5 || res.StatusCodes[404] != 5 {
		t.Errorf("grpc health check of an unknown service: errors %+v, codes %v", res.Errors, res.StatusCodes)
	}
}

func TestLoadCommandWritesJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "yes" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "run.json")
	if code := Main([]string{"load", srv.URL, "-c", "2", "-n", "40", "-H", "X-Probe: yes", "--format", "json", "-o", out}); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	res := readResult(t, out)
	if res.Succeeded != 40 || res.Latency.TotalCount() != 40 {
		t.Fatalf("succeeded %d, latencies %d, errors %+v", res.Succeeded, res.Latency.TotalCount(), res.Errors)
	}
}

// loadJSON runs `meshmark load` with args and returns its result.
func loadJSON(t *testing.T, args ...string) *load.Result {
	t.Helper()
	out := filepath.Join(t.TempDir(), "run.json")
	if s, code, err := execResults(t, append(append([]string{"load"}, args...), "--format", "json", "-o", out)...); code != 0 {
		t.Fatalf("meshmark load %v: exit code %d, %v\n%s", args, code, err, s)
	}
	res := readResult(t, out)
	return res
}

// loadJSONAllFailed runs a load in which no request succeeds: meshmark load still
// writes its result, and exits 1 saying so.
func loadJSONAllFailed(t *testing.T, args ...string) *load.Result {
	t.Helper()
	out := filepath.Join(t.TempDir(), "run.json")
	s, code, err := execResults(t, append(append([]string{"load"}, args...), "--format", "json", "-o", out)...)
	if code != 1 || err == nil || !strings.Contains(err.Error(), "no request succeeded") {
		t.Fatalf("meshmark load %v: exit code %d, %v; want 1, saying no request succeeded\n%s", args, code, err, s)
	}
	return readResult(t, out)
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func TestLoadCommandHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	res := loadJSONAllFailed(t, srv.URL, "-c", "1", "-n", "3")
	if res.Errors.Other != 3 || len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], "certificate") {
		t.Errorf("untrusted server: errors %+v %v, want 3 of kind other mentioning the certificate", res.Errors, res.ErrorSamples)
	}
	ca := writeFile(t, "ca.pem", certPEM(srv.Certificate()))
	for _, args := range [][]string{
		{"--cacert", ca},
		{"-k"},
		{"--cacert", ca, "--no-keepalive"},
		{"--cacert", ca, "--rate", "200", "-d", "500ms"},
		// httptest's certificate is for example.com as well as 127.0.0.1
		{"--cacert", ca, "--servername", "example.com"},
	} {
		res := loadJSON(t, append([]string{srv.URL, "-c", "2", "-n", "40"}, args...)...)
		if res.Succeeded == 0 || res.Succeeded != res.Completed || res.Errors.Total() != 0 {
			t.Errorf("%v: succeeded %d of %d, errors %+v %v", args, res.Succeeded, res.Completed, res.Errors, res.ErrorSamples)
		}
	}
	res = loadJSONAllFailed(t, srv.URL, "-n", "2", "--cacert", ca, "--servername", "other.example")
	if res.Errors.Other != 2 {
		t.Errorf("--servername the certificate does not carry: errors %+v %v", res.Errors, res.ErrorSamples)
	}
}

// TestLoadCommandH2: --protocol h2 speaks HTTP/2 over TLS, verified with the TLS flags,
// on exactly -c connections.
func TestLoadCommandH2(t *testing.T) {
	var h2, conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			h2.Add(1)
		}
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	ca := writeFile(t, "ca.pem", certPEM(srv.Certificate()))
	res := loadJSON(t, srv.URL, "--protocol", "h2", "--cacert", ca, "-c", "2", "-n", "50")
	if res.Succeeded != 50 || h2.Load() != 50 || conns.Load() != 2 {
		t.Errorf("succeeded %d, %d over HTTP/2, %d connections; want 50, 50, 2 (errors %+v %v)", res.Succeeded, h2.Load(), conns.Load(), res.Errors, res.ErrorSamples)
	}
	if res := loadJSONAllFailed(t, srv.URL, "--protocol", "h2", "-n", "2"); res.Errors.Other != 2 {
		t.Errorf("h2 without the CA: errors %+v %v, want 2 certificate failures", res.Errors, res.ErrorSamples)
	}
}

// TestLoadCommandMTLS: a target that requires a client certificate refuses a client
// without one and serves one with --cert/--key (or --cert alone on a combined file).
func TestLoadCommandMTLS(t *testing.T) {
	ca, err := pki.NewCA("mtls.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("spiffe://mtls.test/meshmark", 0)
	if err != nil {
		t.Fatal(err)
	}
	var peers atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, err := ca.PeerID(r.TLS.PeerCertificates); err == nil && id == leaf.ID {
			peers.Add(1)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	srv.StartTLS()
	defer srv.Close()
	serverCA := writeFile(t, "server.pem", certPEM(srv.Certificate()))
	certFile := writeFile(t, "client.pem", leaf.CertPEM)
	keyFile := writeFile(t, "client.key", leaf.KeyPEM)
	both := writeFile(t, "both.pem", append(append([]byte(nil), leaf.CertPEM...), leaf.KeyPEM...))

	res := loadJSONAllFailed(t, srv.URL, "-c", "1", "-n", "3", "--cacert", serverCA)
	if res.Succeeded != 0 || res.Errors.Total() != 3 || peers.Load() != 0 {
		t.Errorf("no client certificate: succeeded %d, errors %+v %v; want 3 failures", res.Succeeded, res.Errors, res.ErrorSamples)
	}
	for _, args := range [][]string{{"--cert", certFile, "--key", keyFile}, {"--cert", both}} {
		peers.Store(0)
		res := loadJSON(t, append([]string{srv.URL, "-c", "2", "-n", "20", "--cacert", serverCA}, args...)...)
		if res.Succeeded != 20 || peers.Load() != 20 {
			t.Errorf("%v: succeeded %d, server saw the client's identity %d times; want 20, 20; errors %+v %v",
				args, res.Succeeded, peers.Load(), res.Errors, res.ErrorSamples)
		}
	}
}

func TestLoadCommandBadTLSFlags(t *testing.T) {
	dir := t.TempDir()
	garbage := writeFile(t, "garbage.pem", []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--cacert", missing}, missing},
		{[]string{"--cacert", garbage}, garbage},
		{[]string{"--cert", garbage}, garbage},
		{[]string{"--cert", missing}, missing},
		{[]string{"--cert", garbage, "--key", missing}, missing},
		{[]string{"--key", garbage}, "--key needs --cert"},
	} {
		args := append([]string{"load", "https://127.0.0.1:1/", "-n", "1"}, c.args...)
		_, code, err := execResults(t, args...)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("meshmark %v: exit code %d, error %v; want 2 and an error naming %s", args, code, err, c.want)
		}
	}
	_, code, err := execResults(t, "load", "http://127.0.0.1:1/", "-n", "1", "-k")
	if code != 2 || err == nil || !strings.Contains(err.Error(), "https://") {
		t.Errorf("-k on an http:// URL: exit code %d, error %v", code, err)
	}
}

// execLoad runs one meshmark command line under ctx, as Main would, and returns what it
// printed, its exit code and error.
func execLoad(ctx context.Context, args ...string) (string, int, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return out.String(), code, err
}

// rawLogRows checks that path is a raw log and returns its rows.
func rawLogRows(t *testing.T, path string) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), load.RawLogHeader) {
		t.Fatalf("%s does not start with the raw log header: %.100q", path, data)
	}
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs[1:]
}

// onlyFiles fails unless dir holds exactly names: no temporary file may be left over.
func onlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

func TestLoadCommandRawLog(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("hello"))
	}))
	defer srv.Close()
	dir := t.TempDir()
	raw, out := filepath.Join(dir, "raw.csv"), filepath.Join(dir, "run.json")
	printed, code, err := execLoad(context.Background(), "load", srv.URL, "-c", "2", "-n", "50", "--raw", raw, "--format", "json", "-o", out)
	if code != 0 {
		t.Fatalf("exit code %d: %v\n%s", code, err, printed)
	}
	rows := rawLogRows(t, raw)
	if len(rows) != 50 {
		t.Fatalf("%d rows, want 50", len(rows))
	}
	for _, r := range rows {
		if r[4] != "200" || r[5] != "none" || r[6] != "5" || r[7] != "false" {
			t.Fatalf("row %q", r)
		}
	}
	if !strings.Contains(printed, "raw log: "+raw+", 50 rows, times in ns from ") {
		t.Errorf("stderr does not give the log's time origin:\n%s", printed)
	}
	onlyFiles(t, dir, "raw.csv", "run.json")

	// A file that cannot be created stops the command before any load is sent.
	served.Store(0)
	for _, bad := range []struct{ raw, want string }{
		{filepath.Join(dir, "missing", "raw.csv"), "no such file or directory"},
		{dir, "is a directory"},
		{out, "-o names the same file"},
	} {
		_, code, err := execLoad(context.Background(), "load", srv.URL, "-n", "5", "--raw", bad.raw, "-o", out)
		if code != 2 || err == nil || !strings.Contains(err.Error(), "--raw "+bad.raw+": ") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--raw %s: exit code %d, error %v; want 2 naming the file and %q", bad.raw, code, err, bad.want)
		}
	}
	if n := served.Load(); n != 0 {
		t.Errorf("%d requests sent although the raw log could not be created", n)
	}
	onlyFiles(t, dir, "raw.csv", "run.json")
}

// TestLoadCommandRawLogInterrupted: an interrupted run still names its log FILE, with a
// row for every request the partial result counts.
func TestLoadCommandRawLogInterrupted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	raw, out := filepath.Join(dir, "raw.csv"), filepath.Join(dir, "run.json")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, _, err := execLoad(ctx, "load", srv.URL, "--rate", "100", "-d", "1m", "--raw", raw, "--format", "json", "-o", out)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the interruption", err)
	}
	res := readResult(t, out)
	if rows := rawLogRows(t, raw); !res.Incomplete || res.Completed < 10 || int64(len(rows)) != res.Completed {
		t.Errorf("incomplete %v, completed %d, %d rows; want a row per completed request", res.Incomplete, res.Completed, len(rows))
	}
	onlyFiles(t, dir, "raw.csv", "run.json")
}

// TestRawFileIncomplete: a log that misses rows is removed, not named FILE, and the
// error says which file and why.
func TestRawFileIncomplete(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "raw.csv")
	r, err := createRawFile(path, "")
	if err != nil {
		t.Fatal(err)
	}
	r.f.WriteString(load.RawLogHeader + "1,2,,3,,refused,0,false\n")
	err = r.finish(&load.RawLogStatus{Rows: 1, Lost: 5, Error: "writing failed after 1 rows: no space left on device"})
	if err == nil || !strings.Contains(err.Error(), "raw log "+path+" not written: writing failed after 1 rows") {
		t.Errorf("error %v", err)
	}
	onlyFiles(t, dir)
}

// TestLoadCommandRawLogWriteFails runs meshmark in a child process whose files may not
// grow past 64 KiB (as on a full disk): the run completes and its result is printed,
// but the log is not created and the command fails, naming it.
func TestLoadCommandRawLogWriteFails(t *testing.T) {
	if args := os.Getenv("MESHMARK_TEST_LOAD_ARGS"); args != "" {
		os.Exit(Main(strings.Split(args, "\n")))
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw.csv")
	cmd := exec.Command(prlimit, "--fsize=65536", os.Args[0], "-test.run=^TestLoadCommandRawLogWriteFails$")
	cmd.Env = append(os.Environ(), "MESHMARK_TEST_LOAD_ARGS="+strings.Join([]string{"load", srv.URL, "-c", "2", "-n", "3000", "--raw", raw}, "\n"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want code 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "completed 3000  ok 3000") || !strings.Contains(stdout.String(), "WARNING: raw log: writing failed") {
		t.Errorf("the result must be printed whole, with a warning:\n%s", stdout.String())
	}
	if want := "raw log " + raw + " not written: writing failed after "; !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "file too large") {
		t.Errorf("stderr does not say %q ... file too large:\n%s", want, stderr.String())
	}
	onlyFiles(t, dir)
}

// readResult reads the JSON result meshmark load wrote to path.
func readResult(t *testing.T, path string) *load.Result {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := load.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
