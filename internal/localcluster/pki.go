package localcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/meshmark/meshmark/internal/pki"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 365 * 24 * time.Hour
	// apiPort is the API server's port inside the cluster's namespace.
	apiPort = 6443
)

// credentials is where a component's client certificate and key are.
type credentials struct{ cert, key string }

// clusterPKI is the cluster's certificates as files under its pki directory.
type clusterPKI struct {
	dir                   string
	caCert, caKey         string
	apiserver             credentials
	apiserverKubelet      credentials // the API server's identity towards kubelets
	saKey, saPub          string
	admin                 credentials
	components            map[string]credentials // by kubeconfig name
	caPEM                 []byte
	adminPEM, adminKeyPEM []byte
}

// makePKI issues every certificate the cluster's components use, under one CA.
func makePKI(dir string, nodes []Node) (*clusterPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := pki.NewCA("cluster.local", caValidity)
	if err != nil {
		return nil, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	p := &clusterPKI{dir: dir, components: map[string]credentials{}, caPEM: ca.CertPEM()}
	write := func(name string, data []byte) (string, error) {
		path := filepath.Join(dir, name)
		return path, os.WriteFile(path, data, 0o600)
	}
	if p.caCert, err = write("ca.crt", p.caPEM); err != nil {
		return nil, err
	}
	if p.caKey, err = write("ca.key", caKey); err != nil {
		return nil, err
	}
	issue := func(file string, subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (credentials, *pki.Leaf, error) {
		leaf, err := ca.IssueNamed(subject, []x509.ExtKeyUsage{usage}, dns, ips, certValidity)
		if err != nil {
			return credentials{}, nil, fmt.Errorf("certificate %s: %w", file, err)
		}
		var c credentials
		if c.cert, err = write(file+".crt", leaf.CertPEM); err != nil {
			return c, nil, err
		}
		c.key, err = write(file+".key", leaf.KeyPEM)
		return c, leaf, err
	}
	client := x509.ExtKeyUsageClientAuth
	if p.apiserver, _, err = issue("apiserver", pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IP(nodeAddress(0).AsSlice()), net.IP(serviceAddress(1).AsSlice())}); err != nil {
		return nil, err
	}
	if p.apiserverKubelet, _, err = issue("apiserver-kubelet-client", pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, client, nil, nil); err != nil {
		return nil, err
	}
	var adminLeaf *pki.Leaf
	if p.admin, adminLeaf, err = issue("admin", pkix.Name{CommonName: "meshmark-admin", Organization: []string{"system:masters"}}, client, nil, nil); err != nil {
		return nil, err
	}
	p.adminPEM, p.adminKeyPEM = adminLeaf.CertPEM, adminLeaf.KeyPEM
	identities := map[string]pkix.Name{
		"controller-manager": {CommonName: "system:kube-controller-manager"},
		"scheduler":          {CommonName: "system:kube-scheduler"},
		"kube-proxy":         {CommonName: "system:kube-proxy"},
	}
	for _, n := range nodes {
		identities[n.Name] = pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}}
	}
	for name, subject := range identities {
		c, _, err := issue(name, subject, client, nil, nil)
		if err != nil {
			return nil, err
		}
		p.components[name] = c
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	if p.saKey, err = write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)})); err != nil {
		return nil, err
	}
	if p.saPub, err = write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})); err != nil {
		return nil, err
	}
	return p, nil
}

// kubeconfig writes a kubeconfig for one component that reaches the API server at
// server with its own certificate, and returns its path.
func (p *clusterPKI) kubeconfig(dir, name, server string, c credentials) (string, error) {
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: %s
  context: {cluster: cluster, user: %s}
current-context: %s
`, server, p.caCert, name, c.cert, c.key, name, name, name)
	path := filepath.Join(dir, name+".conf")
	return path, os.WriteFile(path, []byte(body), 0o600)
}
