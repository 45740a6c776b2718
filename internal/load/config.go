package load

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"time"
)

// Config is one load run. Exactly one of Open, Closed and Users is set.
type Config struct {
	Request Request // what open and closed models send

	Open   *OpenModel   `json:"open,omitempty"`
	Closed *ClosedModel `json:"closed,omitempty"`
	Users  *UsersModel  `json:"users,omitempty"`

	Duration time.Duration // 0: until Count requests (open with steps: until the last step)
	Count    int64         // stop after this many requests have been sent after Warmup (0: no limit)
	Warmup   time.Duration // requests intended before this offset stay out of the totals
	Timeout  time.Duration // per request, dial included; 0 means 30 s
	Interval time.Duration // histogram interval; 0 means 1 s

	DisableKeepAlive bool
	Dial             DialFunc    // nil: plain dialing from this network namespace
	TLS              *tls.Config // for https targets; see ClientOptions.TLS
	Client           Client      // nil: the built-in HTTP/1.1 client

	// Progress, when set, is called after every interval from a goroutine of the engine;
	// it must return quickly.
	Progress func(Progress)
	// StreamIntervals hands every interval whole to Progress only: Result.Intervals
	// keep each one's figures (which judging the run reads: in-flight counts,
	// percentiles) but not its histograms. A generator that streams its intervals to
	// its driver sets it, so that its memory grows by the figures of an interval, not by
	// its histograms.
	StreamIntervals bool `json:"-"`

	// RawLog, when set, receives every recorded request as a CSV row (see RawLogHeader),
	// written in large chunks from a goroutine of the engine; Run returns after the last
	// write and does not close it. If a write fails the log stops there and the run goes
	// on: Result.RawLog and Result.Warnings say what is missing. One writer per run.
	RawLog io.Writer `json:"-"`

	// AllowAnyTarget lifts the safety rule that only loopback and 198.18.0.0/15 are
	// loaded; set only for targets the user owns (e.g. in-cluster service addresses).
	AllowAnyTarget bool
}

// OpenModel sends at intended times whatever the responses do.
type OpenModel struct {
	Schedule ScheduleSpec
	// Connections are opened up front; more are added while every one is busy.
	Connections int
	// MaxInFlight caps concurrent requests (= connections); 0 means 10 000. A send that
	// finds the cap reached waits and is counted as late.
	MaxInFlight int
	// SpinWindow is how long before each send the generator stops sleeping and spins,
	// because waking from sleep takes tens of microseconds (more in a VM). 0 learns it
	// from the machine's own wake-ups; negative never spins (saves CPU, costs send lag).
	// Only the built-in HTTP/1.1 keep-alive client's event loop spins.
	SpinWindow time.Duration
}

// ClosedModel keeps Connections requests in flight, each sent as soon as the previous
// one on its connection completed.
type ClosedModel struct {
	Connections int
	Rate        float64 // optional overall limit, requests per second; 0: as fast as possible
}

// UsersModel runs Locust-like users: each picks a task by weight, sends it, thinks,
// and repeats.
type UsersModel struct {
	Users      int
	SpawnRate  float64 // users started per second; 0: all at once
	Think      Think
	Tasks      []Task // empty: Config.Request with weight 1
	Iterations int    // tasks per user before it stops; 0: until the run ends
	Seed       uint64
}

// Task is one weighted user action.
type Task struct {
	Name    string
	Weight  int
	Request Request
}

// Think is a user's pause between tasks.
type Think struct {
	Min, Max time.Duration
	// Exponential draws with mean (Min+Max)/2 instead of uniformly in [Min, Max].
	Exponential bool
}

// Progress is the last interval of a running load, for live display and export.
type Progress struct {
	Interval Interval
	Elapsed  time.Duration
	Total    time.Duration // 0 when the run has no fixed length
	InFlight int64
}

const (
	defaultTimeout     = 30 * time.Second
	defaultInterval    = time.Second
	defaultMaxInFlight = 10000
)

