package security

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/ambient"
	"github.com/meshmark/meshmark/internal/mesh/envoysidecar"
	"github.com/meshmark/meshmark/internal/mesh/linkerd"
	"github.com/meshmark/meshmark/internal/mesh/meshtest"
	"github.com/meshmark/meshmark/internal/mesh/nodeenvoy"
	"github.com/meshmark/meshmark/internal/mesh/traefikmesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/testbed"
)

func TestMain(m *testing.M) {
	if os.Getenv(meshtest.HelperEnv) == "serve" {
		meshtest.ServeHelper()
		return
	}
	os.Exit(m.Run())
}

// deploy brings up productpage and reviews v1..v3 (the test binary as each workload)
// under real Envoy sidecars with the given mTLS mode and proves the enrollment.
func deploy(t *testing.T, mtls string) (meshtest.Bed, mesh.Profile, Target) {
	return deployProfile(t, envoysidecar.Name, map[string]any{"mtls": mtls})
}

// deployProfile is deploy for any profile; its proxy binary must be installed (CI has
// them all; elsewhere a missing one skips).
func deployProfile(t *testing.T, profile string, options map[string]any) (meshtest.Bed, mesh.Profile, Target) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	var err error
	switch profile {
	case linkerd.Name:
		_, err = prereq.ProxyBin("linkerd2-proxy")
	case ambient.Name:
		_, err = prereq.ProxyBin("ztunnel")
	case traefikmesh.Name:
		_, err = prereq.ProxyBin("traefik")
	default:
		_, err = prereq.Envoy()
	}
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no proxy: %v", err)
		}
		t.Fatalf("these tests run the real proxy: %v", err)
	}
	ctx := context.Background()
	// details is a third service, so each callee has a meshed caller it does not allow
	b := meshtest.NewBedWith(t, testbed.Deployment{Service: "details", Port: 9080})
	b.App.Calls = map[string][]string{"productpage": {"reviews", "details"}}
	p, err := mesh.New(profile, options)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Install(ctx, b.TB, b.App); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Uninstall(context.Background(), b.TB) })
	e, err := p.Check(ctx, b.TB, b.App)
	if err != nil || !e.Pass {
		t.Fatalf("enrollment: %v %s", err, e.Summary())
	}
	productpage := b.App.Service("productpage")
	tgt := Target{Sub: b.TB, App: b.App, Profile: p, Progress: func(s string) { t.Log(s) },
		Traffic: func(ctx context.Context, n int) error {
			// client -> productpage -> reviews, the way the app's own calls go
			ok := 0
			var last error
			for range n {
				r, err := mesh.ProbeHTTP(ctx, b.TB, b.App.Clients[0], mesh.Addr(productpage.VIP, productpage.Port), "productpage:9080", "/?to=reviews:9080")
				if err == nil && r.Status == 200 {
					ok++
				} else if err != nil {
					last = err
				} else {
					last = fmt.Errorf("HTTP %d %.80s", r.Status, r.Body)
				}
			}
			if ok == 0 {
				return fmt.Errorf("none of %d requests succeeded (last: %v)", n, last)
			}
			return nil
		}}
	return b, p, tgt
}

func outcomes(t *testing.T, tgt Target) map[string]results.SecurityProbe {
	t.Helper()
	probes, err := Run(context.Background(), tgt, Options{Requests: 12})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]results.SecurityProbe{}
	for _, p := range probes {
		out[p.Probe] = p
	}
	return out
}

// portChecks verifies the port checks of a deployment: a second port the app opens is
// refused to a plaintext caller exactly when the mesh refuses plaintext (every port of
// the workload is in the mesh), and each port the mesh excludes by design is reported
// as documented evidence.
func portChecks(t *testing.T, got map[string]results.SecurityProbe, strict bool, excluded []int) {
	t.Helper()
	second := 0
	for _, c := range got[results.ProbePlaintext].Checks {
		if strings.Contains(c.Target, "a second port of the app") {
			second++
			if c.Held != strict {
				t.Errorf("second port: held %v under strict=%v: %s: %s", c.Held, strict, c.Target, c.Observed)
			}
		}
	}
	if second == 0 {
		t.Errorf("no second-port check: %+v", got[results.ProbePlaintext].Checks)
	}
	for _, port := range excluded {
		found := false
		for _, c := range got[results.ProbeBypass].Checks {
			found = found || c.Documented && strings.Contains(c.Target, fmt.Sprintf("port %d, excluded", port))
		}
		if !found {
			t.Errorf("excluded port %d not reported: %+v", port, got[results.ProbeBypass].Checks)
		}
	}
}

