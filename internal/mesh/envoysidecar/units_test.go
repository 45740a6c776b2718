package envoysidecar

import (
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
)

func TestParseStats(t *testing.T) {
	text := `cluster.inbound|9080||.upstream_rq_completed: 7
cluster.inbound|9080||.external.upstream_rq_completed: 7
http.inbound_0.0.0.0_9080_mtls.downstream_rq_total: 5
http.inbound_0.0.0.0_9080_plaintext.downstream_rq_total: 2
http.outbound_0.0.0.0_9080.downstream_rq_total: 11
server.version: "abc"
cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)
cluster.y.upstream_cx_length_ms: No recorded values
`
	s, err := ParseStats(text)
	if err != nil {
		t.Fatal(err)
	}
	got := TrafficOf(s)
	want := Traffic{InboundMTLS: 5, InboundPlaintext: 2, Outbound: 11, Answered: 7}
	if got != want {
		t.Fatalf("TrafficOf = %+v, want %+v", got, want)
	}
	if d := want.Sub(Traffic{InboundMTLS: 1, Outbound: 20}); d.InboundMTLS != 4 || d.Outbound != 11 {
		t.Errorf("Sub = %+v", d)
	}
	if _, err := ParseStats("a: 1\nnot a stat line\n"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed line: %v", err)
	}
	if _, err := ParseStats("a: -3\n"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("negative counter: %v", err)
	}
}

func FuzzParseStats(f *testing.F) {
	f.Add("http.outbound_0.0.0.0_9080.downstream_rq_total: 11\nx: P0(1,2)\n")
	f.Add("a: \"b\"\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseStats(text)
		if err != nil {
			if !strings.Contains(err.Error(), "envoy stats line") {
				t.Fatalf("error without a line number: %v", err)
			}
			return
		}
		_ = TrafficOf(s)
	})
}

// The rules' effect is tested in namespaces (e2e_test.go); this pins their shape.
func TestInterceptionRulesShape(t *testing.T) {
	ic := istioInterception(9080)
	rules := ic.InstallRules()
	for _, want := range []string{
		"-I OUTPUT 1 -p tcp -j ISTIO_OUTPUT",
		"-I PREROUTING 1 -p tcp -j ISTIO_INBOUND",
		"-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN",
		"-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN",
		"-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
		"-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006",
		"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001",
		"-m owner --uid-owner 1337 -j RETURN",
		"-A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("rules lack %q:\n%s", want, rules)
		}
	}
	// Exclusions before the catch-all, or they exclude nothing.
	if strings.Index(rules, "--dport 15020 -j RETURN") > strings.Index(rules, "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT") {
		t.Error("inbound catch-all precedes Istio's port exclusions")
	}
	// The uid exclusion must come before the catch-all redirect, or the proxy loops.
	if strings.Index(rules, "--uid-owner 1337 -j RETURN") > strings.Index(rules, "-A ISTIO_OUTPUT -j ISTIO_REDIRECT") {
		t.Error("catch-all redirect precedes the proxy uid exclusion")
	}
}

func TestNoInboundRedirectForClients(t *testing.T) {
	if r := istioInterception(0).InstallRules(); strings.Contains(r, "-A ISTIO_INBOUND") {
		t.Errorf("a pod without a port got inbound interception:\n%s", r)
	}
}

