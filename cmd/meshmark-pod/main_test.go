package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/podcmd/podcmdtest"
	"github.com/meshmark/meshmark/internal/substrate/kube"
)

// podBin is meshmark-pod as `make build` builds it.
var podBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshmark-pod-test-")
	if err != nil {
		panic(err)
	}
	if podBin, err = podcmdtest.Build(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The in-pod binary must not link what makes meshmark 160 MB (Helm, the Kubernetes
// client and API, Istio's API, the image registry client, the browser driver, SQLite,
// packet capture, netlink, Envoy's control-plane API), nor meshmark's CLI or the parts
// of meshmark that drive a run rather than play a role in a pod.
var (
	forbiddenPrefixes = []string{
		"helm.sh/", "k8s.io/", "sigs.k8s.io/", "istio.io/", "github.com/spf13/", "modernc.org/",
		"github.com/google/go-containerregistry/", "github.com/chromedp/", "github.com/gopacket/",
		"github.com/vishvananda/", "github.com/envoyproxy/", "github.com/yuin/goldmark",
	}
	forbiddenPackages = []string{
		"github.com/meshmark/meshmark/internal/cli", "github.com/meshmark/meshmark/internal/runner",
		"github.com/meshmark/meshmark/internal/store", "github.com/meshmark/meshmark/internal/report",
		"github.com/meshmark/meshmark/internal/testbed", "github.com/meshmark/meshmark/internal/analysis",
		"github.com/meshmark/meshmark/internal/substrate/kube", // its leaf kube/plaintextprobe is allowed
	}
)

// The in-pod binary links none of what makes meshmark heavy: a dependency that creeps
// in fails here, naming the packages that import it.
func TestNoHeavyDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}`, ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	importers := map[string][]string{}
	var deps []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		deps = append(deps, pkg)
		for _, imp := range strings.Fields(imports) {
			importers[imp] = append(importers[imp], pkg)
		}
	}
	for _, dep := range deps {
		bad := slices.Contains(forbiddenPackages, dep)
		for _, p := range forbiddenPrefixes {
			bad = bad || strings.HasPrefix(dep, p)
		}
		if bad {
			t.Errorf("meshmark-pod links %s (imported by %s)", dep, strings.Join(importers[dep], ", "))
		}
	}
	if !slices.Contains(deps, "github.com/meshmark/meshmark/internal/podcmd") {
		t.Fatalf("go list found no podcmd among %d packages: the test lists the wrong thing", len(deps))
	}
	st, err := os.Stat(podBin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("meshmark-pod: %.1f MB, %d packages", float64(st.Size())/1e6, len(deps))
}

// start runs meshmark-pod with args, its output into a buffer the test prints on
// failure; the process is killed at the end of the test if it still runs.
func start(t *testing.T, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(podBin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &out
}

// stop sends SIGTERM and wants the process gone, with exit code 0, within 5 s.
func stop(t *testing.T, cmd *exec.Cmd, out *strings.Builder) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s after SIGTERM: %v\n%s", cmd.Args[1], err, out)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("%s still runs 5 s after SIGTERM\n%s", cmd.Args[1], out)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until it answers 200, for 10 s.
func waitHTTP(t *testing.T, url string, out *strings.Builder) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no answer in 10 s (%v)\n%s", url, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The service role plays one service of a graph as `meshmark service` does: it answers
// its entry path with the trace of the services it went through, and ends at SIGTERM.
func TestServiceRole(t *testing.T) {
	port := freePort(t)
	cmd, out := start(t, "service", "--graph", "chain-1", "--service", "svc-0", "--pod", "svc-0-v1-0", "--listen", "127.0.0.1:"+strconv.Itoa(port))
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	waitHTTP(t, base+"/healthz", out)
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"svc-0-v1-0"`) {
		t.Errorf("GET /: %s %s: want the trace of pod svc-0-v1-0", resp.Status, body)
	}
	stop(t, cmd, out)
}

