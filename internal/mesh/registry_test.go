package mesh

import (
	"context"
	"errors"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// stubProfile is a registry entry only: these tests exercise option routing, not a
// data plane.
type stubProfile struct{ opts Options }

func (stubProfile) Name() string                                                      { return "stub" }
func (stubProfile) Install(context.Context, substrate.Substrate, *topology.App) error { return nil }
func (stubProfile) Check(context.Context, substrate.Substrate, *topology.App) (Enrollment, error) {
	return Enrollment{}, nil
}
func (stubProfile) Configs() map[string][]byte                           { return nil }
func (stubProfile) Uninstall(context.Context, substrate.Substrate) error { return nil }

func init() {
	RegisterProfile(Registration{
		Name: "test-own-options",
		New: func(o Options) (Profile, error) {
			if _, err := o.OwnWord("waypoint", "off", "on", "off"); err != nil {
				return nil, err
			}
			if _, err := o.OwnInt("replicas", 1, 1, 8); err != nil {
				return nil, err
			}
			return stubProfile{opts: o}, nil
		},
		Own:         map[string]string{"waypoint": "on | off", "replicas": "1..8", "authz": "list of callers"},
		Unsupported: map[string]string{"request_id": "the proxy has no such setting"},
	})
}

func TestOwnOptionsReachTheFactory(t *testing.T) {
	p, err := New("test-own-options", map[string]any{"waypoint": true, "replicas": 3, "concurrency": 4, "authz": []any{"a", " b "}})
	if err != nil {
		t.Fatal(err)
	}
	o := p.(stubProfile).opts
	if w, _ := o.OwnWord("waypoint", "off", "on", "off"); w != "on" {
		t.Errorf("waypoint = %q, want on (YAML's bare on decodes as true)", w)
	}
	if n, _ := o.OwnInt("replicas", 1, 1, 8); n != 3 {
		t.Errorf("replicas = %d", n)
	}
	if l, _ := o.OwnStrings("authz"); !reflect.DeepEqual(l, []string{"a", "b"}) {
		t.Errorf("authz = %q", l)
	}
	if o.Concurrency != 4 {
		t.Errorf("common option lost: concurrency %d", o.Concurrency)
	}
}

func TestOptionErrorsNameKeyAndProfile(t *testing.T) {
	for _, tc := range []struct {
		raw  map[string]any
		key  string
		want string
	}{
		{map[string]any{"request_id": "off"}, "request_id", "not supported by test-own-options"},
		{map[string]any{"waypiont": "on"}, "waypiont", "unknown option for test-own-options"},
		{map[string]any{"waypoint": "sometimes"}, "waypoint", `"sometimes" is not one of on, off`},
		{map[string]any{"replicas": 9}, "replicas", "out of range"},
		{map[string]any{"concurrency": 0}, "concurrency", "out of range"},
	} {
		_, err := New("test-own-options", tc.raw)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Key != tc.key || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%v) = %v, want an *OptionError on %q saying %q", tc.raw, err, tc.key, tc.want)
		}
	}
	// Another profile does not know this one's options.
	RegisterProfile(Registration{Name: "test-common-only", New: func(o Options) (Profile, error) { return stubProfile{o}, nil }})
	if _, err := New("test-common-only", map[string]any{"waypoint": "on"}); err == nil || !strings.Contains(err.Error(), "unknown option") {
		t.Errorf("an option of another profile was accepted: %v", err)
	}
}

