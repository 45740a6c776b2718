package load

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// SpecVersion is the version of Spec this meshmark writes and reads. A generator
// refuses any other: a field it does not know could change what is measured.
const SpecVersion = 1

// Spec is a Config as it travels to a load generator, in JSON: everything that says
// what load to send, and nothing that only exists in the sender's process (a dial
// function, a client, a callback, an open file). The generator rebuilds those from the
// Spec (Spec.Config): the client from Protocol and Streams, the TLS configuration from
// TLS's PEM material, the dialer from its own rules. The models and the request are
// copied field for field; the round-trip test sets every field of Config to fail if
// one added later does not travel.
type Spec struct {
	// Version is SpecVersion.
	Version int `json:"version"`

	Request RequestSpec `json:"request"`
	// Protocol is the client to build; empty means http1.
	Protocol Protocol `json:"protocol,omitempty"`
	// Streams is how many requests share one connection (h2, h2c, grpc); 0 means 1.
	Streams int `json:"streams,omitempty"`
	// TLS, for https targets: what to verify and what to present.
	TLS *TLSSpec `json:"tls,omitempty"`

	Open   *OpenSpec   `json:"open,omitempty"`
	Closed *ClosedSpec `json:"closed,omitempty"`
	Users  *UsersSpec  `json:"users,omitempty"`

	// Durations are nanoseconds, as Config's.
	Duration         time.Duration `json:"duration_ns,omitempty"`
	Count            int64         `json:"count,omitempty"`
	Warmup           time.Duration `json:"warmup_ns,omitempty"`
	Timeout          time.Duration `json:"timeout_ns,omitempty"`
	Interval         time.Duration `json:"interval_ns,omitempty"`
	DisableKeepAlive bool          `json:"disable_keepalive,omitempty"`
}

// Protocol names the client a Spec's load is sent with.
type Protocol string

// The protocols of `meshmark load --protocol`.
const (
	ProtocolHTTP1 Protocol = "http1" // HTTP/1.1, plaintext or TLS by the URL's scheme
	ProtocolH2    Protocol = "h2"    // HTTP/2 over TLS (ALPN h2)
	ProtocolH2C   Protocol = "h2c"   // HTTP/2 in cleartext with prior knowledge
	ProtocolGRPC  Protocol = "grpc"  // unary gRPC calls over h2c
)

