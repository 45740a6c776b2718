package cli

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/spf13/cobra"
)

func init() {
	register(newLoadCommand)
}

type loadFlags struct {
	rate, poisson      float64
	steps, ramp        string
	limit              float64
	connections        int
	count              int64
	duration, warmup   time.Duration
	timeout, interval  time.Duration
	users              int
	spawnRate          float64
	think              string
	iterations         int
	tasks              []string
	noKeepAlive        bool
	method             string
	headers            []string
	body, bodyFile     string
	maxInFlight        int
	spin               string
	format, output     string
	raw                string
	progress, allowAny bool
	seed               uint64
	insecure           bool
	caCert, cert, key  string
	serverName         string
	protocol           string
	streams            int
	grpcMethod         string
	generators         []string
}

func newLoadCommand() *cobra.Command {
	var f loadFlags
	c := &cobra.Command{
		Use:   "load URL",
		Short: "Drive HTTP or gRPC load at a URL: open (rate, Poisson, steps, ramp), closed or user model",
		Long: `Drive load at one URL and report latency measured from each request's intended
send time (free of coordinated omission), service time, errors and the generator's own
health.

Protocols (--protocol): http1 (default) is HTTP/1.1, plaintext for http:// URLs or TLS
for https:// ones (see HTTPS below). h2c is HTTP/2 in cleartext with prior knowledge,
as h2load and curl --http2-prior-knowledge speak it; h2 is HTTP/2 over TLS (ALPN h2,
the TLS flags apply). Each of the -c connections carries one request at a time
(h2load -c N -m 1). grpc makes unary gRPC calls over cleartext HTTP/2, one channel
(connection) per -c; the URL is http://host:port, --grpc-method names the call (default
` + load.HealthCheckMethod + `, the standard health check, which counts as
failed unless the server answers SERVING), and --body or --body-file is the request
message as serialised protobuf, sent as is. gRPC statuses are reported as the HTTP
statuses that stand for them (OK 200, Unavailable 503, Unimplemented 501, NotFound 404,
DeadlineExceeded 504, ...); the exact code and message of failures appear among the
error samples. -H headers are sent as gRPC metadata.

Models: --rate/--poisson/--steps/--ramp select the open model (sends at scheduled times
whatever responses do); --users selects Locust-like users; otherwise the closed model
keeps -c connections busy (optionally capped with --limit). To send on time, the open
model spins instead of sleeping through the last stretch before each send, since a
sleeping thread wakes tens of microseconds late (more in a VM); --spin auto learns the
stretch from the machine's own wake-ups, --spin off saves that CPU at the cost of send
lag. The time spent spinning is reported apart and left out of the CPU per request.

HTTPS: the server's certificate is verified against the system's roots, or --cacert's
(-k skips verification), for the URL's host name or IP address, which is also the SNI
as with curl; --servername overrides both. --cert and --key present a client
certificate to targets that require one (mTLS). A TLS handshake counts in the time of
the request that opened the connection; connections resume the TLS session of earlier
ones, so --no-keepalive pays a resumed handshake per request, as a real client would.

--raw FILE also writes every request as one CSV row, for analyses of your own:
intended_ns,sent_ns,first_byte_ns,done_ns,status,error_kind,bytes_in,warmup. Times are
nanoseconds from the run's start (the JSON result's "start", also printed on stderr);
first_byte_ns and status are empty when no response arrived; warm-up requests are
included with warmup=true; rows come in about completion order. FILE appears when the
run ends, also after an interrupt (with a row for every request recorded until then);
if it could not be written completely it is not created, and the command exits 1 after
writing the result. See docs/load.md.

Only loopback and 198.18.0.0/15 targets are allowed unless --allow-any-target.`,
		Example: `  meshmark load http://127.0.0.1:8080/ --rate 1000 -d 30s
  meshmark load http://127.0.0.1:8080/ -c 16 -n 100000 --format json -o run.json
  meshmark load http://127.0.0.1:8080/ --rate 500 -d 1m --raw requests.csv
  meshmark load http://198.18.0.10/ --steps 100:1000:100:10s --format csv
  meshmark load http://127.0.0.1:8080/ --users 50 --spawn-rate 5 --think 1s-10s -d 2m
  meshmark load https://127.0.0.1:8443/ --cacert ca.pem --cert client.pem --key client.key
  meshmark load http://127.0.0.1:8080/ --protocol h2c -c 16 -d 30s
  meshmark load http://127.0.0.1:50051 --protocol grpc --rate 500 -d 30s
  meshmark load http://127.0.0.1:50051 --protocol grpc --grpc-method /echo.Echo/Say --body-file req.bin`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return withExitCode(2, fmt.Errorf("load: want exactly one URL, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(f.generators) > 0 {
				// The generators judge the target by their own rules.
				f.allowAny = true
			}
			spec, err := f.spec(cmd, args[0])
			if err != nil {
				return withExitCode(2, err)
			}
			// Built here for the remote run too, so that a load the generators would
			// refuse is a usage error before any of them is reached.
			cfg, err := spec.Config(nil)
			if err == nil {
				cfg.AllowAnyTarget = f.allowAny
				err = cfg.Validate()
			}
			if err != nil {
				return withExitCode(2, err)
			}
			if len(f.generators) > 0 {
				return runRemoteLoad(cmd, f, spec)
			}
			return runLoad(cmd, cfg, f)
		},
	}
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withExitCode(2, err) })
	f.addFlags(c)
	c.Flags().StringSliceVar(&f.generators, "generators", nil, "drive these `meshmark generator`s (host:port,...) instead of loading from here; each sends its share and the results merge exactly")
	return c
}