func TestDiffCountersKeepsZeroInboundAndFlagsRestarts(t *testing.T) {
	t0 := time.Unix(100, 0)
	before := []meshkube.ProxyCounters{
		{Component: "p", Pod: "a", Time: t0, Inbound: map[string]uint64{"web": 10}, Counters: map[string]uint64{"x": 5, "y": 1}},
		{Component: "p", Pod: "b", Time: t0, Err: errors.New("refused")},
	}
	after := []meshkube.ProxyCounters{
		{Component: "p", Pod: "a", Time: t0.Add(time.Second), Inbound: map[string]uint64{"web": 10}, Counters: map[string]uint64{"x": 2, "y": 1}},
		{Component: "p", Pod: "b", Time: t0.Add(time.Second)},
		{Component: "p", Pod: "c", Time: t0.Add(time.Second)},
	}
	d := DiffCounters(before, after)
	if len(d) != 3 {
		t.Fatalf("%d deltas, want 3", len(d))
	}
	if v, ok := d[0].Inbound["web"]; !ok || v != 0 {
		t.Errorf("a zero inbound count must stay as evidence: %v", d[0].Inbound)
	}
	if d[0].Counters["x"] != 2 || !reflect.DeepEqual(d[0].Resets, []string{"x"}) || d[0].Counters["y"] != 0 {
		t.Errorf("restart not recorded: %+v", d[0])
	}
	if !strings.Contains(d[1].Err, "refused") || d[2].Err == "" {
		t.Errorf("unreadable proxies must carry their error: %q %q", d[1].Err, d[2].Err)
	}
	if n, _, ok := InboundTotal(d, "web"); !ok || n != 0 {
		t.Errorf("InboundTotal = %d, %v; want 0, true", n, ok)
	}
	if _, _, ok := InboundTotal(d, "other"); ok {
		t.Error("a service no proxy counts must report ok=false")
	}
}

// TestClusterMarksOfEveryMesh: KnownClusterMarks gathers what each registered mesh says
// about itself on a cluster (its sidecar, its gateways' labels, its opt-outs), and a
// mesh whose opt-out would undo another's (the same key, another value) is refused
// when it registers, not discovered when a probe pod lands in a mesh.
func TestClusterMarksOfEveryMesh(t *testing.T) {
	RegisterProfile(Registration{Name: "test-marks-a", New: func(Options) (Profile, error) { return stubProfile{}, nil },
		SMPType: "kuma",
		OnCluster: meshkube.ClusterMarks{Sidecar: "a-proxy", GatewayPodLabels: map[string]string{"a/gateway": ""},
			Outside: meshkube.OptOut{NamespaceLabels: map[string]string{"a/inject": "off"}, PodAnnotations: map[string]string{"a/inject": "off"}}}})
	RegisterProfile(Registration{Name: "test-marks-b", New: func(Options) (Profile, error) { return stubProfile{}, nil },
		OnCluster: meshkube.ClusterMarks{Sidecar: "b-proxy", Outside: meshkube.OptOut{PodAnnotations: map[string]string{"b/inject": "off", "a/inject": "off"}}}})
	k := KnownClusterMarks()
	if !reflect.DeepEqual(k.Sidecars, []string{"a-proxy", "b-proxy"}) || k.GatewayPodLabels["a/gateway"] != "" || len(k.GatewayPodLabels) != 1 {
		t.Errorf("sidecars %v, gateway labels %v", k.Sidecars, k.GatewayPodLabels)
	}
	if want := (meshkube.OptOut{NamespaceLabels: map[string]string{"a/inject": "off"}, PodAnnotations: map[string]string{"a/inject": "off", "b/inject": "off"}}); !reflect.DeepEqual(k.Outside, want) {
		t.Errorf("opt-outs %+v, want %+v", k.Outside, want)
	}
	if SMPType("test-marks-a") != "kuma" || SMPType("test-marks-b") != "test-marks-b" || SMPType("no-such-profile") != "no-such-profile" {
		t.Errorf("SMP types %q %q %q: want the registered one, else the profile's name", SMPType("test-marks-a"), SMPType("test-marks-b"), SMPType("no-such-profile"))
	}

	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, `a/inject="on"`) || !strings.Contains(msg, "test-marks-") {
			t.Errorf("a conflicting opt-out registered: recovered %q", msg)
		}
		if _, ok := Lookup("test-marks-c"); ok {
			t.Error("the conflicting profile is in the registry")
		}
	}()
	RegisterProfile(Registration{Name: "test-marks-c", OnCluster: meshkube.ClusterMarks{Outside: meshkube.OptOut{PodAnnotations: map[string]string{"a/inject": "on"}}}})
}
