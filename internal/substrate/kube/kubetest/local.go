package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/localcluster"
	"k8s.io/client-go/kubernetes"
)

// Local is a real cluster on this machine (localcluster: real kubelets, containerd,
// bridge CNI, kube-proxy and CoreDNS), brought up once for a package's tests on first
// use and taken down by Main when they end. It is what a test whose subject is a pod,
// a proxy, a probe, a generator or a metric runs on; the paper-only Cluster stays for
// tests that need more nodes than this machine holds.
type Local struct {
	*localcluster.Cluster
	// Image is meshmark's image in every node, built from PodBinary.
	Image     string
	PodBinary string
}

// LocalImage is the name meshmark's image has on a test's local cluster.
const LocalImage = "meshmark:test"

var local struct {
	once sync.Once
	c    *Local
	err  error
}

// Main runs a package's tests and takes its local cluster down afterwards, if a test
// brought one up. A package whose tests use SharedLocal calls it from TestMain, which
// must call localcluster.RunRole first.
func Main(m *testing.M) int {
	code := m.Run()
	if local.c != nil {
		if err := localcluster.Down(context.Background(), local.c.State.Name, nil); err != nil {
			fmt.Fprintf(os.Stderr, "taking the tests' local cluster down: %v\n", err)
			code = 1
		}
	}
	return code
}

// SharedLocal returns the package's local cluster, bringing it up on first use (two
// nodes, about a minute). Without root or the cluster's binaries the test is skipped
// with the reason, or fails under CI, which installs them.
func SharedLocal(t testing.TB) *Local {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a local cluster needs root")
	}
	if missing := localcluster.Missing(); len(missing) > 0 {
		msg := fmt.Sprintf("a local cluster needs %s: run `meshmark setup --for cluster`", strings.Join(missing, ", "))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	local.once.Do(func() { local.c, local.err = startLocal() })
	if local.err != nil {
		t.Fatalf("local cluster: %v", local.err)
	}
	return local.c
}

func startLocal() (*Local, error) {
	bin, err := BuildPodBinary()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("mmtest-%d", os.Getpid())
	img := localcluster.Image{Name: LocalImage, Build: func() (v1.Image, error) {
		return image.Build(image.Options{Binary: bin})
	}}
	start := time.Now()
	var progress strings.Builder
	c, err := localcluster.Up(context.Background(), localcluster.Options{Name: name, Nodes: 2, Owned: true,
		Kubeconfig: "-", PauseBinary: bin, Images: []localcluster.Image{img}, Progress: &progress})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, progress.String())
	}
	fmt.Fprintf(os.Stderr, "kubetest: local cluster %s up in %s\n", name, time.Since(start).Round(time.Second))
	return &Local{Cluster: c, Image: LocalImage, PodBinary: bin}, nil
}

var podBinary struct {
	once sync.Once
	path string
	err  error
}

// BuildPodBinary builds meshmark's static in-pod binary once per test process, which
// meshmark's image and the pause image are made of.
func BuildPodBinary() (string, error) {
	podBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "meshmark-pod-")
		if err != nil {
			podBinary.err = err
			return
		}
		out := filepath.Join(dir, "meshmark-pod")
		cmd := exec.Command("go", "build", "-o", out, "github.com/meshmark/meshmark/cmd/meshmark-pod")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			podBinary.err = fmt.Errorf("go build meshmark-pod: %v\n%s", err, b)
			return
		}
		podBinary.path = out
	})
	return podBinary.path, podBinary.err
}

// ClientOf is an admin clientset of the local cluster, failing the test otherwise.
func (l *Local) ClientOf(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := l.Client()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// LoadImages imports more images into every node (a mesh's), once per name.
func (l *Local) LoadImages(t testing.TB, images ...localcluster.Image) {
	t.Helper()
	loaded.Lock()
	defer loaded.Unlock()
	var todo []localcluster.Image
	for _, im := range images {
		if !loaded.names[im.Name] {
			todo = append(todo, im)
		}
	}
	if len(todo) == 0 {
		return
	}
	if err := localcluster.LoadImages(context.Background(), l.State.Name, todo); err != nil {
		t.Fatal(err)
	}
	for _, im := range todo {
		loaded.names[im.Name] = true
	}
}

var loaded = struct {
	sync.Mutex
	names map[string]bool
}{names: map[string]bool{}}