// addFlags defines the flags that describe a load.
func (f *loadFlags) addFlags(c *cobra.Command) {
	fl := c.Flags()
	fl.Float64Var(&f.rate, "rate", 0, "open model: constant rate, requests per second")
	fl.Float64Var(&f.poisson, "poisson", 0, "open model: Poisson arrivals at this mean rate")
	fl.StringVar(&f.steps, "steps", "", "open model: from:to:step:each, e.g. 100:1000:100:10s")
	fl.StringVar(&f.ramp, "ramp", "", "open model: linear ramp from:to requests per second over -d")
	fl.Float64Var(&f.limit, "limit", 0, "closed model: overall rate limit, requests per second")
	fl.IntVarP(&f.connections, "connections", "c", 0, "closed: connections (default 10); open: connections opened up front")
	fl.Int64VarP(&f.count, "requests", "n", 0, "stop after this many requests")
	fl.DurationVarP(&f.duration, "duration", "d", 0, "run length (default 10s unless -n is given)")
	fl.DurationVar(&f.warmup, "warmup", 0, "leave requests intended in this first part out of the results")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "per-request timeout, connect included")
	fl.DurationVar(&f.interval, "interval", time.Second, "histogram interval")
	fl.IntVar(&f.users, "users", 0, "user model: number of users")
	fl.Float64Var(&f.spawnRate, "spawn-rate", 0, "user model: users started per second (0: all at once)")
	fl.StringVar(&f.think, "think", "0s", "user model: think time, 2s, 1s-10s or exp:1s-10s")
	fl.IntVar(&f.iterations, "iterations", 0, "user model: requests per user (0: until the end)")
	fl.StringArrayVar(&f.tasks, "task", nil, "user model: a task NAME:WEIGHT:/PATH or NAME:WEIGHT:METHOD:/PATH on the URL's host, drawn by weight (repeatable; default: the URL itself)")
	fl.BoolVar(&f.noKeepAlive, "no-keepalive", false, "a new connection per request")
	fl.StringVarP(&f.method, "method", "m", "GET", "HTTP method")
	fl.StringArrayVarP(&f.headers, "header", "H", nil, "request header 'Name: value' (repeatable)")
	fl.StringVar(&f.body, "body", "", "request body")
	fl.StringVar(&f.bodyFile, "body-file", "", "read the request body from this file")
	fl.IntVar(&f.maxInFlight, "max-inflight", 0, "open model: cap on requests in flight (default 10000)")
	fl.StringVar(&f.spin, "spin", "auto", "open model: spin instead of sleeping this long before each send (auto: learnt from the machine's wake-up latency; off; or a duration)")
	fl.StringVar(&f.format, "format", "table", "output format: table, json or csv")
	fl.StringVarP(&f.output, "output", "o", "", "write the result to this file instead of stdout")
	fl.StringVar(&f.raw, "raw", "", "also write every request as a CSV row to this file")
	fl.BoolVar(&f.progress, "progress", false, "print a progress line every interval even when stderr is not a terminal")
	fl.BoolVar(&f.allowAny, "allow-any-target", false, "allow targets outside loopback and 198.18.0.0/15 (only ones you own)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed for Poisson arrivals and user choices")
	fl.BoolVarP(&f.insecure, "insecure", "k", false, "https: do not verify the server's certificate")
	fl.StringVar(&f.caCert, "cacert", "", "https: verify the server against the PEM certificates in this file instead of the system's")
	fl.StringVar(&f.cert, "cert", "", "https: client certificate (PEM), for targets that require one")
	fl.StringVar(&f.key, "key", "", "https: private key (PEM) of --cert (default: read from the --cert file)")
	fl.StringVar(&f.serverName, "servername", "", "https: server name to send (SNI) and verify instead of the URL's host")
	fl.StringVar(&f.protocol, "protocol", "http1", "http1, h2 (HTTP/2 over TLS), h2c (HTTP/2 cleartext, prior knowledge) or grpc (unary calls over h2c)")
	fl.IntVar(&f.streams, "streams", 1, "h2, h2c, grpc: requests in flight per connection; -c 64 --streams 8 is 64 in flight over 8 connections (h2load -c 8 -m 8)")
	fl.StringVar(&f.grpcMethod, "grpc-method", "", "grpc: full method name, /package.Service/Method (default "+load.HealthCheckMethod+")")
}

