// Package kubetest starts a real Kubernetes control plane for tests: Debian's etcd, and
// kube-apiserver, kube-controller-manager and kube-scheduler built from the Go module
// proxy by `meshmark setup` (scripts/build-kube.sh), with kwok standing in for the
// kubelets. Objects, RBAC, admission, scheduling, garbage collection and namespace
// deletion are the real ones; pods run only on paper: kwok marks them running and ready,
// but no container starts, so nothing can be measured on this cluster. A port-forward to
// a pod's port is real as far as the API server and kwok's kubelet endpoint; kwok then
// dials the address a test names with ForwardPodPort. Each node's kubelet resource
// metrics (/metrics/resource) are kwok's too: real as far as the API server's node proxy
// and the kubelet's format, with each container's usage what the test stated
// (UsageAnnotations). kwok gives pods addresses but nothing listens there: a test puts
// a server of its own behind a pod's port for the API server's pod proxy with
// ReachPodPort.
//
// Everything listens on loopback only. Nodes and pods have addresses of 198.18.0.0/15
// that nothing dials, since the API server's node and pod proxies refuse loopback ones;
// the API server reaches them through the cluster's own egress proxy (egressProxy),
// which maps each node to its kwok on loopback, and each pod port a test serves to the
// test's server.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kwokcrd "sigs.k8s.io/kwok/kustomize/crd"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

// Binaries are the programs a test cluster runs, in start order.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// Cluster is a running test control plane.
type Cluster struct {
	// Kubeconfig is a kubeconfig file whose current context is cluster-admin.
	Kubeconfig string
	// Context is the admin context's name; ViewerContext authenticates a user that
	// RBAC grants nothing, for denial tests.
	Context, ViewerContext string
	// Nodes are the names of the kwok nodes.
	Nodes []string

	dir    string
	procs  []*process
	logs   []string
	egress *egressProxy
	once   sync.Once
}

// process is a started control-plane program and its end.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Options shape a test cluster.
type Options struct {
	Nodes int // kwok nodes, default 2
	// NodeLabels are put on every node, and node i also gets meshmark.dev/test-node=i.
	NodeLabels map[string]string
	// NoResourceMetrics are nodes (by index) whose kubelet endpoint serves no
	// /metrics/resource, as a kubelet that cannot be read. Every other node's serves
	// kwok's emulation of it, with each container's usage as UsageAnnotations set it.
	NoResourceMetrics []int
	// PodSecurity, when set, is the Pod Security level the API server enforces on
	// namespaces that carry no level of their own ("baseline", "restricted"), as a
	// cluster configured stricter than Kubernetes' default (privileged) does.
	PodSecurity string
}

// Missing returns the binaries of Binaries that cannot be found, with the command that
// installs them.
func Missing() (missing []string, install string) {
	for _, b := range Binaries {
		if _, err := find(b); err != nil {
			missing = append(missing, b)
		}
	}
	return missing, "make setup (or: meshmark setup --for test)"
}

