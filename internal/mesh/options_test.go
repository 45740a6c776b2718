package mesh

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseOptionsDefaultsMirrorIstio(t *testing.T) {
	o, err := ParseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o, DefaultOptions()) {
		t.Fatalf("ParseOptions(nil) = %+v, want defaults", o)
	}
	if o.Concurrency != 2 || !o.Telemetry || !o.RequestID || o.AccessLog || !o.Retries || o.CircuitBreakers != CircuitBreakersUnlimited {
		t.Errorf("defaults drifted from a stock Istio sidecar: %+v", o)
	}
	if o.EffectiveMTLS(MTLSPermissive) != MTLSPermissive || o.ClientsMeshed(MTLSPermissive) || !o.ClientsMeshed(MTLSStrict) {
		t.Errorf("mtls/mesh_clients resolution wrong: %+v", o)
	}
}

func TestParseOptionsReadsYAMLShapedValues(t *testing.T) {
	o, err := ParseOptions(map[string]any{
		"mtls": "STRICT", "concurrency": 4.0, "telemetry": "off", "request_id": false,
		"access_log": "on", "circuit_breakers": "proxy-default", "mesh_clients": false, "retries": "off",
		"trust_domain": "example.org",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Options{MTLS: MTLSStrict, Concurrency: 4, Telemetry: false, RequestID: false, AccessLog: true, Retries: false,
		CircuitBreakers: CircuitBreakersProxyDefault, MeshClients: Off, TrustDomain: "example.org"}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("got %+v\nwant %+v", o, want)
	}
	for v, want := range map[string]CircuitBreakers{"off": CircuitBreakersUnlimited, "unlimited": CircuitBreakersUnlimited, "default": CircuitBreakersProxyDefault} {
		if o, err := ParseOptions(map[string]any{"circuit_breakers": v}); err != nil || o.CircuitBreakers != want {
			t.Errorf("circuit_breakers %s: %v, %v", v, o.CircuitBreakers, err)
		}
	}
	for _, off := range []any{"disabled", "off", false} {
		o, err := ParseOptions(map[string]any{"mtls": off})
		if err != nil || o.MTLS != MTLSOff {
			t.Errorf("mtls %v: %+v, %v", off, o.MTLS, err)
		}
	}
}

func TestParseOptionsErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		raw map[string]any
		key string
	}{
		{map[string]any{"mtls": "sometimes"}, "mtls"},
		{map[string]any{"concurrency": 0}, "concurrency"},
		{map[string]any{"concurrency": 2.5}, "concurrency"},
		{map[string]any{"concurrency": "many"}, "concurrency"},
		{map[string]any{"telemetry": 3}, "telemetry"},
		{map[string]any{"circuit_breakers": "tight"}, "circuit_breakers"},
		{map[string]any{"mesh_clients": "maybe"}, "mesh_clients"},
		{map[string]any{"trust_domain": "Bad/Domain"}, "trust_domain"},
		{map[string]any{"mtsl": "strict"}, "mtsl"},
	} {
		_, err := ParseOptions(tc.raw)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Key != tc.key {
			t.Errorf("ParseOptions(%v) = %v, want an error naming %q", tc.raw, err, tc.key)
			continue
		}
		if !strings.Contains(err.Error(), tc.key) {
			t.Errorf("message %q does not name %q", err, tc.key)
		}
	}
}

func FuzzParseOptions(f *testing.F) {
	f.Add("mtls", "strict", int64(2))
	f.Add("concurrency", "", int64(-1))
	f.Add("circuit_breakers", "off", int64(0))
	f.Fuzz(func(t *testing.T, key, word string, n int64) {
		for _, v := range []any{word, n, float64(n), n%2 == 0} {
			o, err := ParseOptions(map[string]any{key: v})
			if err != nil {
				var oe *OptionError
				if !errors.As(err, &oe) || oe.Key != key {
					t.Fatalf("error %v does not name key %q", err, key)
				}
				continue
			}
			if o.Concurrency < 1 || o.Concurrency > 64 {
				t.Fatalf("accepted concurrency %d", o.Concurrency)
			}
			switch o.MTLS {
			case MTLSDefault, MTLSOff, MTLSPermissive, MTLSStrict:
			default:
				t.Fatalf("accepted mtls %q", o.MTLS)
			}
		}
	})
}

type fakeProfile struct{ Profile }

func TestRegistry(t *testing.T) {
	Register("test-fake", func(o Options) (Profile, error) {
		if o.Concurrency == 3 {
			return nil, errors.New("no three")
		}
		return fakeProfile{}, nil
	})
	if _, err := New("test-fake", map[string]any{"concurrency": 3}); err == nil || !strings.Contains(err.Error(), "test-fake") {
		t.Errorf("factory error not surfaced with the mesh name: %v", err)
	}
	if _, err := New("test-fake", map[string]any{"bogus": 1}); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("option error not surfaced: %v", err)
	}
	if _, err := New("no-such-mesh", nil); err == nil || !strings.Contains(err.Error(), "test-fake") {
		t.Errorf("unknown mesh error should list known meshes: %v", err)
	}
	if p, err := New("test-fake", nil); err != nil || p == nil {
		t.Errorf("New: %v", err)
	}
}