// spec turns the flags into the load they describe, as it runs here or travels to
// generators: usage errors name the flag.
func (f *loadFlags) spec(cmd *cobra.Command, url string) (load.Spec, error) {
	var spec load.Spec
	cfg := load.Config{
		Request:          load.Request{Method: f.method, URL: url, Header: http.Header{}},
		Duration:         f.duration,
		Count:            f.count,
		Warmup:           f.warmup,
		Timeout:          f.timeout,
		Interval:         f.interval,
		DisableKeepAlive: f.noKeepAlive,
	}
	switch f.format {
	case "table", "json", "csv":
	default:
		return spec, fmt.Errorf("--format %q: want table, json or csv", f.format)
	}
	if !f.allowAny {
		if err := load.CheckTarget(url); err != nil {
			return spec, err
		}
	}
	tc, err := f.tlsSpec(url)
	if err != nil {
		return spec, err
	}
	for _, h := range f.headers {
		if err := load.ParseHeader(cfg.Request.Header, h); err != nil {
			return spec, fmt.Errorf("-H: %w", err)
		}
	}
	if f.bodyFile != "" {
		if f.body != "" {
			return spec, errors.New("--body and --body-file are exclusive")
		}
		b, err := os.ReadFile(f.bodyFile)
		if err != nil {
			return spec, fmt.Errorf("--body-file: %w", err)
		}
		cfg.Request.Body = b
	} else if f.body != "" {
		cfg.Request.Body = []byte(f.body)
	}
	protocol, err := f.protocolRequest(cmd, &cfg.Request)
	if err != nil {
		return spec, err
	}
	fl := cmd.Flags()
	var open []load.ScheduleSpec
	if fl.Changed("rate") {
		open = append(open, load.ScheduleSpec{Arrival: load.Constant, Rate: f.rate})
	}
	if fl.Changed("poisson") {
		open = append(open, load.ScheduleSpec{Arrival: load.Poisson, Rate: f.poisson, Seed: f.seed})
	}
	if fl.Changed("steps") {
		s, err := load.ParseSteps(f.steps)
		if err != nil {
			return spec, err
		}
		open = append(open, s)
	}
	if fl.Changed("ramp") {
		s, err := load.ParseRamp(f.ramp)
		if err != nil {
			return spec, err
		}
		open = append(open, s)
	}
	if len(open) > 1 {
		return spec, errors.New("choose one of --rate, --poisson, --steps and --ramp")
	}
	if f.connections < 0 || f.maxInFlight < 0 || f.users < 0 {
		return spec, errors.New("-c, --max-inflight and --users must not be negative")
	}
	if len(open) == 0 && (fl.Changed("spin") || fl.Changed("max-inflight")) {
		return spec, errors.New("--spin and --max-inflight are for the open model (--rate, --poisson, --steps or --ramp)")
	}
	if len(f.tasks) > 0 && f.users == 0 {
		return spec, errors.New("--task is for the user model (--users)")
	}
	switch {
	case f.users > 0:
		if len(open) > 0 || fl.Changed("limit") {
			return spec, errors.New("--users cannot be combined with --rate, --poisson, --steps, --ramp or --limit")
		}
		think, err := load.ParseThink(f.think)
		if err != nil {
			return spec, err
		}
		cfg.Users = &load.UsersModel{Users: f.users, SpawnRate: f.spawnRate, Think: think, Iterations: f.iterations, Seed: f.seed}
		for _, t := range f.tasks {
			task, err := load.ParseTask(t, cfg.Request)
			if err != nil {
				return spec, err
			}
			cfg.Users.Tasks = append(cfg.Users.Tasks, task)
		}
	case len(open) == 1:
		if fl.Changed("limit") {
			return spec, errors.New("--limit is for the closed model; the open model's rate is --rate")
		}
		spin, err := parseSpin(f.spin)
		if err != nil {
			return spec, err
		}
		cfg.Open = &load.OpenModel{Schedule: open[0], Connections: f.connections, MaxInFlight: f.maxInFlight, SpinWindow: spin}
	default:
		n := f.connections
		if n == 0 {
			n = 10
		}
		cfg.Closed = &load.ClosedModel{Connections: n, Rate: f.limit}
	}
	if cfg.Duration == 0 && cfg.Count == 0 && f.iterations == 0 && !(cfg.Open != nil && cfg.Open.Schedule.Arrival == load.Steps) {
		cfg.Duration = 10 * time.Second
	}
	spec = load.NewSpec(cfg)
	spec.Protocol, spec.TLS = protocol, tc
	if f.streams > 1 {
		spec.Streams = f.streams
	}
	return spec, nil
}