func TestBuildRejectsBadTopology(t *testing.T) {
	app := bookinfo()
	app.Services[2].Versions[0].Weight = -1
	opts := mesh.DefaultOptions()
	if _, err := BuildResources(app, app.Pods()[0], opts, mesh.MTLSOff, CertPaths{}); err == nil || !strings.Contains(err.Error(), "reviews") {
		t.Errorf("negative weight: %v", err)
	}
	app = bookinfo()
	if _, err := BuildResources(app, app.Pods()[0], opts, mesh.MTLSStrict, CertPaths{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("strict without certificates: %v", err)
	}
	app = bookinfo()
	app.Services[1].VIP = app.Services[0].VIP
	if _, err := BuildResources(app, app.Pods()[0], opts, mesh.MTLSOff, CertPaths{}); err == nil || !strings.Contains(err.Error(), "both answer") {
		t.Errorf("duplicate VIP: %v", err)
	}
}

func BenchmarkBuildBootstrap(b *testing.B) {
	app := bookinfo()
	opts := mesh.DefaultOptions()
	certs := CertPaths{CA: "/ca.pem", Cert: "/cert.pem", Key: "/key.pem"}
	for b.Loop() {
		bs, err := BuildBootstrap(app, app.Pods()[0], opts, mesh.MTLSStrict, certs)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := MarshalBootstrap(bs); err != nil {
			b.Fatal(err)
		}
	}
}

// A policy adds Envoy's RBAC filter, naming the allowed identities, ahead of the
// router on the inbound side only; without one the bootstrap has no RBAC filter at
// all, so load trials measure exactly Istio's policy-free sidecar.
func TestAuthorizationPolicyOnlyWhenAsked(t *testing.T) {
	app := bookinfo()
	opts := mesh.DefaultOptions()
	certs := CertPaths{CA: "/ca.pem", Cert: "/cert.pem", Key: "/key.pem"}
	pod := app.Service("reviews").Versions[0].Endpoints[0]
	plain, err := BuildBootstrap(app, pod, opts, mesh.MTLSStrict, certs)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := MarshalBootstrap(plain)
	if strings.Contains(string(js), "envoy.filters.http.rbac") {
		t.Error("a bootstrap without a policy has an RBAC filter")
	}
	const caller = "spiffe://cluster.local/ns/bookinfo/sa/productpage"
	withPolicy, err := BuildBootstrapAllowing(app, pod, opts, mesh.MTLSStrict, certs, []string{caller})
	if err != nil {
		t.Fatal(err)
	}
	js, _ = MarshalBootstrap(withPolicy)
	s := string(js)
	if n := strings.Count(s, "envoy.filters.http.rbac"); n != 1 {
		t.Errorf("%d RBAC filters, want one (the inbound mTLS chain)", n)
	}
	if !strings.Contains(s, caller) || !strings.Contains(s, "meshmark-allowed-callers") {
		t.Errorf("RBAC filter does not allow %s", caller)
	}
	if rbac, router := strings.Index(s, "envoy.filters.http.rbac"), strings.LastIndex(s, "envoy.filters.http.router"); rbac > router {
		t.Error("RBAC filter after the router")
	}
}

func TestPlaintextServicesOption(t *testing.T) {
	for _, tc := range []struct {
		raw  map[string]any
		want string // "" for accepted
	}{
		{map[string]any{"mtls": "strict", PlaintextServicesOption: []any{"reviews"}}, ""},
		{map[string]any{"mtls": "off", PlaintextServicesOption: []any{"reviews"}}, "plaintext already"},
		{map[string]any{"mtls": "strict", PlaintextServicesOption: []any{"Reviews_1"}}, "not a service name"},
	} {
		_, err := mesh.New(Name, tc.raw)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.raw, err, tc.want)
		}
	}
	// The exempted service's pods serve plaintext only, and callers send it plaintext;
	// everyone else keeps strict mTLS.
	app := bookinfo()
	opts := mesh.DefaultOptions()
	opts.Own = map[string]any{PlaintextServicesOption: []any{"reviews"}}
	certs := CertPaths{CA: "/ca.pem", Cert: "/cert.pem", Key: "/key.pem"}
	reviews, _ := MarshalBootstrap(must(BuildBootstrap(app, app.Service("reviews").Versions[0].Endpoints[0], opts, mesh.MTLSStrict, certs)))
	if strings.Contains(string(reviews), "_mtls") || strings.Contains(string(reviews), "refuse_plaintext") {
		t.Error("the exempted service's sidecar still serves mTLS inbound")
	}
	pp, _ := MarshalBootstrap(must(BuildBootstrap(app, app.Service("productpage").Versions[0].Endpoints[0], opts, mesh.MTLSStrict, certs)))
	s := string(pp)
	if !strings.Contains(s, "refuse_plaintext") {
		t.Error("productpage lost its strict inbound")
	}
	if strings.Contains(s, "outbound_.9080_.v1_.reviews") {
		t.Error("productpage still sends mTLS to the exempted reviews")
	}
	if !strings.Contains(s, "outbound_.9080_._.details") {
		t.Error("productpage no longer sends mTLS to details")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