func expect(t *testing.T, got map[string]results.SecurityProbe, want map[string]results.SecurityOutcome) {
	t.Helper()
	for probe, w := range want {
		if g := got[probe]; g.Outcome != w {
			t.Errorf("%s: %s (%s), want %s; checks: %+v", probe, g.Outcome, g.Summary, w, g.Checks)
		}
	}
}

// The matrix for Istio-like sidecars in each mTLS mode, from real captures and real
// calls: off promises nothing and shows plaintext as expected; permissive encrypts
// between sidecars and shows certificates but accepts plaintext callers; strict
// holds everywhere.
func TestEnvoySidecarMatrix(t *testing.T) {
	for _, tc := range []struct {
		mtls string
		want map[string]results.SecurityOutcome
	}{
		{"off", map[string]results.SecurityOutcome{results.ProbeEncryption: "expected", results.ProbePlaintext: "expected",
			results.ProbeAuthorization: "n/a", results.ProbeBypass: "expected", results.ProbeIdentity: "n/a"}},
		{"permissive", map[string]results.SecurityOutcome{results.ProbeEncryption: "pass", results.ProbePlaintext: "expected",
			results.ProbeAuthorization: "pass", results.ProbeBypass: "expected", results.ProbeIdentity: "pass"}},
		{"strict", map[string]results.SecurityOutcome{results.ProbeEncryption: "pass", results.ProbePlaintext: "pass",
			results.ProbeAuthorization: "pass", results.ProbeBypass: "pass", results.ProbeIdentity: "pass"}},
	} {
		t.Run(tc.mtls, func(t *testing.T) {
			_, _, tgt := deploy(t, tc.mtls)
			got := outcomes(t, tgt)
			expect(t, got, tc.want)
			portChecks(t, got, tc.mtls == "strict", envoysidecar.IstioExcludedInboundPorts)
			if tc.mtls != "off" {
				// the denied caller got Istio's denial, and the allowed one was served
				var denied, served bool
				for _, c := range got[results.ProbeAuthorization].Checks {
					denied = denied || strings.Contains(c.Target, "(not allowed)") && strings.Contains(c.Observed, "403") && strings.Contains(c.Observed, "RBAC: access denied")
					served = served || strings.Contains(c.Target, "productpage -> reviews (allowed)") && c.Held
				}
				if !denied || !served {
					t.Errorf("authorization checks: %+v", got[results.ProbeAuthorization].Checks)
				}
			}
			// Every flow's evidence names TLS with its version, unless a pooled
			// connection was opened before the capture and its handshake not seen.
			for _, c := range got[results.ProbeEncryption].Checks {
				if tc.mtls != "off" && !strings.Contains(c.Observed, "tls TLS 1.") && !strings.Contains(c.Observed, "before the capture") {
					t.Errorf("encryption evidence %s: %s; want TLS with its version", c.Target, c.Observed)
				}
			}
		})
	}
}

