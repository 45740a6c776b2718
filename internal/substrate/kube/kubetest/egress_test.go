package kubetest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"
)

// The egress proxy tunnels to a node's kwok and to nothing else: any other target is
// refused before anything is dialed.
func TestEgressProxyConnectsOnlyNodesKubelets(t *testing.T) {
	kwok := listen(t)
	go func() {
		for {
			c, err := kwok.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	other := listen(t)
	kwokPort := strconv.Itoa(kwok.Addr().(*net.TCPAddr).Port)
	otherPort := strconv.Itoa(other.Addr().(*net.TCPAddr).Port)
	node := nodeAddress(0).String()

	pl := listen(t)
	p := serveEgress(pl, map[string]string{net.JoinHostPort(node, kwokPort): kwok.Addr().String()})
	defer p.close()
	proxy := pl.Addr().String()

	for _, target := range []string{
		"127.0.0.1:" + otherPort,                            // loopback as such
		net.JoinHostPort(node, otherPort),                   // a node's address, another port
		net.JoinHostPort(nodeAddress(1).String(), kwokPort), // no such node
		"localhost:" + kwokPort,
	} {
		if _, _, code := connectVia(t, proxy, target); code != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d, want 403", target, code)
		}
	}
	// A plain request naming the node is no tunnel either.
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET http://"+net.JoinHostPort(node, kwokPort)+"/ HTTP/1.1\r\nHost: "+node+"\r\n\r\n")
	if res, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("GET through the proxy: %v %v, want 403", res, err)
	}
	// The proxy answers only after its dial, so a dial would be waiting here.
	_ = other.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if c, err := other.Accept(); err == nil {
		c.Close()
		t.Error("the proxy dialed a target it refused")
	}

	br, tunnel, code := connectVia(t, proxy, net.JoinHostPort(node, kwokPort))
	if code != http.StatusOK {
		t.Fatalf("CONNECT to node 0's kubelet: %d, want 200", code)
	}
	_, _ = io.WriteString(tunnel, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("through the tunnel: %q %v, want kwok's echo", line, err)
	}
}

func listen(t *testing.T) *net.TCPListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// connectVia asks the proxy at proxyAddr for a tunnel to target, as the API server does.
func connectVia(t *testing.T, proxyAddr, target string) (*bufio.Reader, net.Conn, int) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", proxyAddr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "CONNECT "+target+" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return br, conn, res.StatusCode
}

// ReachPodPort opens a pod's port to a server of the test, and only a pod address of
// the cluster to a loopback server; leading the address elsewhere later (kwok hands
// addresses out again) ends the tunnels made to it before, which the API server would
// otherwise reuse for the new pod.
func TestReachPodPortOpensOnePodPort(t *testing.T) {
	echo := func() *net.TCPListener {
		l := listen(t)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(c, c); c.Close() }()
			}
		}()
		return l
	}
	first, second := echo(), echo()
	pl := listen(t)
	c := &Cluster{egress: serveEgress(pl, map[string]string{})}
	defer c.egress.close()
	proxy := pl.Addr().String()

	for _, bad := range []struct {
		ip, target string
	}{
		{"198.18.255.1", first.Addr().String()}, // a node's address
		{"10.0.0.7", first.Addr().String()},     // no pod of this cluster
		{"198.19.0.7", "192.0.2.1:80"},          // off loopback
		{"198.19.0.7", "localhost:80"},          // a name, not an address
	} {
		if err := c.ReachPodPort(bad.ip, 15090, bad.target); err == nil {
			t.Errorf("ReachPodPort(%s, %s) accepted", bad.ip, bad.target)
		}
	}
	if err := c.ReachPodPort("198.19.0.7", 15090, first.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if _, _, code := connectVia(t, proxy, "198.19.0.7:4191"); code != http.StatusForbidden {
		t.Errorf("CONNECT to another port of the pod: %d, want 403", code)
	}
	br, tunnel, code := connectVia(t, proxy, "198.19.0.7:15090")
	if code != http.StatusOK {
		t.Fatalf("CONNECT to the pod's port: %d, want 200", code)
	}
	_, _ = io.WriteString(tunnel, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}
	if err := c.ReachPodPort("198.19.0.7", 15090, second.Addr().String()); err != nil {
		t.Fatal(err)
	}
	_ = tunnel.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := br.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the tunnel to the address's earlier server stayed open (%v)", err)
	}
	if _, _, code := connectVia(t, proxy, "198.19.0.7:15090"); code != http.StatusOK {
		t.Errorf("CONNECT after the address moved: %d", code)
	}
}