func find(name string) (string, error) {
	p := filepath.Join(prereq.ToolsDir(), "bin", name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return exec.LookPath(name)
}

// Start brings a control plane up under dir and waits until it schedules pods onto ready
// nodes. Stop it with Stop; a test process that dies leaves processes that `pkill -f dir`
// finds, since every argv names dir.
func Start(ctx context.Context, dir string, opts Options) (c *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes > 16 {
		return nil, fmt.Errorf("test cluster: %d nodes; at most 16 (each gets a /22 of 198.19.0.0/18 for its pods)", opts.Nodes)
	}
	if missing, how := Missing(); len(missing) > 0 {
		return nil, fmt.Errorf("test cluster needs %s: %s", strings.Join(missing, ", "), how)
	}
	c = &Cluster{dir: dir, Context: "admin", ViewerContext: "viewer"}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, c.logTails())
			c.Stop()
			c = nil
		}
	}()
	nodeIPs := make([]net.IP, opts.Nodes)
	for i := range nodeIPs {
		nodeIPs[i] = nodeAddress(i)
	}
	pki, err := newPKI(dir, nodeIPs)
	if err != nil {
		return c, err
	}
	ports, err := freePorts(3 + opts.Nodes)
	if err != nil {
		return c, err
	}
	egressConfig, err := c.startEgress(dir, pki, nodeIPs, ports[3:])
	if err != nil {
		return c, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := c.start(ctx, "etcd", nil,
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--unsafe-no-fsync"); err != nil {
		return c, err
	}
	server := "https://127.0.0.1:" + strconv.Itoa(ports[2])
	var admission []string
	if opts.PodSecurity != "" {
		path := filepath.Join(dir, "admission.yaml")
		config := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults: {enforce: %q, enforce-version: latest}
    exemptions: {namespaces: [kube-system]}
`, opts.PodSecurity)
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			return c, err
		}
		admission = []string{"--admission-control-config-file", path}
	}
	if err := c.start(ctx, "kube-apiserver", nil, append(admission,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		// The API server refuses to publish a loopback address as the kubernetes
		// Service's endpoint; nothing in the tests calls it from a pod.
		"--endpoint-reconciler-type", "none",
		"--secure-port", strconv.Itoa(ports[2]),
		"--tls-cert-file", pki.serverCert, "--tls-private-key-file", pki.serverKey,
		"--client-ca-file", pki.caCert,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pki.saKey, "--service-account-signing-key-file", pki.saKey,
		// No network is made for these: they are numbers the API server hands out. Still
		// the benchmarking range, so nothing can be mistaken for a real network.
		"--service-cluster-ip-range", "198.19.240.0/20",
		"--authorization-mode", "Node,RBAC",
		"--disable-admission-plugins", "TaintNodesByCondition",
		// Debian's etcd is 3.4; over it the API server's watch cache fell behind, and
		// controllers and kwok waited for their own writes (pods ready 30-45 s after
		// scheduling, namespaces over a minute to go, growing with the cluster's age).
		// Without the cache, watches read etcd directly: 0.5 s and 6 s, steadily.
		"--watch-cache=false",
		// Port-forwards and the node proxy go to kwok's kubelet endpoint on the node's
		// InternalIP, through the egress proxy, the only one that knows where that is.
		"--kubelet-preferred-address-types", "InternalIP",
		"--egress-selector-config-file", egressConfig,
		"--kubelet-certificate-authority", pki.caCert,
		"--kubelet-client-certificate", pki.kubeletClientCert, "--kubelet-client-key", pki.kubeletClientKey,
		"--cert-dir", filepath.Join(dir, "apiserver-certs"))...); err != nil {
		return c, err
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, server, pki); err != nil {
		return c, err
	}
	client, err := c.Client()
	if err != nil {
		return c, err
	}
	if err := c.waitFor(ctx, 60*time.Second, "the API server", func() error {
		_, err := client.Discovery().ServerVersion()
		return err
	}); err != nil {
		return c, err
	}
	if err := c.start(ctx, "kube-controller-manager", nil,
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "0",
		"--service-account-private-key-file", pki.saKey, "--root-ca-file", pki.caCert,
		"--use-service-account-credentials=false",
		// The namespace controller makes two calls per resource type to empty a
		// namespace; at the default client rate a deletion took 20 s here.
		"--kube-api-qps", "1000", "--kube-api-burst", "2000",
		// Pod CIDRs are kwok's to hand out. The node lifecycle controller judges nodes by
		// kubelet leases, which kwok's nodes do not renew here: it would mark them
		// unreachable after 40 s and evict their pods. Nodes here are Ready because kwok
		// says so, so they are created without the not-ready taint (see the API server's
		// admission flags) and nothing judges their health.
		"--controllers", "*,-nodeipam,-nodelifecycle"); err != nil {
		return c, err
	}
	if err := c.start(ctx, "kube-scheduler", nil,
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "0"); err != nil {
		return c, err
	}
	// kwok's own default stages: nodes become Ready and keep a heartbeat; pods are
	// scheduled, become Ready, and go when deleted.
	stages := strings.Join([]string{nodefast.DefaultNodeInit, nodeheartbeat.DefaultNodeHeartbeat,
		podfast.DefaultPodReady, podfast.DefaultPodComplete, podfast.DefaultPodDelete}, "\n---\n")
	// kwok's PortForward objects say where a pod's ports really lead, so that a
	// port-forward through the API server reaches a process of the test.
	if err := c.createCRD(ctx, kwokcrd.PortForward); err != nil {
		return c, err
	}
	// kwok's Logs objects say which file a container's log is, so that the API server's
	// pods/log reads what a test wrote (CrashLoops).
	if err := c.createCRD(ctx, kwokcrd.Logs); err != nil {
		return c, err
	}
	// One kwok per node, each serving that node's kubelet endpoint on a loopback port of
	// its own, as every node has its own kubelet: the API server reaches a node's
	// /metrics/resource at the node's address and port (which the egress proxy maps to
	// that loopback port), and a single kwok could serve only one node there.
	for i := 0; i < opts.Nodes; i++ {
		name := fmt.Sprintf("kwok-node-%d", i)
		config := stages
		if !slices.Contains(opts.NoResourceMetrics, i) {
			metric, err := resourceMetric(name)
			if err != nil {
				return c, err
			}
			config += "\n---\n" + metric + "\n---\n" + containerUsage
		}
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			return c, err
		}
		kubeletPort := strconv.Itoa(ports[3+i])
		if err := c.startAs(ctx, name, "kwok", nil,
			"--config", path,
			"--kubeconfig", c.Kubeconfig,
			"--manage-single-node", name,
			// Pods of different nodes get addresses of different ranges.
			"--cidr", fmt.Sprintf("198.19.%d.0/22", 4*i),
			"--node-ip", nodeIPs[i].String(), "--node-port", kubeletPort,
			"--server-address", "127.0.0.1:"+kubeletPort,
			"--tls-cert-file", pki.kubeletCert, "--tls-private-key-file", pki.kubeletKey,
			"--enable-crds", "PortForward,Logs"); err != nil {
			return c, err
		}
	}
	for i := 0; i < opts.Nodes; i++ {
		name := fmt.Sprintf("kwok-node-%d", i)
		// The labels a kubelet puts on its node, which charts select on (Linkerd's
		// schedule every pod by kubernetes.io/os).
		labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"meshmark.dev/test-node": strconv.Itoa(i), "type": "kwok"}
		for k, v := range opts.NodeLabels {
			labels[k] = v
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return c, fmt.Errorf("create node %s: %w", name, err)
		}
		c.Nodes = append(c.Nodes, name)
	}
	err = c.waitFor(ctx, 60*time.Second, "kwok nodes ready and the default service account", func() error {
		if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		for _, n := range c.Nodes {
			node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, cond := range node.Status.Conditions {
				ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
			}
			if !ready {
				return fmt.Errorf("node %s not ready", n)
			}
		}
		return nil
	})
	return c, err
}

// createCRD creates a CustomResourceDefinition from its YAML and waits until it is
// established.
func (c *Cluster) createCRD(ctx context.Context, def []byte) error {
	rc, err := c.restConfig()
	if err != nil {
		return err
	}
	ext, err := apiextensions.NewForConfig(rc)
	if err != nil {
		return err
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal(def, &crd); err != nil {
		return fmt.Errorf("CRD: %w", err)
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CRD %s: %w", crd.Name, err)
	}
	return c.waitFor(ctx, 30*time.Second, "CRD "+crd.Name, func() error {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
				return nil
			}
		}
		return errors.New("not established")
	})
}

// ForwardPodPort makes a port-forward to pod's port reach target (host:port) instead:
// kwok's kubelet endpoint, which the API server calls for port-forwards, dials it. This
// is how a test puts a real process behind a pod that kwok only runs on paper.
func (c *Cluster) ForwardPodPort(ctx context.Context, namespace, pod string, port int, target string) error {
	host, p, err := net.SplitHostPort(target)
	if err != nil {
		return err
	}
	targetPort, err := strconv.Atoi(p)
	if err != nil {
		return err
	}
	return c.createKwok(ctx, "portforwards", map[string]any{
		"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "PortForward",
		"metadata": map[string]any{"name": pod, "namespace": namespace},
		"spec": map[string]any{"forwards": []any{map[string]any{
			"ports":  []any{int64(port)},
			"target": map[string]any{"address": host, "port": int64(targetPort)},
		}}},
	})
}

// createKwok creates one of kwok's own objects (resource of kwok.x-k8s.io/v1alpha1),
// which tell kwok how a pod it runs on paper behaves.
func (c *Cluster) createKwok(ctx context.Context, resource string, object map[string]any) error {
	rc, err := c.restConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	meta := object["metadata"].(map[string]any)
	gvr := schema.GroupVersionResource{Group: "kwok.x-k8s.io", Version: "v1alpha1", Resource: resource}
	_, err = dyn.Resource(gvr).Namespace(meta["namespace"].(string)).Create(ctx, &unstructured.Unstructured{Object: object}, metav1.CreateOptions{})
	return err
}

func (c *Cluster) restConfig() (*rest.Config, error) {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
}

// Client returns an admin clientset.
func (c *Cluster) Client() (kubernetes.Interface, error) {
	rc, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// Stop ends every process, newest first, and removes nothing: dir belongs to the caller
// (usually t.TempDir).
func (c *Cluster) Stop() {
	c.once.Do(func() {
		for i := len(c.procs) - 1; i >= 0; i-- {
			p := c.procs[i]
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if c.egress != nil {
			c.egress.close()
		}
	})
}

func (c *Cluster) start(ctx context.Context, name string, env []string, args ...string) error {
	return c.startAs(ctx, name, name, env, args...)
}

// startAs starts program bin under name, which names its log and its errors.
func (c *Cluster) startAs(ctx context.Context, name, bin string, env []string, args ...string) error {
	bin, err := find(bin)
	if err != nil {
		return err
	}
	logPath := filepath.Join(c.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that a Ctrl-C meant for `go test` reaches the test's
	// cleanup rather than killing the control plane under it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	c.procs = append(c.procs, p)
	c.logs = append(c.logs, logPath)
	return ctx.Err()
}

// exited names the first program that has ended, so that a wait gives up at once
// instead of running into its time limit.
func (c *Cluster) exited() error {
	for _, p := range c.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v", p.name, p.err)
		default:
		}
	}
	return nil
}

func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, p := range c.logs {
		data, _ := os.ReadFile(p)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 8 {
			lines = lines[len(lines)-8:]
		}
		fmt.Fprintf(&b, "\n--- %s (last lines)\n%s", filepath.Base(p), strings.Join(lines, "\n"))
	}
	return b.String()
}

func (c *Cluster) waitFor(ctx context.Context, limit time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(limit)
	for {
		if err := c.exited(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// testPKI is the cluster's certificates as files: a CA, the API server's serving
// certificate, two client certificates (system:masters and a user with no rights) and the
// service-account signing key.
type testPKI struct {
	caCert, serverCert, serverKey, saKey string
	// kwok's kubelet endpoint serves kubeletCert; the API server reaches it as
	// kubeletClient (port-forward, exec and logs go that way), through the egress proxy,
	// which serves egressCert and takes kubeletClient too.
	kubeletCert, kubeletKey, kubeletClientCert, kubeletClientKey string
	egressCert, egressKey                                        string
	caPEM                                                        []byte
	admin, viewer                                                [2][]byte // cert, key PEM
}

func newPKI(dir string, nodeIPs []net.IP) (*testPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshmark test cluster CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) ([2][]byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return [2][]byte{}, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: subject,
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return [2][]byte{}, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return [2][]byte{}, err
		}
		return [2][]byte{
			pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		}, nil
	}
	server, err := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP("198.19.240.1")}, []string{"localhost", "kubernetes.default.svc"})
	if err != nil {
		return nil, err
	}
	p := &testPKI{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	if p.admin, err = issue(3, pkix.Name{CommonName: "meshmark-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	if p.viewer, err = issue(4, pkix.Name{CommonName: "meshmark-nobody"}, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	// The API server checks a kubelet's certificate against the node address it dialed
	// (--kubelet-certificate-authority), the egress proxy's mapping being unseen by TLS.
	kubelet, err := issue(5, pkix.Name{CommonName: "kwok-kubelet"}, x509.ExtKeyUsageServerAuth, nodeIPs, nil)
	if err != nil {
		return nil, err
	}
	egress, err := issue(7, pkix.Name{CommonName: "kubetest-egress-proxy"}, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return nil, err
	}
	kubeletClient, err := issue(6, pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	files := []struct {
		path *string
		name string
		data []byte
	}{
		{&p.caCert, "ca.crt", p.caPEM},
		{&p.serverCert, "apiserver.crt", server[0]},
		{&p.serverKey, "apiserver.key", server[1]},
		{&p.saKey, "sa.key", saPEM},
		{&p.kubeletCert, "kubelet.crt", kubelet[0]},
		{&p.kubeletKey, "kubelet.key", kubelet[1]},
		{&p.kubeletClientCert, "kubelet-client.crt", kubeletClient[0]},
		{&p.kubeletClientKey, "kubelet-client.key", kubeletClient[1]},
		{&p.egressCert, "egress-proxy.crt", egress[0]},
		{&p.egressKey, "egress-proxy.key", egress[1]},
	}
	for _, f := range files {
		*f.path = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func writeKubeconfig(path, server string, p *testPKI) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\ncurrent-context: admin\nclusters:\n- name: test\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n", server, b64(p.caPEM))
	b.WriteString("contexts:\n- name: admin\n  context: {cluster: test, user: admin}\n- name: viewer\n  context: {cluster: test, user: viewer}\n")
	fmt.Fprintf(&b, "users:\n- name: admin\n  user:\n    client-certificate-data: %s\n    client-key-data: %s\n", b64(p.admin[0]), b64(p.admin[1]))
	fmt.Fprintf(&b, "- name: viewer\n  user:\n    client-certificate-data: %s\n    client-key-data: %s\n", b64(p.viewer[0]), b64(p.viewer[1]))
	if _, err := clientcmd.Load(b.Bytes()); err != nil {
		return errors.New("test kubeconfig does not parse: " + err.Error())
	}
	return os.WriteFile(path, b.Bytes(), 0o600)
}

func b64(data []byte) string { return base64.StdEncoding.EncodeToString(data) }