func (c *Config) withDefaults() Config {
	d := *c
	if d.Timeout <= 0 {
		d.Timeout = defaultTimeout
	}
	if d.Interval <= 0 {
		d.Interval = defaultInterval
	}
	if d.Request.Method == "" {
		d.Request.Method = "GET"
	}
	if d.Open != nil {
		o := *d.Open
		if o.MaxInFlight <= 0 {
			o.MaxInFlight = max(defaultMaxInFlight, o.Connections)
		}
		if o.Connections <= 0 {
			o.Connections = 1
		}
		d.Open = &o
		if d.Duration == 0 && o.Schedule.Arrival == Steps {
			d.Duration = o.Schedule.StepsLength()
		}
	}
	if d.Users != nil && len(d.Users.Tasks) == 0 {
		u := *d.Users
		u.Tasks = []Task{{Name: "request", Weight: 1, Request: d.Request}}
		d.Users = &u
	}
	return d
}

// Validate reports the first problem with c, naming the field.
func (c *Config) Validate() error {
	d := c.withDefaults()
	models := 0
	for _, set := range []bool{d.Open != nil, d.Closed != nil, d.Users != nil} {
		if set {
			models++
		}
	}
	if models != 1 {
		return fmt.Errorf("config: exactly one of open, closed and users must be set, got %d", models)
	}
	if d.Duration < 0 || d.Count < 0 || d.Warmup < 0 {
		return fmt.Errorf("config: duration, count and warmup must not be negative")
	}
	if d.Duration == 0 && d.Count == 0 && !(d.Users != nil && d.Users.Iterations > 0) {
		return fmt.Errorf("config: set a duration or a count, the run would not end")
	}
	targets := []Request{d.Request}
	switch {
	case d.Open != nil:
		if err := d.Open.Schedule.Validate(d.Duration); err != nil {
			return err
		}
		if d.Open.Connections > d.Open.MaxInFlight {
			return fmt.Errorf("config open: connections (%d) exceed max in flight (%d)", d.Open.Connections, d.Open.MaxInFlight)
		}
	case d.Closed != nil:
		if d.Closed.Connections <= 0 {
			return fmt.Errorf("config closed: connections must be at least 1, got %d", d.Closed.Connections)
		}
		if d.Closed.Rate < 0 {
			return fmt.Errorf("config closed: rate must not be negative")
		}
	case d.Users != nil:
		u := d.Users
		if u.Users <= 0 {
			return fmt.Errorf("config users: users must be at least 1, got %d", u.Users)
		}
		if u.SpawnRate < 0 || u.Iterations < 0 {
			return fmt.Errorf("config users: spawn rate and iterations must not be negative")
		}
		if u.Think.Min < 0 || u.Think.Max < u.Think.Min {
			return fmt.Errorf("config users: think time range %v-%v is invalid", u.Think.Min, u.Think.Max)
		}
		targets = targets[:0]
		for i, t := range u.Tasks {
			if t.Weight <= 0 {
				return fmt.Errorf("config users: task %d (%s): weight must be positive, got %d", i, t.Name, t.Weight)
			}
			targets = append(targets, t.Request)
		}
	}
	if !d.AllowAnyTarget {
		for _, r := range targets {
			if err := CheckTarget(r.URL); err != nil {
				return err
			}
		}
	}
	return nil
}

// benchmarkRange is 198.18.0.0/15, reserved for network benchmarks (RFC 2544).
var benchmarkRange = netip.MustParsePrefix("198.18.0.0/15")

// CheckTarget enforces meshmark's safety rule: load goes only to loopback addresses or to
// 198.18.0.0/15, never to someone else's service by accident. The host must be an IP
// literal or "localhost".
func CheckTarget(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("target %q: %w", rawURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("target %q: want an http:// or https:// URL", rawURL)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("target %q: no host", rawURL)
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != p {
			return fmt.Errorf("target %q: bad port %q", rawURL, p)
		}
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		if net.ParseIP(host) == nil {
			return fmt.Errorf("target %q: host %q is a name; only loopback or 198.18.0.0/15 addresses are allowed (use --allow-any-target for a target you own)", rawURL, host)
		}
		return fmt.Errorf("target %q: bad address %q", rawURL, host)
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || benchmarkRange.Contains(ip) {
		return nil
	}
	return fmt.Errorf("target %q: %s is neither loopback nor in 198.18.0.0/15; refusing to load it (use --allow-any-target for a target you own)", rawURL, ip)
}
