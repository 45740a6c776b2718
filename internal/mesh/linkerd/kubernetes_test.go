package linkerd

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	linkerdcharts "github.com/meshmark/meshmark/third_party/linkerd-charts"
)

func kubernetesInstall(t *testing.T, raw map[string]any) (meshkube.KubernetesInstall, error) {
	t.Helper()
	p, err := mesh.New(Name, raw)
	if err != nil {
		t.Fatal(err)
	}
	return p.(mesh.KubernetesInstaller).Kubernetes()
}

func TestKubernetesInstallIsLinkerdFromItsCharts(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	in, err := kubernetesInstall(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Charts) != 2 || in.Charts[0].Release != "linkerd-crds" || in.Charts[1].Release != "linkerd-control-plane" {
		t.Fatalf("charts %+v: want linkerd-crds, then linkerd-control-plane", in.Charts)
	}
	for _, ch := range in.Charts {
		if ch.Namespace != "linkerd" || ch.Repo != "" || filepath.Base(ch.Chart) != ch.Release {
			t.Errorf("chart %+v: want meshmark's copy, into linkerd", ch)
		}
	}
	if in.NamespaceAnnotations["linkerd.io/inject"] != "enabled" || in.PodAnnotations["linkerd.io/inject"] != "enabled" ||
		in.Sidecar != "linkerd-proxy" || len(in.Manifests) != 0 {
		t.Errorf("enrollment: %+v", in)
	}
	// linkerd-init's NET_ADMIN is beyond Pod Security's baseline, in the app's pods and
	// the control plane's.
	if len(in.NamespaceLabels) != 1 || in.NamespaceLabels[meshkube.PodSecurityEnforce] != meshkube.PodSecurityPrivileged || !slices.Equal(in.PrivilegedNamespaces, []string{"linkerd"}) {
		t.Errorf("pod security: app namespace labels %v, privileged namespaces %v", in.NamespaceLabels, in.PrivilegedNamespaces)
	}
	if in.Charts[0].Values["installGatewayAPI"] != true {
		t.Errorf("linkerd-crds values %v: want the Gateway API CRDs Linkerd's docs install with it", in.Charts[0].Values)
	}
	v := in.Charts[1].Values
	if v["linkerdVersion"] != linkerdcharts.Tag || v["proxy"] != nil || v["identityTrustDomain"] != nil {
		t.Errorf("stock Linkerd's values: %v", v)
	}

	// The copy on disk is the vendored charts, byte for byte.
	dir := filepath.Dir(in.Charts[0].Chart)
	n := 0
	err = fs.WalkDir(linkerdcharts.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		vendored, err := os.ReadFile(filepath.Join("..", "..", "..", "third_party", "linkerd-charts", p))
		if err != nil {
			return err
		}
		onDisk, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			return err
		}
		if !bytes.Equal(vendored, onDisk) {
			t.Errorf("%s differs from third_party/linkerd-charts", p)
		}
		n++
		return nil
	})
	if err != nil || n < 60 {
		t.Errorf("%d chart files compared: %v", n, err)
	}

	// The certificates: a P-256 trust anchor, and an issuer for
	// identity.linkerd.cluster.local under it whose key is the one given.
	anchor := parseCert(t, v["identityTrustAnchorsPEM"].(string))
	tls := v["identity"].(map[string]any)["issuer"].(map[string]any)["tls"].(map[string]any)
	issuer := parseCert(t, tls["crtPEM"].(string))
	roots := x509.NewCertPool()
	roots.AddCert(anchor)
	if _, err := issuer.Verify(x509.VerifyOptions{Roots: roots, DNSName: "identity.linkerd.cluster.local"}); err != nil {
		t.Errorf("issuer under the trust anchor: %v", err)
	}
	if issuer.Subject.CommonName != "identity.linkerd.cluster.local" || !issuer.IsCA || !anchor.IsCA || anchor.Subject.CommonName != "root.linkerd.cluster.local" {
		t.Errorf("issuer %q (CA %v), anchor %q (CA %v)", issuer.Subject.CommonName, issuer.IsCA, anchor.Subject.CommonName, anchor.IsCA)
	}
	for _, c := range []*x509.Certificate{anchor, issuer} {
		if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, Linkerd wants ECDSA P-256", c.Subject.CommonName, c.PublicKey)
		}
	}
	kb, _ := pem.Decode([]byte(tls["keyPEM"].(string)))
	if kb == nil {
		t.Fatal("issuer keyPEM holds no PEM block")
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !key.(*ecdsa.PrivateKey).PublicKey.Equal(issuer.PublicKey) {
		t.Error("issuer keyPEM is not the issuer certificate's key")
	}
	again, err := kubernetesInstall(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Charts[1].Values["identityTrustAnchorsPEM"] == v["identityTrustAnchorsPEM"] {
		t.Error("two installs share a trust anchor")
	}
}

func TestKubernetesOptionsBecomeLinkerdSettings(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	in, err := kubernetesInstall(t, map[string]any{"mtls": "strict", "concurrency": 4, "access_log": true, "trust_domain": "bench.example",
		"helm_values": map[string]any{"linkerd-control-plane": map[string]any{"controllerLogLevel": "debug", "proxy": map[string]any{"logLevel": "debug"}}}})
	if err != nil {
		t.Fatal(err)
	}
	v := in.Charts[1].Values
	proxy := v["proxy"].(map[string]any)
	if proxy["defaultInboundPolicy"] != "all-authenticated" || proxy["accessLog"] != "apache" || proxy["logLevel"] != "debug" ||
		proxy["runtime"].(map[string]any)["workers"].(map[string]any)["minimum"] != 4 {
		t.Errorf("proxy values %v: want strict as all-authenticated, 4 workers, the access log and the study's log level", proxy)
	}
	if v["controllerLogLevel"] != "debug" || v["identityTrustDomain"] != "bench.example" {
		t.Errorf("values %v", v)
	}
	// Strict: the proxies' admin port stays readable by the API server's pod proxy.
	if len(in.AppManifests) != 1 || !strings.Contains(in.AppManifests[0], "kind: Server") || !strings.Contains(in.AppManifests[0], "port: linkerd-admin") ||
		!strings.Contains(in.AppManifests[0], "accessPolicy: all-unauthenticated") {
		t.Errorf("strict app manifests %q: want the admin port's Server, open to unauthenticated reads", in.AppManifests)
	}
	if permissive, err := kubernetesInstall(t, nil); err != nil || len(permissive.AppManifests) != 0 {
		t.Errorf("permissive app manifests %q, %v: want none, its default policy lets any client read", permissive.AppManifests, err)
	}
	issuer := parseCert(t, v["identity"].(map[string]any)["issuer"].(map[string]any)["tls"].(map[string]any)["crtPEM"].(string))
	if issuer.Subject.CommonName != "identity.linkerd.bench.example" {
		t.Errorf("issuer %q for trust domain bench.example", issuer.Subject.CommonName)
	}

	in, err = kubernetesInstall(t, map[string]any{"linkerd_version": "edge-26.9.1", "linkerd_repo": EdgeRepo})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range in.Charts {
		if ch.Repo != EdgeRepo || ch.Version != "2026.9.1" || ch.Chart != ch.Release {
			t.Errorf("from the repository: %+v", ch)
		}
	}
	if _, set := in.Charts[1].Values["linkerdVersion"]; set {
		t.Error("linkerdVersion set for a packaged chart, which has it")
	}
	in, err = kubernetesInstall(t, map[string]any{"linkerd_version": "edge-26.7.1", "linkerd_charts": "/src/linkerd2/charts"})
	if err != nil {
		t.Fatal(err)
	}
	if in.Charts[1].Chart != "/src/linkerd2/charts/linkerd-control-plane" || in.Charts[1].Values["linkerdVersion"] != "edge-26.7.1" {
		t.Errorf("from a local copy: %+v", in.Charts[1])
	}

	for _, tc := range []struct {
		raw       map[string]any
		key, want string
	}{
		{map[string]any{"linkerd_version": "edge-26.7.1"}, "linkerd_version", "meshmark carries the charts of Linkerd edge-26.8.3 only"},
		{map[string]any{"linkerd_version": "stable-2.14.10"}, "linkerd_version", "not a Linkerd edge release"},
		{map[string]any{"linkerd_repo": EdgeRepo, "linkerd_charts": "/x"}, "linkerd_repo", "not both"},
		{map[string]any{"linkerd_repo": ""}, "linkerd_repo", "want the URL"},
		{map[string]any{"authz": []any{"productpage"}}, "authz", "not carried over to Linkerd yet"},
		{map[string]any{"helm_values": map[string]any{"linkerd": map[string]any{}}}, "helm_values.linkerd", "no such release (releases: linkerd-crds, linkerd-control-plane)"},
	} {
		_, err := kubernetesInstall(t, tc.raw)
		var oe *mesh.OptionError
		if !errors.As(err, &oe) || oe.Key != tc.key || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an OptionError on %s saying %q", tc.raw, err, tc.key, tc.want)
		}
	}
	if _, err := mesh.New(Name, map[string]any{"linkerd_charts_dir": "/x"}); err == nil || !strings.Contains(err.Error(), "unknown option for linkerd") ||
		!strings.Contains(err.Error(), "linkerd_charts, linkerd_repo, linkerd_version") {
		t.Errorf("unknown option: %v", err)
	}
}

func parseCert(t *testing.T, s string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("no certificate in %q", s)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
