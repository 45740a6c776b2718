package mesh

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// MTLSMode is how workloads authenticate each other.
type MTLSMode string

const (
	// MTLSDefault means the profile's own default (Istio's sidecar: permissive).
	MTLSDefault    MTLSMode = ""
	MTLSOff        MTLSMode = "off"
	MTLSPermissive MTLSMode = "permissive" // accept mTLS and plaintext; send mTLS inside the mesh
	MTLSStrict     MTLSMode = "strict"     // accept only mTLS from the mesh's CA
)

// CircuitBreakers selects the proxy's connection and request limits.
type CircuitBreakers string

const (
	// CircuitBreakersUnlimited sets every threshold to 2^32-1, as Istio does out of the
	// box, so limits never shape the measurement.
	CircuitBreakersUnlimited CircuitBreakers = "unlimited"
	// CircuitBreakersProxyDefault leaves the proxy's built-in limits (Envoy: 1024).
	CircuitBreakersProxyDefault CircuitBreakers = "proxy-default"
)

// Options are the knobs a study file sets per mesh. Zero values of the pointer-free
// fields are never meaningful defaults, so ParseOptions fills every field.
type Options struct {
	MTLS MTLSMode
	// Concurrency is the number of proxy worker threads (Envoy --concurrency).
	Concurrency int
	// Telemetry keeps the proxy's full per-request statistics; off keeps only the
	// counters the enrollment check needs, to attribute the cost of stats.
	Telemetry bool
	// RequestID makes the proxy generate x-request-id on every request.
	RequestID bool
	// AccessLog writes one line per request to the proxy's log (Istio's default: off).
	AccessLog bool
	// Retries keeps the proxy's default retry policy (Istio: 2 retries on connect
	// failure, refused stream and 503), which can hide errors from the load generator.
	Retries         bool
	CircuitBreakers CircuitBreakers
	// MeshClients enrolls client pods (the load generator) too. Auto means: only when
	// mTLS is strict, because an unmeshed client cannot reach a strict service.
	MeshClients Tristate
	// TrustDomain of workload identities.
	TrustDomain string
	// Own holds the raw values of the profile's own options (Registration.Own), for
	// its factory to parse with OwnWord, OwnBool and OwnInt.
	Own map[string]any
}

// Tristate is auto, on or off.
type Tristate string

const (
	Auto Tristate = "auto"
	On   Tristate = "on"
	Off  Tristate = "off"
)

// DefaultOptions mirror what a stock Istio sidecar does, because users compare stock
// meshes; options switch features off so their cost can be attributed.
func DefaultOptions() Options {
	return Options{
		MTLS:            MTLSDefault,
		Concurrency:     2,
		Telemetry:       true,
		RequestID:       true,
		AccessLog:       false,
		Retries:         true,
		CircuitBreakers: CircuitBreakersUnlimited,
		MeshClients:     Auto,
		TrustDomain:     "cluster.local",
	}
}

// optionKeys documents every accepted key, for error messages.
var optionKeys = map[string]string{
	"mtls":             "off (or disabled) | permissive | strict",
	"concurrency":      "proxy worker threads, 1..64",
	"telemetry":        "on | off",
	"request_id":       "on | off",
	"access_log":       "on | off",
	"retries":          "on | off (Istio retries failed requests twice)",
	"circuit_breakers": "off or unlimited (every limit 2^32-1, as Istio) | default or proxy-default (Envoy's own limits, 1024)",
	"mesh_clients":     "auto | on | off",
	"trust_domain":     "SPIFFE trust domain, e.g. cluster.local",
}

// OptionDoc describes one study-file option.
type OptionDoc struct {
	Key, Values, Default string
}