// A strict mesh broken in two places, as happens when injection or the CNI agent
// fails: productpage's outbound interception is gone (its calls leave unproxied), and
// reviews-v1 is out of the mesh (its sidecar stopped and its interception flushed; in
// ambient, its in-pod redirection removed). Each probe must catch what concerns it, on
// each mesh's real proxies.
func TestBrokenStrictMeshIsCaught(t *testing.T) {
	flush := func(t *testing.T, b meshtest.Bed, pod string, argvs ...[]string) {
		t.Helper()
		for _, argv := range argvs {
			if out, err := b.TB.Exec(context.Background(), b.Pod(pod), nil, argv...); err != nil {
				t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
			}
		}
	}
	stopSidecar := func(t *testing.T, b meshtest.Bed, pod string) {
		t.Helper()
		for _, pr := range b.TB.Processes() {
			if pr.Pod() == pod && pr.Spec().Role == substrate.RoleSidecar {
				if err := pr.Stop(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	sidecarBreak := func(t *testing.T, b meshtest.Bed) {
		flush(t, b, "productpage-v1-0", []string{"iptables", "-w", "-t", "nat", "-F", "OUTPUT"})
		stopSidecar(t, b, "reviews-v1-0")
		flush(t, b, "reviews-v1-0", []string{"iptables", "-w", "-t", "nat", "-F"})
	}
	for _, tc := range []struct {
		profile string
		brk     func(*testing.T, meshtest.Bed)
		want    map[string]results.SecurityOutcome
		// mustName: per probe, what a failed check must name
		mustName map[string]string
	}{
		{envoysidecar.Name, sidecarBreak,
			map[string]results.SecurityOutcome{results.ProbeEncryption: "fail", results.ProbePlaintext: "fail",
				results.ProbeBypass: "fail", results.ProbeIdentity: "fail"},
			map[string]string{results.ProbeEncryption: "productpage-v1-0 -> reviews", results.ProbePlaintext: "pod reviews-v1-0", results.ProbeIdentity: "pod reviews-v1-0"}},
		{linkerd.Name, sidecarBreak,
			map[string]results.SecurityOutcome{results.ProbeEncryption: "fail", results.ProbePlaintext: "fail", results.ProbeIdentity: "fail"},
			map[string]string{results.ProbeEncryption: "productpage-v1-0 -> reviews", results.ProbePlaintext: "pod reviews-v1-0", results.ProbeIdentity: "pod reviews-v1-0"}},
		// The redirects go (nat); the mangle rules that route replies back to ztunnel's
		// transparent sockets stay, as HBONE still arrives on ztunnel's own listener in
		// the pod (it holds the socket, no redirect needed). So identity still holds
		// at reviews-v1.
		{ambient.Name, func(t *testing.T, b meshtest.Bed) {
			out := []string{"iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-j", "ISTIO_OUTPUT"}
			in := []string{"iptables", "-w", "-t", "nat", "-D", "PREROUTING", "-j", "ISTIO_PRERT"}
			flush(t, b, "productpage-v1-0", out)
			flush(t, b, "reviews-v1-0", out, in)
		},
			map[string]results.SecurityOutcome{results.ProbeEncryption: "fail", results.ProbePlaintext: "fail"},
			map[string]string{results.ProbeEncryption: "productpage-v1-0 -> reviews", results.ProbePlaintext: "pod reviews-v1-0"}},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			b, _, tgt := deployProfile(t, tc.profile, map[string]any{"mtls": "strict"})
			tc.brk(t, b)
			got := outcomes(t, tgt)
			expect(t, got, tc.want)
			for probe, who := range tc.mustName {
				found := false
				for _, c := range got[probe].Checks {
					if !c.Held && strings.Contains(c.Target, who) {
						found = true
					}
					if !c.Held && !strings.Contains(c.Target, "reviews-v1-0") && probe != results.ProbeEncryption {
						t.Errorf("%s: blamed %s (%s), which is intact", probe, c.Target, c.Observed)
					}
				}
				if !found {
					t.Errorf("%s: no failed check names %s: %+v", probe, who, got[probe].Checks)
				}
			}
		})
	}
}

// Linkerd's real proxy under meshmark's control plane: always mTLS between proxies,
// identities as DNS SANs, plaintext refused only under strict, and an authorization
// policy pushed on the proxies' policy streams at run time (denial: the proxy's 403).
func TestLinkerdMatrix(t *testing.T) {
	for _, tc := range []struct {
		mtls string
		want map[string]results.SecurityOutcome
	}{
		{"permissive", map[string]results.SecurityOutcome{results.ProbeEncryption: "pass", results.ProbePlaintext: "expected",
			results.ProbeAuthorization: "pass", results.ProbeBypass: "expected", results.ProbeIdentity: "pass"}},
		{"strict", map[string]results.SecurityOutcome{results.ProbeEncryption: "pass", results.ProbePlaintext: "pass",
			results.ProbeAuthorization: "pass", results.ProbeBypass: "pass", results.ProbeIdentity: "pass"}},
	} {
		t.Run(tc.mtls, func(t *testing.T) {
			_, _, tgt := deployProfile(t, linkerd.Name, map[string]any{"mtls": tc.mtls})
			got := outcomes(t, tgt)
			expect(t, got, tc.want)
			portChecks(t, got, tc.mtls == "strict", []int{linkerd.ControlPort, linkerd.AdminPort})
			var denied bool
			for _, c := range got[results.ProbeAuthorization].Checks {
				denied = denied || strings.Contains(c.Target, "(not allowed)") && strings.Contains(c.Observed, "denied: HTTP 403")
			}
			if !denied {
				t.Errorf("no caller got Linkerd's 403: %+v", got[results.ProbeAuthorization].Checks)
			}
		})
	}
}

// A strict mesh with mTLS switched off on one service's sidecars, the way an Istio
// user exempts a workload (PeerAuthentication DISABLE, DestinationRule tls DISABLE):
// the deployment is as configured, so the enrollment check passes, and every probe
// that concerns it fails, naming that service's pods.
func TestMTLSOffOnOneServiceIsCaught(t *testing.T) {
	_, _, tgt := deployProfile(t, envoysidecar.Name, map[string]any{"mtls": "strict", envoysidecar.PlaintextServicesOption: []any{"reviews"}})
	got := outcomes(t, tgt)
	expect(t, got, map[string]results.SecurityOutcome{results.ProbeEncryption: "fail", results.ProbePlaintext: "fail",
		results.ProbeBypass: "fail", results.ProbeIdentity: "fail"})
	for _, probe := range []string{results.ProbeEncryption, results.ProbePlaintext, results.ProbeIdentity} {
		for _, c := range got[probe].Checks {
			if !c.Held && !strings.Contains(c.Target, "reviews") {
				t.Errorf("%s: blamed %s (%s), whose mTLS is on", probe, c.Target, c.Observed)
			}
			if c.Held && strings.Contains(c.Target, "-> reviews-") {
				t.Errorf("%s: %s held (%s) though reviews has mTLS off", probe, c.Target, c.Observed)
			}
		}
	}
}

// Ambient on real ztunnels: HBONE on the wire and the pods' SPIFFE certificates on
// 15008 in either mode, plaintext refused only when strict, and the authorization
// policy pushed to the running ztunnels over xDS: the callee's ztunnel closes a
// disallowed caller's connection and admits it again once the policy is removed.
// Behind a waypoint the policy belongs in the waypoint, which meshmark's does not
// enforce: n/a, saying why.
func TestAmbientMatrix(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options map[string]any
		want    map[string]results.SecurityOutcome
	}{
		{"permissive", map[string]any{"mtls": "permissive"}, map[string]results.SecurityOutcome{results.ProbeEncryption: "pass",
			results.ProbePlaintext: "expected", results.ProbeAuthorization: "pass", results.ProbeBypass: "expected", results.ProbeIdentity: "pass"}},
		{"strict", map[string]any{"mtls": "strict"}, map[string]results.SecurityOutcome{results.ProbeEncryption: "pass",
			results.ProbePlaintext: "pass", results.ProbeAuthorization: "pass", results.ProbeBypass: "pass", results.ProbeIdentity: "pass"}},
		{"strict-waypoint", map[string]any{"mtls": "strict", "waypoint": "on"}, map[string]results.SecurityOutcome{results.ProbeEncryption: "pass",
			results.ProbePlaintext: "pass", results.ProbeAuthorization: "n/a", results.ProbeIdentity: "pass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, tgt := deployProfile(t, ambient.Name, tc.options)
			got := outcomes(t, tgt)
			expect(t, got, tc.want)
			portChecks(t, got, tc.options["mtls"] == "strict", nil)
			if !strings.Contains(fmt.Sprint(got[results.ProbeEncryption].Checks), "hbone") {
				t.Errorf("ambient flows not HBONE: %+v", got[results.ProbeEncryption].Checks)
			}
			if tc.options["waypoint"] != nil {
				if !strings.Contains(got[results.ProbeAuthorization].Summary, "waypoint") {
					t.Errorf("authorization n/a without saying it is the waypoint's: %s", got[results.ProbeAuthorization].Summary)
				}
				return
			}
			var denied, readmitted bool
			for _, c := range got[results.ProbeAuthorization].Checks {
				denied = denied || strings.Contains(c.Target, "(not allowed)") && c.Held
				readmitted = readmitted || strings.Contains(c.Target, "(policy removed)") && c.Held
			}
			if !denied || !readmitted {
				t.Errorf("ztunnel did not deny a disallowed caller and admit it after removal: %+v", got[results.ProbeAuthorization].Checks)
			}
		})
	}
}

// The node-proxy meshes promise no encryption, so plaintext on the wire is expected,
// not a failure. Traefik Mesh's ACL mode denies a caller through the mesh with
// Traefik's 403; cilium-envoy has no policy of meshmark's to apply.
func TestOtherProfilesMatrix(t *testing.T) {
	for _, tc := range []struct {
		profile string
		options map[string]any
		want    map[string]results.SecurityOutcome
	}{
		{nodeenvoy.Name, nil, map[string]results.SecurityOutcome{results.ProbeEncryption: "expected",
			results.ProbePlaintext: "expected", results.ProbeAuthorization: "n/a", results.ProbeBypass: "expected", results.ProbeIdentity: "n/a"}},
		{traefikmesh.Name, nil, map[string]results.SecurityOutcome{results.ProbeEncryption: "expected",
			results.ProbePlaintext: "expected", results.ProbeAuthorization: "pass", results.ProbeBypass: "expected", results.ProbeIdentity: "n/a"}},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			_, _, tgt := deployProfile(t, tc.profile, tc.options)
			got := outcomes(t, tgt)
			expect(t, got, tc.want)
			if tc.profile == traefikmesh.Name {
				var denied bool
				for _, c := range got[results.ProbeAuthorization].Checks {
					denied = denied || strings.Contains(c.Target, "(not allowed)") && strings.Contains(c.Observed, "denied: HTTP 403")
				}
				if !denied {
					t.Errorf("no caller got Traefik's 403: %+v", got[results.ProbeAuthorization].Checks)
				}
			}
		})
	}
}
