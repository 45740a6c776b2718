package testbed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
)

// helperEnv makes the test binary act as a helper process instead of running tests:
// "serve" runs a tiny HTTP server, "child" brings up a testbed and waits to be killed.
const helperEnv = "MESHMARK_TESTBED_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "serve":
		serveHelper()
		return
	case "child":
		childHelper()
		return
	case "signal":
		signalHelper()
		return
	}
	os.Exit(m.Run())
}

// serveHelper answers every request with the pod it runs in and its uid.
func serveHelper() {
	pod := os.Getenv("POD_NAME")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "pod=%s uid=%d\n", pod, os.Getuid())
	})
	if err := http.ListenAndServe(":"+os.Getenv("PORT"), nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// childHelper brings up a testbed with a running process, reports its id and blocks
// until the test kills it.
func childHelper() {
	ctx := context.Background()
	tb, err := New(ctx, Options{Nodes: 2})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	app, err := tb.Deploy(ctx, AppSpec{Name: "kill", Deployments: []Deployment{{Service: "svc", Port: 8080, Replicas: 2}}})
	if err == nil {
		_, err = tb.Start(ctx, app.Clients[0], substrate.ProcessSpec{Name: "sleeper", Argv: []string{"sleep", "600"}, UID: substrate.WorkloadUID})
	}
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("READY", tb.ID())
	select {}
}

// signalHelper is a well-behaved command: it closes its testbed from a deferred path
// when SIGINT or SIGTERM cancels its context, as the CLI does.
func signalHelper() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tb, err := New(ctx, Options{Nodes: 2})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	defer func() {
		if err := tb.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}()
	app, err := tb.Deploy(ctx, bookinfo())
	if err == nil {
		_, err = tb.Start(ctx, app.Clients[0], substrate.ProcessSpec{Name: "sleeper", Argv: []string{"sleep", "600"}})
	}
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	fmt.Println("READY", tb.ID())
	<-ctx.Done()
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
}

func newTestbed(t testing.TB, opts Options) *Testbed {
	t.Helper()
	tb, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Error(err)
		}
	})
	return tb
}

var (
	lifetimes = regexp.MustCompile(`(valid|preferred)_lft \S+`)
	counters  = regexp.MustCompile(`\[\d+:\d+\]`)
)

// hostNetworkState is everything of the host network namespace a testbed must not touch.
func hostNetworkState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, argv := range [][]string{
		{"ip", "-o", "link"},
		{"ip", "-o", "addr"},
		{"ip", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
		{"iptables-save"},
		{"ip6tables-save"},
	} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
		fmt.Fprintf(&b, "## %s\n", strings.Join(argv, " "))
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "#") { // iptables-save's timestamped comments
				continue
			}
			line = lifetimes.ReplaceAllString(line, "$1_lft")
			b.WriteString(counters.ReplaceAllString(line, "[]") + "\n")
		}
	}
	return b.String()
}