// The generator role serves plans on a Unix socket, as the local testbed drives it:
// a load.Spec runs against the target, and SIGTERM ends it and removes the socket.
func TestGeneratorRoleOnUnixSocket(t *testing.T) {
	// Two connections: the handler runs on two goroutines at once.
	var served atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	defer target.Close()
	sock := filepath.Join(t.TempDir(), "generator.sock")
	cmd, out := start(t, "generator", "--listen", "unix:"+sock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := loadgen.Dial(ctx, []string{"unix:" + sock})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer pool.Close()
	spec := load.NewSpec(load.Config{Request: load.Request{URL: target.URL + "/x"}, Count: 50, Closed: &load.ClosedModel{Connections: 2}})
	res, _, err := pool.Run(ctx, spec, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Completed != 50 || res.Succeeded != 50 || served.Load() != 50 || len(res.Intervals) == 0 {
		t.Errorf("50 requests asked: %d completed, %d succeeded, %d served, %d intervals", res.Completed, res.Succeeded, served.Load(), len(res.Intervals))
	}
	stop(t, cmd, out)
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is left behind: %v", err)
	}
}

// The plaintext probe role writes the same report to stdout and to the message file
// (the pod's termination message): served for a server that answers, refused for one
// that closes every connection. A malformed target is a usage error (exit 2). Its name
// is the one package kube gives the probe pods.
func TestPlaintextProbeRole(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"service":"web"}`) }))
	defer web.Close()
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer closing.Close()
	go func() {
		for {
			conn, err := closing.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	file := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(podBin, kube.PlaintextProbeCommand, "--target", "web="+web.Listener.Addr().String(),
		"--target", "db="+closing.Addr().String()+"/grpc", "--message-file", file)
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	msg, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(stdout)) != string(msg) {
		t.Errorf("stdout %q, message file %q: want the same report", stdout, msg)
	}
	var probes []meshprobe.PlaintextProbe
	if err := json.Unmarshal(msg, &probes); err != nil {
		t.Fatalf("report %q: %v", msg, err)
	}
	if len(probes) != 2 || probes[0].Service != "web" || probes[0].Refused || !strings.HasPrefix(probes[0].Observed, "served: HTTP 200") ||
		probes[1].Service != "db" || !probes[1].Refused || !strings.HasPrefix(probes[1].Observed, "refused: ") {
		t.Errorf("report %+v: want web served, db refused", probes)
	}
	for _, args := range [][]string{
		{kube.PlaintextProbeCommand, "--target", "web"},
		{"generator", "--no-such-flag"},
		{"service", "--graph", "chain-1", "stray"},
		{"no-such-role"},
		{},
	} {
		out, err := exec.Command(podBin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("meshmark-pod %q: %v, want exit code 2\n%s", args, err, out)
		}
	}
}

// Pause waits for SIGTERM, and as the first process of a PID namespace (a pod
// sandbox) reaps the orphans that end in it: a process left behind by a shell that
// exited becomes pause's child, and no zombie stays once it ends.
func TestPauseReapsOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a PID namespace")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip("no nsenter")
	}
	cmd := exec.Command(podBin, "pause")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	pause := cmd.Process.Pid
	// The shell exits at once; its sleep, orphaned, is reparented to pause and ends
	// 300 ms later.
	if b, err := exec.Command(nsenter, "-t", strconv.Itoa(pause), "-p", "--", "sh", "-c", "sleep 0.3 & exit 0").CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, b)
	}
	var children []string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		children = childrenOf(t, pause)
		if len(children) == 0 {
			break
		}
	}
	if len(children) != 0 {
		t.Errorf("pause still has children 3 s after its orphan ended: %v", children)
	}
	stop(t, cmd, &out)
}

// childrenOf lists the processes whose parent is pid, with their state (Z: a zombie).
func childrenOf(t *testing.T, pid int) []string {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []string
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so read after the last ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, fmt.Sprintf("%s state %s", filepath.Base(filepath.Dir(s)), f[0]))
		}
	}
	return out
}
