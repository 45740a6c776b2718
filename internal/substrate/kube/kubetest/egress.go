package kubetest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// nodeAddress is node i's address: a name the egress proxy maps, never dialed, and of
// the benchmarking range, so that it cannot be mistaken for a real network.
func nodeAddress(i int) net.IP { return net.IPv4(198, 18, 255, byte(1+i)) }

// startEgress serves the cluster's egress proxy on loopback, mapping each node address
// with its kubelet port to that port on loopback, and returns the API server's
// EgressSelectorConfiguration file for it. The proxy speaks TLS and takes the API
// server's kubelet client certificate only: kube-apiserver (1.37) dials an HTTPConnect
// proxy over TCP with TLS whatever the URL's scheme, and an http:// one crashes it.
func (c *Cluster) startEgress(dir string, pki *testPKI, nodeIPs []net.IP, kubeletPorts []int) (string, error) {
	cert, err := tls.LoadX509KeyPair(pki.egressCert, pki.egressKey)
	if err != nil {
		return "", err
	}
	cas := x509.NewCertPool()
	cas.AppendCertsFromPEM(pki.caPEM)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	routes := map[string]string{}
	for i, ip := range nodeIPs {
		port := strconv.Itoa(kubeletPorts[i])
		routes[net.JoinHostPort(ip.String(), port)] = "127.0.0.1:" + port
	}
	c.egress = serveEgress(tls.NewListener(l, &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: cas,
	}), routes)
	config := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: https://%s
        tlsConfig:
          caBundle: %s
          clientCert: %s
          clientKey: %s
`, l.Addr(), pki.caCert, pki.kubeletClientCert, pki.kubeletClientKey)
	path := filepath.Join(dir, "egress-selector.yaml")
	return path, os.WriteFile(path, []byte(config), 0o600)
}

// egressProxy is the API server's only way to the nodes and the pods (its "cluster"
// egress selection, which its node proxy, its pod proxy and its port-forwards take): an
// HTTP CONNECT proxy that maps each node's address and kubelet port to kwok's server for
// that node on loopback, and each pod port a test serves (ReachPodPort) to the test's
// server on loopback. It lets nodes and pods have addresses that the API server's
// proxies accept (they refuse loopback) while nothing of the test listens on, or sends
// to, any interface but loopback: those addresses are names this proxy knows, never
// dialed.
type egressProxy struct {
	srv  *http.Server
	done chan struct{}

	mu     sync.Mutex
	routes map[string]string   // node or pod address:port -> loopback address:port
	conns  map[net.Conn]string // both ends of every tunnel, by the address it was for
}

// podNetwork holds every address kwok gives a pod of the test cluster (a /22 per node).
var podNetwork = netip.MustParsePrefix("198.19.0.0/18")

// ReachPodPort makes the API server's connections to a pod's address and port (its pod
// proxy, /api/v1/namespaces/NS/pods/NAME:PORT/proxy/...) reach target (a loopback
// host:port) instead. kwok gives pods addresses but runs no container behind them, so
// this is how a test puts a real server, such as a stand-in for a mesh proxy's metrics
// endpoint, at a pod's address.
func (c *Cluster) ReachPodPort(podIP string, port int, target string) error {
	ip, err := netip.ParseAddr(podIP)
	if err != nil || !podNetwork.Contains(ip) {
		return fmt.Errorf("reach pod port: %q is not a pod address of the test cluster (%s)", podIP, podNetwork)
	}
	host, _, err := net.SplitHostPort(target)
	if addr, perr := netip.ParseAddr(host); err != nil || perr != nil || !addr.IsLoopback() {
		return fmt.Errorf("reach pod port: target %q is not a loopback host:port; the test cluster sends nothing elsewhere", target)
	}
	if port <= 0 || port > 65535 {
		return fmt.Errorf("reach pod port: port %d", port)
	}
	addr := net.JoinHostPort(podIP, strconv.Itoa(port))
	c.egress.mu.Lock()
	defer c.egress.mu.Unlock()
	c.egress.routes[addr] = target
	// The API server keeps connections to a pod's port alive: one made for an earlier
	// pod at this address (kwok hands addresses out again) would still lead to that
	// pod's server.
	for conn, to := range c.egress.conns {
		if to == addr {
			conn.Close()
		}
	}
	return nil
}

// serveEgress serves an egressProxy on l until its close.
func serveEgress(l net.Listener, routes map[string]string) *egressProxy {
	p := &egressProxy{routes: routes, done: make(chan struct{}), conns: map[net.Conn]string{}}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(l); close(p.done) }()
	return p
}

func (p *egressProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	target, ok := p.routes[r.URL.Host]
	p.mu.Unlock()
	if r.Method != http.MethodConnect || !ok {
		http.Error(w, "not a node's kubelet endpoint or a pod port the test serves", http.StatusForbidden)
		return
	}
	upstream, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	if !p.track(r.URL.Host, conn, upstream) {
		return
	}
	defer p.untrack(conn, upstream)
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	go func() {
		_, _ = io.Copy(upstream, brw.Reader)
		if tc, ok := upstream.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(conn, upstream)
}

// track keeps a tunnel's connections for close, which http.Server.Close leaves alone once
// hijacked; it closes them at once if the proxy is already closed.
func (p *egressProxy) track(addr string, cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = addr
	}
	return true
}

func (p *egressProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

// close ends the proxy and every tunnel through it.
func (p *egressProxy) close() {
	_ = p.srv.Close()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