// parseSpin reads --spin: auto is 0 (learn the window), off is negative (never spin).
func parseSpin(v string) (time.Duration, error) {
	switch v {
	case "auto", "":
		return 0, nil
	case "off":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > time.Second {
		return 0, fmt.Errorf("--spin %q: want auto, off or a duration up to 1s such as 100us", v)
	}
	return d, nil
}

// tlsSpec turns the TLS flags into the TLS material the load carries, checked here so
// that an error names the flag and the file; nil when none is set.
func (f *loadFlags) tlsSpec(target string) (*load.TLSSpec, error) {
	if !f.insecure && f.caCert == "" && f.cert == "" && f.key == "" && f.serverName == "" {
		return nil, nil
	}
	// On a plaintext URL the flags would be silently useless: the user probably meant
	// https, and a benchmark of the wrong protocol is worse than an error.
	if u, err := neturl.Parse(target); err != nil || u.Scheme != "https" {
		return nil, fmt.Errorf("-k, --cacert, --cert, --key and --servername are for https:// targets, not %q", target)
	}
	ts := &load.TLSSpec{Insecure: f.insecure, ServerName: f.serverName}
	if f.caCert != "" {
		b, err := os.ReadFile(f.caCert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate in the file", f.caCert)
		}
		ts.CAPEM = string(b)
	}
	if f.key != "" && f.cert == "" {
		return nil, errors.New("--key needs --cert")
	}
	if f.cert != "" {
		keyFile := f.key
		if keyFile == "" {
			keyFile = f.cert // as curl: the key may follow the certificate in one file
		}
		certPEM, err := os.ReadFile(f.cert)
		if err != nil {
			return nil, fmt.Errorf("--cert: %w", err)
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return nil, fmt.Errorf("--cert %s, --key %s: %w", f.cert, keyFile, err)
		}
		ts.CertPEM, ts.KeyPEM = string(certPEM), string(keyPEM)
	}
	return ts, nil
}

// protocolRequest checks the flags that depend on --protocol and returns the protocol
// the load is sent with. For grpc the method becomes the URL's path, which is where
// gRPC puts it on the wire and where the gRPC client looks for it.
func (f *loadFlags) protocolRequest(cmd *cobra.Command, req *load.Request) (load.Protocol, error) {
	fl := cmd.Flags()
	if f.protocol != "grpc" && fl.Changed("grpc-method") {
		return "", errors.New("--grpc-method needs --protocol grpc")
	}
	switch {
	case f.streams < 1 || f.streams > 1000:
		return "", fmt.Errorf("--streams %d: want 1..1000", f.streams)
	case f.streams > 1 && f.protocol == "http1":
		return "", errors.New("--streams needs a multiplexing protocol (--protocol h2, h2c or grpc): HTTP/1.1 carries one request at a time per connection")
	case f.streams > 1 && f.noKeepAlive:
		return "", errors.New("--streams cannot share a connection that --no-keepalive closes after every request")
	}
	u, err := neturl.Parse(req.URL)
	if err != nil {
		return "", fmt.Errorf("target %q: %w", req.URL, err)
	}
	switch f.protocol {
	case "http1":
		return load.ProtocolHTTP1, nil
	case "h2c":
		if u.Scheme != "http" {
			return "", fmt.Errorf("--protocol h2c is cleartext HTTP/2: want an http:// URL, got %q", req.URL)
		}
		return load.ProtocolH2C, nil
	case "h2":
		if u.Scheme != "https" {
			return "", fmt.Errorf("--protocol h2 is HTTP/2 over TLS: want an https:// URL (h2c for http://), got %q", req.URL)
		}
		return load.ProtocolH2, nil
	case "grpc":
		switch {
		case fl.Changed("method"):
			return "", errors.New("--method does not apply to --protocol grpc: gRPC calls are POSTs; name the call with --grpc-method")
		case f.noKeepAlive:
			return "", errors.New("--no-keepalive does not apply to --protocol grpc: gRPC clients keep their channel open, a channel per call would measure channel setup")
		case u.Scheme != "http":
			return "", fmt.Errorf("--protocol grpc speaks cleartext HTTP/2: want http://host:port, got %q", req.URL)
		case u.Port() == "":
			return "", fmt.Errorf("--protocol grpc: want http://host:port with a port, got %q", req.URL)
		case u.Path != "" && u.Path != "/":
			return "", fmt.Errorf("--protocol grpc: the URL %q has a path; name the call with --grpc-method instead", req.URL)
		case u.RawQuery != "" || u.Fragment != "":
			return "", fmt.Errorf("--protocol grpc: the URL %q has a query or fragment, which gRPC has no use for", req.URL)
		}
		m := f.grpcMethod
		if m == "" {
			m = load.HealthCheckMethod
		}
		if !strings.HasPrefix(m, "/") {
			m = "/" + m
		}
		u.Path = m
		req.URL = u.String()
		req.Method = "POST"
		return load.ProtocolGRPC, nil
	}
	return "", fmt.Errorf("--protocol %q: want http1, h2, h2c or grpc", f.protocol)
}

func runLoad(cmd *cobra.Command, cfg load.Config, f loadFlags) error {
	stderr := cmd.ErrOrStderr()
	tty := isTerminal(stderr)
	if tty || f.progress {
		cfg.Progress = func(p load.Progress) {
			if tty {
				fmt.Fprintf(stderr, "\r\033[K%s", load.ProgressLine(p))
			} else {
				fmt.Fprintln(stderr, load.ProgressLine(p))
			}
		}
	}
	var raw *rawFile
	if f.raw != "" {
		var err error
		if raw, err = createRawFile(f.raw, f.output); err != nil {
			return withExitCode(2, err)
		}
		defer raw.abandon()
		cfg.RawLog = raw.f
	}
	res, runErr := load.Run(cmd.Context(), cfg)
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if res == nil {
		return runErr
	}
	var rawErr error
	if raw != nil {
		if rawErr = raw.finish(res.RawLog); rawErr == nil {
			fmt.Fprintf(stderr, "raw log: %s, %d rows, times in ns from %s\n", f.raw, res.RawLog.Rows, res.Start.Format(time.RFC3339Nano))
		}
	}
	if err := writeResult(cmd, res, f.format, f.output); err != nil {
		return errors.Join(err, rawErr)
	}
	if f.format != "table" && f.output != "" {
		for _, w := range res.Warnings {
			fmt.Fprintln(stderr, "warning:", w)
		}
	}
	return errors.Join(rawErr, runErr, noneSucceeded(res))
}

// noneSucceeded fails a run in which no request succeeded, after its result is written:
// it measured nothing of the target but that it did not serve, which exit status 0 and
// "0 errors" (every send dropped behind a lookup that never answered) would hide.
func noneSucceeded(res *load.Result) error {
	if res.Incomplete || res.Completed > res.Errors.Total() {
		return nil
	}
	e := res.Errors
	msg := fmt.Sprintf("no request succeeded: %d completed, %d failed (lookup %d, refused %d, reset %d, timeout %d, non-2xx %d, other %d), %d sends dropped",
		res.Completed, e.Total(), e.Lookup, e.Refused, e.Reset, e.Timeout, e.Non2xx, e.Other, res.Health.Dropped)
	if len(res.ErrorSamples) > 0 {
		msg += "; e.g. " + res.ErrorSamples[0]
	}
	return withExitCode(1, errors.New(msg))
}

// writeResult writes res in format (table, json or csv) to output, or to stdout when
// output is empty.
func writeResult(cmd *cobra.Command, res *load.Result, format, output string) error {
	var buf bytes.Buffer
	var err error
	switch format {
	case "json":
		err = load.WriteJSON(&buf, res)
	case "csv":
		err = load.WriteCSV(&buf, res)
	default:
		err = load.WriteTable(&buf, res)
	}
	if err != nil {
		return err
	}
	if output == "" {
		_, err = cmd.OutOrStdout().Write(buf.Bytes())
		return err
	}
	return writeFileAtomic(output, buf.Bytes())
}

// rawFile is --raw. The log is written to a temporary file beside FILE and renamed to
// FILE when the run ends, so that FILE never names a log cut short by a crash or a failed
// write. An interrupted run's log is renamed all the same: it holds a row for every
// request its (incomplete) result counts.
type rawFile struct {
	path     string
	f        *os.File
	finished bool
}

func createRawFile(path, output string) (*rawFile, error) {
	if output != "" && filepath.Clean(output) == filepath.Clean(path) {
		return nil, fmt.Errorf("--raw %s: -o names the same file", path)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, fmt.Errorf("--raw %s: is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, fmt.Errorf("--raw %s: %w", path, err)
	}
	return &rawFile{path: path, f: f}, nil
}

// finish names the log FILE if it holds every recorded request, and removes it if not:
// a log missing rows would bias any analysis made of it.
func (r *rawFile) finish(st *load.RawLogStatus) error {
	r.finished = true
	err := r.f.Close()
	switch {
	case st != nil && !st.Complete():
		err = errors.New(st.Error)
	case err == nil:
		if err = os.Rename(r.f.Name(), r.path); err == nil {
			return nil
		}
	}
	os.Remove(r.f.Name())
	return fmt.Errorf("raw log %s not written: %w", r.path, err)
}

// abandon removes the temporary file of a run that did not start.
func (r *rawFile) abandon() {
	if !r.finished {
		r.f.Close()
		os.Remove(r.f.Name())
	}
}

// writeFileAtomic never leaves a half-written result behind.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