// RequestSpec is Request on the wire; Body travels as base64.
type RequestSpec struct {
	Method string      `json:"method,omitempty"`
	URL    string      `json:"url"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// TLSSpec is the TLS configuration of https targets, its certificates and key as PEM:
// the generator may not see the sender's files.
type TLSSpec struct {
	// Insecure skips verifying the server's certificate.
	Insecure bool `json:"insecure,omitempty"`
	// ServerName is sent (SNI) and verified instead of the URL's host.
	ServerName string `json:"server_name,omitempty"`
	// CAPEM verifies the server against these certificates instead of the system's.
	CAPEM string `json:"ca_pem,omitempty"`
	// CertPEM and KeyPEM are a client certificate and its key, for targets that
	// require one (mTLS).
	CertPEM string `json:"cert_pem,omitempty"`
	KeyPEM  string `json:"key_pem,omitempty"`
}

// OpenSpec is OpenModel on the wire.
type OpenSpec struct {
	Schedule    ScheduleSpec  `json:"schedule"`
	Connections int           `json:"connections,omitempty"`
	MaxInFlight int           `json:"max_in_flight,omitempty"`
	SpinWindow  time.Duration `json:"spin_window_ns,omitempty"`
}

// ClosedSpec is ClosedModel on the wire.
type ClosedSpec struct {
	Connections int     `json:"connections"`
	Rate        float64 `json:"rate,omitempty"`
}

// UsersSpec is UsersModel on the wire.
type UsersSpec struct {
	Users      int        `json:"users"`
	SpawnRate  float64    `json:"spawn_rate,omitempty"`
	Think      ThinkSpec  `json:"think"`
	Tasks      []TaskSpec `json:"tasks,omitempty"`
	Iterations int        `json:"iterations,omitempty"`
	Seed       uint64     `json:"seed,omitempty"`
}

// ThinkSpec is Think on the wire.
type ThinkSpec struct {
	Min         time.Duration `json:"min_ns,omitempty"`
	Max         time.Duration `json:"max_ns,omitempty"`
	Exponential bool          `json:"exponential,omitempty"`
}

// TaskSpec is Task on the wire.
type TaskSpec struct {
	Name    string      `json:"name,omitempty"`
	Weight  int         `json:"weight"`
	Request RequestSpec `json:"request"`
}

// NewSpec is the Spec of cfg's load, sent with the built-in HTTP/1.1 client and
// without TLS material: set Protocol, Streams and TLS for others. cfg's Dial, TLS,
// Client, Progress, RawLog and AllowAnyTarget do not travel.
func NewSpec(cfg Config) Spec {
	s := Spec{
		Version:          SpecVersion,
		Request:          requestSpec(cfg.Request),
		Duration:         cfg.Duration,
		Count:            cfg.Count,
		Warmup:           cfg.Warmup,
		Timeout:          cfg.Timeout,
		Interval:         cfg.Interval,
		DisableKeepAlive: cfg.DisableKeepAlive,
	}
	if o := cfg.Open; o != nil {
		s.Open = new(OpenSpec(*o))
	}
	if c := cfg.Closed; c != nil {
		s.Closed = new(ClosedSpec(*c))
	}
	if u := cfg.Users; u != nil {
		s.Users = &UsersSpec{Users: u.Users, SpawnRate: u.SpawnRate, Iterations: u.Iterations, Seed: u.Seed, Think: ThinkSpec(u.Think)}
		for _, t := range u.Tasks {
			s.Users.Tasks = append(s.Users.Tasks, TaskSpec{Name: t.Name, Weight: t.Weight, Request: requestSpec(t.Request)})
		}
	}
	return s
}

// requestSpec and request convert field for field: a field added to Request stops
// the build until RequestSpec has it too.
func requestSpec(r Request) RequestSpec { return RequestSpec(r) }

func (r RequestSpec) request() Request { return Request(r) }

// ParseSpec reads a Spec from JSON. A version other than SpecVersion, a field this
// meshmark does not know, or anything after the object is refused (json.Unmarshal's check), with the reason:
// a generator must not run a load it only partly understood.
func ParseSpec(data []byte) (Spec, error) {
	var v struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return Spec{}, fmt.Errorf("load spec: %w", err)
	}
	switch {
	case v.Version == nil:
		return Spec{}, fmt.Errorf("load spec: no version (this meshmark reads version %d)", SpecVersion)
	case *v.Version != SpecVersion:
		return Spec{}, fmt.Errorf("load spec version %d: this meshmark reads version %d only; run the driver and the generators from the same meshmark build", *v.Version, SpecVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("load spec version %d: %w", SpecVersion, err)
	}
	return s, nil
}

// Config rebuilds the load the Spec describes, dialing through dial (nil: plain
// dialing from this network namespace): the client of its protocol, its TLS
// configuration, its models. It checks what the Spec alone can be judged by (the
// version, the protocol and its URL, the TLS material); Config.Validate judges the
// rest, the target included.
func (s Spec) Config(dial DialFunc) (Config, error) {
	if s.Version != SpecVersion {
		return Config{}, fmt.Errorf("load spec version %d: this meshmark reads version %d only", s.Version, SpecVersion)
	}
	cfg := Config{
		Request:          s.Request.request(),
		Duration:         s.Duration,
		Count:            s.Count,
		Warmup:           s.Warmup,
		Timeout:          s.Timeout,
		Interval:         s.Interval,
		DisableKeepAlive: s.DisableKeepAlive,
		Dial:             dial,
	}
	if o := s.Open; o != nil {
		cfg.Open = new(OpenModel(*o))
	}
	if c := s.Closed; c != nil {
		cfg.Closed = new(ClosedModel(*c))
	}
	if u := s.Users; u != nil {
		cfg.Users = &UsersModel{Users: u.Users, SpawnRate: u.SpawnRate, Iterations: u.Iterations, Seed: u.Seed, Think: Think(u.Think)}
		for _, t := range u.Tasks {
			cfg.Users.Tasks = append(cfg.Users.Tasks, Task{Name: t.Name, Weight: t.Weight, Request: t.Request.request()})
		}
	}
	tc, err := s.TLS.config()
	if err != nil {
		return cfg, err
	}
	cfg.TLS = tc
	if err := s.client(&cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// client sets cfg.Client for the Spec's protocol (nil, the engine's own HTTP/1.1
// client with its fast paths, for http1) and prepares the request once, so that a
// request the protocol cannot send is refused before the run.
func (s Spec) client(cfg *Config) error {
	streams := s.Streams
	if streams == 0 {
		streams = 1
	}
	if streams < 1 || streams > 1000 {
		return fmt.Errorf("load spec: streams %d: want 1..1000", s.Streams)
	}
	u, err := url.Parse(cfg.Request.URL)
	if err != nil {
		return fmt.Errorf("load spec: target %q: %w", cfg.Request.URL, err)
	}
	opts := ClientOptions{Dial: cfg.Dial, DisableKeepAlive: cfg.DisableKeepAlive, Streams: streams}
	p := s.Protocol
	if p == "" {
		p = ProtocolHTTP1
	}
	if streams > 1 && p == ProtocolHTTP1 {
		return errors.New("load spec: streams > 1 needs a multiplexing protocol (h2, h2c or grpc)")
	}
	switch p {
	case ProtocolHTTP1:
	case ProtocolH2C:
		if u.Scheme != "http" {
			return fmt.Errorf("load spec: protocol h2c is cleartext HTTP/2: want an http:// URL, got %q", cfg.Request.URL)
		}
		cfg.Client = NewH2Client(opts, nil)
	case ProtocolH2:
		if u.Scheme != "https" {
			return fmt.Errorf("load spec: protocol h2 is HTTP/2 over TLS: want an https:// URL, got %q", cfg.Request.URL)
		}
		cfg.Client = NewH2Client(opts, cfg.TLS)
	case ProtocolGRPC:
		if u.Scheme != "http" || u.Port() == "" {
			return fmt.Errorf("load spec: protocol grpc speaks cleartext HTTP/2: want http://host:port/METHOD, got %q", cfg.Request.URL)
		}
		if cfg.DisableKeepAlive {
			return errors.New("load spec: protocol grpc keeps its channel open: disable_keepalive does not apply")
		}
		c, err := NewGRPCClient(opts)
		if err != nil {
			return err
		}
		cfg.Client = c
	default:
		return fmt.Errorf("load spec: protocol %q: want http1, h2, h2c or grpc", s.Protocol)
	}
	if cfg.Client != nil {
		reqs := []Request{cfg.Request}
		if cfg.Users != nil {
			for _, t := range cfg.Users.Tasks {
				reqs = append(reqs, t.Request)
			}
		}
		for _, r := range reqs {
			if _, err := cfg.Client.Prepare(r); err != nil {
				return fmt.Errorf("load spec: %s request %s: %w", p, r.URL, err)
			}
		}
	}
	return nil
}

// config is the client's TLS configuration; nil without a TLSSpec.
func (t *TLSSpec) config() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	tc := &tls.Config{InsecureSkipVerify: t.Insecure, ServerName: t.ServerName}
	if t.CAPEM != "" {
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM([]byte(t.CAPEM)) {
			return nil, errors.New("load spec: tls ca_pem holds no PEM certificate")
		}
	}
	switch {
	case t.CertPEM != "" && t.KeyPEM != "":
		pair, err := tls.X509KeyPair([]byte(t.CertPEM), []byte(t.KeyPEM))
		if err != nil {
			return nil, fmt.Errorf("load spec: tls cert_pem and key_pem: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	case t.CertPEM != "" || t.KeyPEM != "":
		return nil, errors.New("load spec: tls cert_pem and key_pem go together")
	}
	return tc, nil
}