// runObjects lists what exists of a run: namespaces, /etc/netns entries, run dir.
func runObjects(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{
		filepath.Join(netnsDir, Prefix+id+"-*"),
		filepath.Join(etcNetnsDir, Prefix+id+"-*"),
		filepath.Join(RunRoot, id),
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

func TestHostNetworkUntouched(t *testing.T) {
	requireRoot(t)
	before := hostNetworkState(t)
	tb, err := New(context.Background(), Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	app, err := tb.Deploy(context.Background(), bookinfo())
	if err != nil {
		tb.Close()
		t.Fatal(err)
	}
	if _, err := tb.Start(context.Background(), app.Clients[0], substrate.ProcessSpec{Name: "sleeper", Argv: []string{"sleep", "600"}, UID: substrate.WorkloadUID}); err != nil {
		tb.Close()
		t.Fatal(err)
	}
	during := hostNetworkState(t)
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Close(); err != nil { // idempotent
		t.Fatalf("second Close: %v", err)
	}
	after := hostNetworkState(t)
	if before != during {
		t.Errorf("host network state changed while the testbed ran:\nbefore:\n%s\nduring:\n%s", before, during)
	}
	if before != after {
		t.Errorf("host network state changed after Close:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if left := runObjects(t, tb.ID()); len(left) > 0 {
		t.Errorf("left behind after Close: %v", left)
	}
}

func bookinfo() AppSpec {
	return AppSpec{
		Name: "bookinfo",
		Deployments: []Deployment{
			{Service: "productpage", Version: "v1", Port: 9080},
			{Service: "details", Version: "v1", Port: 9080},
			{Service: "reviews", Version: "v1", Weight: 34, Port: 9080},
			{Service: "reviews", Version: "v2", Weight: 33, Port: 9080},
			{Service: "reviews", Version: "v3", Weight: 33, Port: 9080},
			{Service: "ratings", Version: "v1", Port: 9080},
		},
	}
}

// startServer runs the test binary as an HTTP server in pod, as the workload uid. The
// binary is copied into the run dir, since the build cache is not readable by that uid.
func startServer(t *testing.T, tb *Testbed, p topology.Pod) {
	t.Helper()
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := tb.WriteFile(p, "bin/server", self, 0o750)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tb.Start(context.Background(), p, substrate.ProcessSpec{
		Name: "server",
		Role: substrate.RoleWorkload,
		Argv: []string{bin},
		Env:  []string{helperEnv + "=serve", fmt.Sprintf("PORT=%d", p.Port)},
		UID:  substrate.WorkloadUID,
		Ready: func(ctx context.Context) error {
			c, err := tb.DialContext(ctx, p, "tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
			if err == nil {
				c.Close()
			}
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// curlCount requests url n times from pod with one curl (through `ip netns exec`, so
// with the pod's /etc/hosts) and counts the answers by body. "Connection: close" makes
// every transfer a new connection, and so a new load-balancing decision.
func curlCount(t *testing.T, tb *Testbed, from topology.Pod, url string, n int) map[string]int {
	t.Helper()
	args := []string{"curl"}
	for i := 0; i < n; i++ {
		if i > 0 {
			args = append(args, "--next")
		}
		args = append(args, "-sS", "--max-time", "5", "-H", "Connection: close", url)
	}
	out, err := tb.Exec(context.Background(), from, nil, args...)
	if err != nil {
		t.Fatalf("curl from %s: %v", from.Name, err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		counts[line]++
	}
	return counts
}

func TestServiceReachability(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tb := newTestbed(t, Options{Nodes: 2})
	// Two endpoints on different nodes, a caller on node0 next to one of them, so that
	// both the cross-node path and the same-bridge (hairpin) path are used.
	ep0, err := tb.AddPod(ctx, PodSpec{Name: "reviews-v1-0", Node: "node0", Service: "reviews", Version: "v1", Port: 9080})
	if err != nil {
		t.Fatal(err)
	}
	ep1, err := tb.AddPod(ctx, PodSpec{Name: "reviews-v2-0", Node: "node1", Service: "reviews", Version: "v2", Port: 9080})
	if err != nil {
		t.Fatal(err)
	}
	vip, err := tb.AddService(ctx, "reviews", 9080, []topology.Pod{ep0, ep1})
	if err != nil {
		t.Fatal(err)
	}
	// The caller is added after the service: it must still get rules and hosts.
	caller, err := tb.AddPod(ctx, PodSpec{Name: "productpage-v1-0", Node: "node0", Service: "productpage", Version: "v1", Port: 9080})
	if err != nil {
		t.Fatal(err)
	}
	if !vipPrefix.Contains(vip) || ep0.IP == ep1.IP || ep0.Node == ep1.Node {
		t.Fatalf("bad addresses: vip %s, endpoints %s@%s %s@%s", vip, ep0.IP, ep0.Node, ep1.IP, ep1.Node)
	}
	startServer(t, tb, ep0)
	startServer(t, tb, ep1)

	out, err := tb.Exec(ctx, caller, nil, "getent", "hosts", "reviews")
	if err != nil || !strings.HasPrefix(string(out), vip.String()+" ") {
		t.Fatalf("getent hosts reviews in %s = %q, %v; want %s", caller.Name, out, err, vip)
	}
	out, err = tb.Exec(ctx, caller, nil, "getent", "hosts", "reviews.default.svc.cluster.local")
	if err != nil || !strings.HasPrefix(string(out), vip.String()+" ") {
		t.Fatalf("getent hosts reviews.default.svc.cluster.local = %q, %v", out, err)
	}

	const requests = 40
	want := map[string]bool{
		"pod=reviews-v1-0 uid=2000": true,
		"pod=reviews-v2-0 uid=2000": true,
	}
	check := func(what string, counts map[string]int) {
		t.Helper()
		total := 0
		for body, n := range counts {
			if !want[body] {
				t.Errorf("%s: unexpected answer %q (%d times)", what, body, n)
			}
			total += n
		}
		// With p=1/2 per request, one endpoint getting all 40 has probability 2^-39.
		if total != requests || len(counts) != 2 {
			t.Errorf("%s: %d answers spread as %v; want %d over both endpoints", what, total, counts, requests)
		}
		t.Logf("%s: %v", what, counts)
	}
	check("pod-level DNAT", curlCount(t, tb, caller, "http://reviews:9080/", requests))

	// A mesh profile may flush a pod's nat table; the node's rules must then do the
	// same job, including the hairpin to the endpoint on the caller's own bridge.
	if _, err := tb.Exec(ctx, caller, nil, "iptables", "-t", "nat", "-F", "OUTPUT"); err != nil {
		t.Fatal(err)
	}
	check("node-level DNAT", curlCount(t, tb, caller, "http://reviews.default:9080/", requests))
}

func TestDialContext(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tb := newTestbed(t, Options{Nodes: 2})
	app, err := tb.Deploy(ctx, AppSpec{
		Name:        "dial",
		Deployments: []Deployment{{Service: "web", Port: 8080}},
		ClientNode:  "node1",
	})
	if err != nil {
		t.Fatal(err)
	}
	server := app.Services[0].Versions[0].Endpoints[0]
	client := app.Clients[0]
	if server.Node != "node0" || client.Node != "node1" {
		t.Fatalf("placement: server on %s, client on %s; want node0 and node1", server.Node, client.Node)
	}
	startServer(t, tb, server)

	httpc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return tb.DialContext(ctx, client, network, addr)
		},
	}}
	for _, url := range []string{
		fmt.Sprintf("http://%s:8080/", server.IP),
		fmt.Sprintf("http://%s:8080/", app.Services[0].VIP),
		"http://web:8080/",
		"http://web.default.svc.cluster.local:8080/",
	} {
		resp, err := httpc.Get(url)
		if err != nil {
			t.Fatalf("GET %s from %s: %v", url, client.Name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.TrimSpace(string(body)); got != "pod=web-v1-0 uid=2000" {
			t.Errorf("GET %s = %q", url, got)
		}
	}
	// The connection really starts in the client pod: the server sees the client's IP.
	c, err := tb.DialContext(ctx, client, "tcp", fmt.Sprintf("%s:8080", server.IP))
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr)
	c.Close()
	if local.IP.String() != client.IP.String() {
		t.Errorf("dial from %s used local address %s; want %s", client.Name, local.IP, client.IP)
	}
	if _, err := tb.DialContext(ctx, client, "tcp", "nosuchservice:80"); err == nil {
		t.Error("dial to an unknown name succeeded")
	}
	if _, err := tb.DialContext(ctx, client, "tcp", fmt.Sprintf("%s:9", server.IP)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial to a closed port: err = %v; want connection refused", err)
	}
	// An address on the server's subnet that nobody has: ARP never answers, so only
	// the context ends the dial.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = tb.DialContext(short, client, "tcp", "198.18.1.250:80")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Errorf("dial to a silent address: err = %v after %v; want the context's deadline", err, time.Since(start))
	}
	// Other networks go through the locked-thread path.
	uc, err := tb.DialContext(ctx, client, "udp", fmt.Sprintf("%s:53", server.IP))
	if err != nil {
		t.Fatal(err)
	}
	if got := uc.LocalAddr().(*net.UDPAddr).IP.String(); got != client.IP.String() {
		t.Errorf("udp dial from %s used local address %s", client.Name, got)
	}
	uc.Close()
}

// A connection dialled as a uid is the one netfilter's owner match sees as that uid's:
// a rule rejecting uid 1337 (the way interception excludes the proxy's uid) stops it,
// and the same dial as root or as the workload uid goes through. The dialling thread
// is root again afterwards.
func TestDialContextAsUID(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tb := newTestbed(t, Options{Nodes: 1})
	app, err := tb.Deploy(ctx, AppSpec{Name: "dialas", Deployments: []Deployment{{Service: "web", Port: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	server, client := app.Services[0].Versions[0].Endpoints[0], app.Clients[0]
	startServer(t, tb, server)
	if out, err := tb.Exec(ctx, client, nil, "iptables", "-w", "-A", "OUTPUT", "-p", "tcp", "-m", "owner", "--uid-owner", "1337",
		"-j", "REJECT", "--reject-with", "tcp-reset"); err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	addr := fmt.Sprintf("%s:8080", server.IP)
	for range 3 { // threads are reused: each dial must start from root again
		if c, err := tb.DialContextAs(ctx, client, 1337, "tcp", addr); err == nil {
			c.Close()
			t.Fatal("dial as uid 1337 went through a rule rejecting uid 1337")
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial as uid 1337: %v; want connection refused (the rule's reset)", err)
		}
		for _, uid := range []int{0, 2000} {
			c, err := tb.DialContextAs(ctx, client, uid, "tcp", addr)
			if err != nil {
				t.Fatalf("dial as uid %d: %v", uid, err)
			}
			c.Close()
		}
		c, err := tb.DialContext(ctx, client, "tcp", addr)
		if err != nil {
			t.Fatalf("plain dial after dialling as 1337: %v", err)
		}
		c.Close()
	}
	if os.Geteuid() != 0 {
		t.Fatalf("euid %d after dialling as other uids", os.Geteuid())
	}
	if _, err := tb.DialContextAs(ctx, client, 1337, "udp", addr); err == nil {
		t.Error("udp dial as a uid accepted")
	}
}

// A listener opened in a pod is the pod's: another pod reaches it at the pod's address,
// the host namespace does not have it, and the thread that opened it is back home.
func TestListenInPod(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tb := newTestbed(t, Options{Nodes: 1})
	app, err := tb.Deploy(ctx, AppSpec{Name: "listenin", Deployments: []Deployment{{Service: "web", Port: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	server, client := app.Services[0].Versions[0].Endpoints[0], app.Clients[0]
	ln, err := tb.ListenIn(server, "tcp", ":19080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("from the pod"))
			c.Close()
		}
	}()
	c, err := tb.DialContext(ctx, client, "tcp", fmt.Sprintf("%s:19080", server.IP))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "from the pod" {
		t.Errorf("read %q from the pod's listener", got)
	}
	if hc, err := net.DialTimeout("tcp", "127.0.0.1:19080", time.Second); err == nil {
		hc.Close()
		t.Error("the pod's listener answers in the host namespace")
	}
	if _, err := tb.ListenIn(server, "udp", ":19081"); err == nil {
		t.Error("udp listener accepted")
	}
}

func TestProcessLifecycle(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	tb := newTestbed(t, Options{Nodes: 1, StopGrace: 500 * time.Millisecond})
	p, err := tb.AddPod(ctx, PodSpec{Name: "worker", Node: "node0"})
	if err != nil {
		t.Fatal(err)
	}
	path, err := tb.WriteFile(p, "conf/secret.txt", []byte("s3cret"), 0o640)
	if err != nil {
		t.Fatal(err)
	}
	// The workload uid reads a 0640 file through its group; the shell's child is in
	// the same process group and must die with it.
	proc, err := tb.Start(ctx, p, substrate.ProcessSpec{
		Name: "shell",
		Argv: []string{"sh", "-c", "id -u; cat " + path + "; echo; sleep 600 & wait"},
		UID:  substrate.WorkloadUID,
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var log []byte
	for time.Now().Before(deadline) {
		log, _ = os.ReadFile(proc.LogPath())
		if strings.Count(string(log), "\n") >= 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := string(log); got != "2000\ns3cret\n" {
		t.Fatalf("log = %q; want uid 2000 and the file content", got)
	}
	pids, err := netNSProcesses([]string{p.NetNS})
	if err != nil || len(pids) < 2 {
		t.Fatalf("processes in %s: %v, %v; want the shell and its sleep", p.NetNS, pids, err)
	}
	if err := proc.Stop(); err != nil {
		t.Fatal(err)
	}
	if pids, _ := netNSProcesses([]string{p.NetNS}); len(pids) != 0 {
		t.Errorf("after Stop, still running in the pod: %v", pids)
	}

	// Ready that never succeeds: Start fails within the timeout and leaves nothing.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = tb.Start(short, p, substrate.ProcessSpec{
		Name:  "never",
		Argv:  []string{"sleep", "600"},
		Ready: func(context.Context) error { return fmt.Errorf("not yet") },
	})
	if err == nil || !strings.Contains(err.Error(), "not yet") {
		t.Errorf("Start with failing Ready: err = %v", err)
	}
	if pids, _ := netNSProcesses([]string{p.NetNS}); len(pids) != 0 {
		t.Errorf("after failed Start, still running in the pod: %v", pids)
	}
	hostReuse, err := os.ReadFile("/proc/sys/net/ipv4/tcp_tw_reuse")
	if err != nil {
		t.Fatal(err)
	}
	want := "1"
	if strings.TrimSpace(string(hostReuse)) == "1" {
		want = "0"
	}
	if err := tb.Sysctl(p, map[string]string{"net.ipv4.tcp_tw_reuse": want}); err != nil {
		t.Fatal(err)
	}
	if out, err := tb.Exec(ctx, p, nil, "cat", "/proc/sys/net/ipv4/tcp_tw_reuse"); err != nil || strings.TrimSpace(string(out)) != want {
		t.Errorf("tcp_tw_reuse in the pod = %q, %v; want %s", out, err, want)
	}
	if after, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_tw_reuse"); string(after) != string(hostReuse) {
		t.Errorf("host tcp_tw_reuse changed from %q to %q", hostReuse, after)
	}
	if err := tb.Sysctl(p, map[string]string{"kernel.pid_max": "100000"}); err == nil {
		t.Error("Sysctl accepted a host-wide key")
	}
	if _, err := tb.WriteFile(p, "../escape", nil, 0o644); err == nil {
		t.Error("WriteFile accepted a path outside the pod directory")
	}
	if _, err := tb.AddPod(ctx, PodSpec{Name: "Bad_Name", Node: "node0"}); err == nil {
		t.Error("AddPod accepted an invalid name")
	}
	if _, err := tb.AddPod(ctx, PodSpec{Name: "x", Node: "node9"}); err == nil {
		t.Error("AddPod accepted an unknown node")
	}
}

// TestKilledRunIsCleaned kills a process that owns a testbed and checks that Clean
// removes all of that run, including its processes, and leaves a live run alone.
func TestKilledRunIsCleaned(t *testing.T) {
	requireRoot(t)
	before := hostNetworkState(t)
	live := newTestbed(t, Options{Nodes: 1})
	livePod, err := live.AddPod(context.Background(), PodSpec{Name: "alive", Node: "node0"})
	if err != nil {
		t.Fatal(err)
	}

	child, id := startChild(t, "child")
	// `ip netns exec` enters the namespace a moment after Start returned.
	var childPIDs []int
	for deadline := time.Now().Add(10 * time.Second); len(childPIDs) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		childPIDs, err = netNSProcesses(childNamespaces(t, id))
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(childPIDs) == 0 {
		t.Fatal("child's sleeper not found in its namespaces")
	}
	child.Process.Kill()
	child.Wait()
	if len(runObjects(t, id)) == 0 {
		t.Fatal("the killed run left nothing to clean; the test would prove nothing")
	}

	report, err := Clean(context.Background(), CleanOptions{Runs: []string{id, live.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	var cleaned, skipped *CleanedRun
	for i := range report.Runs {
		switch report.Runs[i].ID {
		case id:
			cleaned = &report.Runs[i]
		case live.ID():
			skipped = &report.Runs[i]
		}
	}
	if cleaned == nil || cleaned.SkippedReason != "" || len(cleaned.Namespaces) != 6 || len(cleaned.Killed) == 0 || cleaned.RunDir == "" {
		t.Errorf("killed run %s: report %+v; want 6 namespaces (fabric, 2 nodes, 2 pods, loadgen) removed, the sleeper killed and the run dir removed", id, cleaned)
	}
	if skipped == nil || skipped.SkippedReason == "" || !skipped.OwnerAlive {
		t.Errorf("live run %s: report %+v; want it skipped", live.ID(), skipped)
	}
	if left := runObjects(t, id); len(left) > 0 {
		t.Errorf("left behind after Clean: %v", left)
	}
	for _, pid := range childPIDs {
		if running(pid) {
			t.Errorf("process %d of the killed run still runs", pid)
		}
	}
	// The live testbed still works.
	if out, err := live.Exec(context.Background(), livePod, nil, "ip", "-o", "addr", "show", "eth0"); err != nil || !strings.Contains(string(out), livePod.IP.String()) {
		t.Errorf("live testbed damaged: %q, %v", out, err)
	}
	if err := live.Close(); err != nil {
		t.Fatal(err)
	}
	if after := hostNetworkState(t); after != before {
		t.Errorf("host network state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// startChild re-executes the test binary as a helper that brings up a testbed, and
// returns it with the testbed's run id once it is up.
func startChild(t *testing.T, mode string) (*exec.Cmd, string) {
	t.Helper()
	child := exec.Command("/proc/self/exe", "-test.run=^$")
	child.Env = append(os.Environ(), helperEnv+"="+mode)
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // on every path, or the test binary waits on the child's stderr
		child.Process.Kill()
		child.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, "READY ") {
			t.Fatalf("child: %q", line)
		}
		return child, strings.TrimPrefix(line, "READY ")
	case <-time.After(60 * time.Second):
		t.Fatal("child did not bring up its testbed within 60s")
	}
	return nil, ""
}

// TestSignalClosesTestbed: SIGTERM and SIGINT reach Close through the context and
// the deferred call, and nothing is left.
func TestSignalClosesTestbed(t *testing.T) {
	requireRoot(t)
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		child, id := startChild(t, "signal")
		if len(runObjects(t, id)) == 0 {
			t.Fatal("child's testbed not found")
		}
		if err := child.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- child.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%v: child exited with %v", sig, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: child did not exit within 30s", sig)
		}
		if left := runObjects(t, id); len(left) > 0 {
			t.Errorf("%v: left behind: %v", sig, left)
		}
	}
}

func childNamespaces(t *testing.T, id string) []string {
	m, err := filepath.Glob(filepath.Join(netnsDir, Prefix+id+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	return m
}

// TestBringUpTiming logs how long bring-up and teardown take; the targets are in
// BenchmarkBringUp*. The bounds only catch something badly broken.
func TestBringUpTiming(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name  string
		nodes int
		app   AppSpec
	}{
		{"bookinfo", 2, bookinfo()},
		{"30pods", 3, thirtyPods()},
	} {
		start := time.Now()
		tb, err := New(context.Background(), Options{Nodes: c.nodes})
		if err != nil {
			t.Fatal(err)
		}
		app, err := tb.Deploy(context.Background(), c.app)
		up := time.Since(start)
		if err != nil {
			tb.Close()
			t.Fatal(err)
		}
		// Not timed: every pod is reachable from the load generator. No server listens,
		// so a "connection refused" is the pod's own kernel answering across the fabric.
		for _, p := range app.Pods() {
			_, err := tb.DialContext(context.Background(), app.Clients[0], "tcp", fmt.Sprintf("%s:%d", p.IP, p.Port+1))
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: dial %s (%s on %s) from %s: err = %v; want connection refused", c.name, p.IP, p.Name, p.Node, app.Clients[0].Name, err)
			}
		}
		start = time.Now()
		if err := tb.Close(); err != nil {
			t.Fatal(err)
		}
		down := time.Since(start)
		t.Logf("%s: %d pods on %d nodes: bring-up %v, teardown %v", c.name, len(app.Pods()), c.nodes, up.Round(time.Millisecond), down.Round(time.Millisecond))
		if up > 30*time.Second || down > 30*time.Second {
			t.Errorf("%s: bring-up %v / teardown %v is far off the sub-second target", c.name, up, down)
		}
	}
}

// thirtyPods is 29 service pods and the load generator.
func thirtyPods() AppSpec {
	var ds []Deployment
	for i := 0; i < 10; i++ {
		ds = append(ds, Deployment{Service: fmt.Sprintf("svc%d", i), Replicas: 3, Port: 8080})
	}
	ds[9].Replicas = 2
	return AppSpec{Name: "thirty", Deployments: ds}
}

func benchmarkBringUp(b *testing.B, nodes int, app AppSpec) {
	requireRoot(b)
	var up, down time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		tb, err := New(context.Background(), Options{Nodes: nodes})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tb.Deploy(context.Background(), app); err != nil {
			tb.Close()
			b.Fatal(err)
		}
		mid := time.Now()
		if err := tb.Close(); err != nil {
			b.Fatal(err)
		}
		up += mid.Sub(start)
		down += time.Since(mid)
	}
	b.ReportMetric(float64(up.Milliseconds())/float64(b.N), "ms-up/op")
	b.ReportMetric(float64(down.Milliseconds())/float64(b.N), "ms-down/op")
}

func BenchmarkBringUpBookinfo(b *testing.B) { benchmarkBringUp(b, 2, bookinfo()) }
func BenchmarkBringUp30Pods(b *testing.B)   { benchmarkBringUp(b, 3, thirtyPods()) }

func BenchmarkDialContext(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	tb, err := New(ctx, Options{Nodes: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	p, err := tb.AddPod(ctx, PodSpec{Name: "p", Node: "node0"})
	if err != nil {
		b.Fatal(err)
	}
	// A listener inside the pod, created the same way.
	var ln net.Listener
	if err := inNetNS(tb.pods[p.Name].ns.fd(), func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return }); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := tb.DialContext(ctx, p, "tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func TestDeployBookinfo(t *testing.T) {
	requireRoot(t)
	tb := newTestbed(t, Options{Nodes: 3, Namespace: "books"})
	spec := bookinfo()
	spec.ClientNode = "node2"
	app, err := tb.Deploy(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if app.Name != "bookinfo" || app.Namespace != "books" || len(app.Services) != 4 || len(app.Clients) != 1 {
		t.Fatalf("app = %+v", app)
	}
	// Deploy returns with every bridge port forwarding, so no first packet is lost.
	for _, ns := range append([]*netNS{tb.fabric}, tb.nodes[0].ns, tb.nodes[1].ns, tb.nodes[2].ns) {
		if pending, err := ns.portsNotForwarding(); err != nil || len(pending) > 0 {
			t.Errorf("%s: ports %v not forwarding after Deploy (%v)", ns.name, pending, err)
		}
	}
	reviews := app.Service("reviews")
	if reviews == nil || len(reviews.Versions) != 3 || reviews.Versions[1].Name != "v2" || reviews.Versions[1].Weight != 33 {
		t.Fatalf("reviews = %+v", reviews)
	}
	vips := map[netip.Addr]bool{}
	ips := map[netip.Addr]bool{}
	perNode := map[string]int{}
	for _, s := range app.Services {
		if !vipPrefix.Contains(s.VIP) || vips[s.VIP] || s.Port != 9080 || s.Protocol != "http" {
			t.Errorf("service %s: VIP %s port %d protocol %q", s.Name, s.VIP, s.Port, s.Protocol)
		}
		vips[s.VIP] = true
		if got, _ := tb.ServiceVIP(s.Name); got != s.VIP {
			t.Errorf("ServiceVIP(%s) = %s; want %s", s.Name, got, s.VIP)
		}
	}
	for _, p := range app.Pods() {
		if ips[p.IP] || !netip.MustParsePrefix("198.18.0.0/15").Contains(p.IP) || vipPrefix.Contains(p.IP) {
			t.Errorf("pod %s: address %s reused or out of range", p.Name, p.IP)
		}
		ips[p.IP] = true
		perNode[p.Node]++
		if p.NetNS != tb.NetNSName(p.Name) {
			t.Errorf("pod %s: netns %s", p.Name, p.NetNS)
		}
		if p.Service != "" && p.Identity != "spiffe://cluster.local/ns/books/sa/"+p.Service {
			t.Errorf("pod %s: identity %s", p.Name, p.Identity)
		}
	}
	// Six service pods round-robin over node0 and node1; the load generator alone on node2.
	if perNode["node0"] != 3 || perNode["node1"] != 3 || perNode["node2"] != 1 || app.Clients[0].Node != "node2" || app.Clients[0].Name != "loadgen" {
		t.Errorf("placement %v, client on %s", perNode, app.Clients[0].Node)
	}
	// Every namespace carries the service rules, with one DNAT per endpoint.
	out, err := tb.Exec(context.Background(), app.Clients[0], nil, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "-j DNAT"); n != 6 {
		t.Errorf("loadgen has %d DNAT rules; want 6:\n%s", n, out)
	}
	node, err := tb.NodePod("node0")
	if err != nil {
		t.Fatal(err)
	}
	out, err = tb.Exec(context.Background(), node, nil, "iptables-save", "-t", "nat")
	if err != nil || !strings.Contains(string(out), "-A PREROUTING -j "+ServiceChain) || strings.Count(string(out), "-j DNAT") != 6 {
		t.Errorf("node0 nat table lacks the service rules (%v):\n%s", err, out)
	}
	// A per-node process runs in the node's namespace.
	if _, err := tb.Start(context.Background(), node, substrate.ProcessSpec{Name: "node-proxy", Argv: []string{"sleep", "600"}, UID: substrate.ProxyUID}); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, _ = netNSProcesses([]string{node.NetNS})
	}
	if len(pids) != 1 {
		t.Errorf("processes in %s: %v; want the node proxy", node.NetNS, pids)
	}
	if _, err := tb.Deploy(context.Background(), AppSpec{Deployments: []Deployment{{Service: "x", Port: 0}}}); err == nil || !strings.Contains(err.Error(), "deployment 0 (x): port 0") {
		t.Errorf("bad port: err = %v", err)
	}
}

// BenchmarkDialHost is the baseline for BenchmarkDialContext: the same dial without
// entering a namespace.
func BenchmarkDialHost(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var d net.Dialer
	for i := 0; i < b.N; i++ {
		c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
