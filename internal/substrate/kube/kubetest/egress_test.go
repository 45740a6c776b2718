package kubetest

import (
	"bufio"
	"io"
	"net"
	"net/http"
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