// OptionDocs lists every option with its accepted values and default, sorted by key.
func OptionDocs() []OptionDoc {
	d := DefaultOptions()
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	defaults := map[string]string{
		"mtls":             "profile's own (envoy-sidecar: permissive, istio-ambient: permissive, none: off)",
		"concurrency":      strconv.Itoa(d.Concurrency),
		"telemetry":        onOff(d.Telemetry),
		"request_id":       onOff(d.RequestID),
		"access_log":       onOff(d.AccessLog),
		"retries":          onOff(d.Retries),
		"circuit_breakers": string(d.CircuitBreakers),
		"mesh_clients":     string(d.MeshClients) + " (on exactly when mtls is strict)",
		"trust_domain":     d.TrustDomain,
	}
	out := make([]OptionDoc, 0, len(optionKeys))
	for k, v := range optionKeys {
		out = append(out, OptionDoc{Key: k, Values: v, Default: defaults[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// OptionError names the offending option; the study loader adds file and line.
type OptionError struct {
	Key string
	Msg string
}

func (e *OptionError) Error() string { return fmt.Sprintf("option %q: %s", e.Key, e.Msg) }

// ParseOptions reads the options map of a study file (values as YAML decodes them:
// strings, bools, ints, floats). Unknown keys and bad values are errors naming the key.
func ParseOptions(raw map[string]any) (Options, error) {
	o := DefaultOptions()
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys) // report the first bad key deterministically
	for _, k := range keys {
		v := raw[k]
		bad := func(format string, args ...any) error {
			return &OptionError{Key: k, Msg: fmt.Sprintf(format, args...) + " (want " + optionKeys[k] + ")"}
		}
		switch k {
		case "mtls":
			s, err := word(v)
			if err != nil {
				// YAML may decode a bare off/false as a bool.
				if b, berr := boolean(v); berr == nil && !b {
					s = "off"
				} else {
					return o, bad("%v", err)
				}
			}
			switch s {
			case "disabled", "disable", "false", "none": // Istio says DISABLE
				s = "off"
			}
			switch MTLSMode(s) {
			case MTLSOff, MTLSPermissive, MTLSStrict:
				o.MTLS = MTLSMode(s)
			default:
				return o, bad("unknown mode %q", s)
			}
		case "concurrency":
			n, err := integer(v)
			if err != nil {
				return o, bad("%v", err)
			}
			if n < 1 || n > 64 {
				return o, bad("%d out of range", n)
			}
			o.Concurrency = int(n)
		case "telemetry", "request_id", "access_log", "retries":
			b, err := boolean(v)
			if err != nil {
				return o, bad("%v", err)
			}
			switch k {
			case "telemetry":
				o.Telemetry = b
			case "request_id":
				o.RequestID = b
			case "retries":
				o.Retries = b
			default:
				o.AccessLog = b
			}
		case "circuit_breakers":
			s, err := word(v)
			if err != nil {
				// YAML turns a bare off into false.
				if b, berr := boolean(v); berr == nil && !b {
					s = "off"
				} else {
					return o, bad("%v", err)
				}
			}
			switch s {
			case "unlimited", "off":
				o.CircuitBreakers = CircuitBreakersUnlimited
			case "proxy-default", "default":
				o.CircuitBreakers = CircuitBreakersProxyDefault
			default:
				return o, bad("unknown value %q", s)
			}
		case "mesh_clients":
			if s, err := word(v); err == nil && s == "auto" {
				o.MeshClients = Auto
				continue
			}
			b, err := boolean(v)
			if err != nil {
				return o, bad("%v", err)
			}
			o.MeshClients = Off
			if b {
				o.MeshClients = On
			}
		case "trust_domain":
			s, err := word(v)
			if err != nil || s == "" || strings.ContainsAny(s, "/:@ ") || strings.ToLower(s) != s {
				return o, bad("invalid trust domain %v", v)
			}
			o.TrustDomain = s
		default:
			known := make([]string, 0, len(optionKeys))
			for k := range optionKeys {
				known = append(known, k)
			}
			sort.Strings(known)
			return o, &OptionError{Key: k, Msg: "unknown option (known: " + strings.Join(known, ", ") + ")"}
		}
	}
	return o, nil
}

// ParseOptionsFor reads a study file's options for one profile: the common ones as
// ParseOptions does, the profile's own ones into Options.Own. A common option the
// profile declares unsupported, or a key nobody knows, is an *OptionError.
func ParseOptionsFor(reg Registration, raw map[string]any) (Options, error) {
	common := map[string]any{}
	own := map[string]any{}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if why, ok := reg.Unsupported[k]; ok {
			return DefaultOptions(), &OptionError{Key: k, Msg: fmt.Sprintf("not supported by %s: %s", reg.Name, why)}
		}
		switch _, isCommon := optionKeys[k]; {
		case isCommon:
			common[k] = raw[k]
		case reg.Own[k] != "":
			own[k] = raw[k]
		default:
			known := make([]string, 0, len(optionKeys)+len(reg.Own))
			for k := range optionKeys {
				if _, no := reg.Unsupported[k]; !no {
					known = append(known, k)
				}
			}
			for k := range reg.Own {
				known = append(known, k)
			}
			sort.Strings(known)
			return DefaultOptions(), &OptionError{Key: k, Msg: fmt.Sprintf("unknown option for %s (known: %s)", reg.Name, strings.Join(known, ", "))}
		}
	}
	o, err := ParseOptions(common)
	if err != nil {
		return o, err
	}
	o.Own = own
	return o, nil
}

// OwnWord returns the profile option key as one of allowed (def when unset).
func (o Options) OwnWord(key, def string, allowed ...string) (string, error) {
	v, ok := o.Own[key]
	if !ok {
		return def, nil
	}
	s, err := word(v)
	if err != nil {
		if b, berr := boolean(v); berr == nil { // YAML decodes bare on/off as bools
			s = map[bool]string{true: "on", false: "off"}[b]
		} else {
			return def, &OptionError{Key: key, Msg: err.Error()}
		}
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return def, &OptionError{Key: key, Msg: fmt.Sprintf("%q is not one of %s", s, strings.Join(allowed, ", "))}
}

// OwnBool returns the profile option key as on/off (def when unset).
func (o Options) OwnBool(key string, def bool) (bool, error) {
	v, ok := o.Own[key]
	if !ok {
		return def, nil
	}
	b, err := boolean(v)
	if err != nil {
		return def, &OptionError{Key: key, Msg: err.Error()}
	}
	return b, nil
}

// OwnInt returns the profile option key as a whole number in [lo, hi] (def when unset).
func (o Options) OwnInt(key string, def, lo, hi int) (int, error) {
	v, ok := o.Own[key]
	if !ok {
		return def, nil
	}
	n, err := integer(v)
	if err != nil {
		return def, &OptionError{Key: key, Msg: err.Error()}
	}
	if n < int64(lo) || n > int64(hi) {
		return def, &OptionError{Key: key, Msg: fmt.Sprintf("%d out of range %d..%d", n, lo, hi)}
	}
	return int(n), nil
}

// OwnStrings returns the profile option key as a list of words (a YAML sequence or
// one comma-separated string; nil when unset).
func (o Options) OwnStrings(key string) ([]string, error) {
	v, ok := o.Own[key]
	if !ok {
		return nil, nil
	}
	var out []string
	switch x := v.(type) {
	case string:
		for _, f := range strings.Split(x, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok || strings.TrimSpace(s) == "" {
				return nil, &OptionError{Key: key, Msg: fmt.Sprintf("%v is not a word", e)}
			}
			out = append(out, strings.TrimSpace(s))
		}
	default:
		return nil, &OptionError{Key: key, Msg: fmt.Sprintf("%v is a %T, not a list", v, v)}
	}
	return out, nil
}

// EffectiveMTLS resolves the profile default.
func (o Options) EffectiveMTLS(profileDefault MTLSMode) MTLSMode {
	if o.MTLS == MTLSDefault {
		return profileDefault
	}
	return o.MTLS
}

// ClientsMeshed resolves MeshClients for a given mTLS mode.
func (o Options) ClientsMeshed(mode MTLSMode) bool {
	switch o.MeshClients {
	case On:
		return true
	case Off:
		return false
	}
	return mode == MTLSStrict
}

func word(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%v is a %T, not a word", v, v)
	}
	return strings.ToLower(strings.TrimSpace(s)), nil
}

func boolean(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		switch strings.ToLower(strings.TrimSpace(x)) {
		case "on", "true", "yes", "enabled":
			return true, nil
		case "off", "false", "no", "disabled":
			return false, nil
		}
	}
	return false, fmt.Errorf("%v is not on/off", v)
}

func integer(v any) (int64, error) {
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case int64:
		return x, nil
	case uint64:
		if x > math.MaxInt32 {
			return 0, fmt.Errorf("%d too large", x)
		}
		return int64(x), nil
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > math.MaxInt32 {
			return 0, fmt.Errorf("%v is not a whole number", x)
		}
		return int64(x), nil
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number", x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%v is a %T, not a number", v, v)
}
