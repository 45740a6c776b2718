package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// staticBin is a tiny program built with CGO_ENABLED=0 in TestMain: a real static
// Go binary like the one users put in the image, but seconds to compile.
var staticBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshmark-image-test")
	if err != nil {
		log.Fatal(err)
	}
	staticBin, err = buildStatic(dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildStatic(dir string) (string, error) {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() { println(\"tiny\") }\n"), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "tiny")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the static test binary: %v\n%s", err, out)
	}
	return bin, nil
}

func TestArchive(t *testing.T) {
	img, err := Build(Options{Binary: staticBin, Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "meshmark.tar")
	if err := WriteArchive(out, img, "meshmark:test"); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	untar(t, out, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json: want one manifest, got %d", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "meshmark:test" {
		t.Errorf("ref.name annotation %q", got)
	}
	if got := desc.Annotations["io.containerd.image.name"]; got != "docker.io/library/meshmark:test" {
		t.Errorf("containerd name annotation %q", got)
	}
	if desc.MediaType != types.OCIManifestSchema1 || desc.Platform == nil || desc.Platform.Architecture != runtime.GOARCH {
		t.Errorf("descriptor %+v", desc)
	}
	want, _ := img.Digest()
	if desc.Digest != want {
		t.Errorf("archive holds %s, built %s", desc.Digest, want)
	}

	got, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// validate reads every blob back and checks it against its digest and size.
	if err := validate.Image(got); err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/local/bin/meshmark-pod" || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if c.Labels["org.opencontainers.image.source"] != Source || c.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("labels %v", c.Labels)
	}
	checkLayers(t, got, staticBin, 1)
}

// checkLayers asserts that img has n layers, the last of which holds the binary at
// path and nothing but its directories.
func checkLayers(t *testing.T, img v1.Image, path string, n int) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != n {
		t.Fatalf("want %d layer(s), got %d", n, len(layers))
	}
	rc, err := layers[n-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	var files []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: owner %d:%d, mtime %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		if h.Typeflag == tar.TypeDir {
			if !strings.HasPrefix("usr/local/bin/", h.Name) || h.Mode != 0o755 {
				t.Errorf("directory %s mode %o", h.Name, h.Mode)
			}
			continue
		}
		files = append(files, h.Name)
		if h.Name != "usr/local/bin/meshmark-pod" || h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
			t.Errorf("entry %s type %c mode %o", h.Name, h.Typeflag, h.Mode)
			continue
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the layer's binary differs from %s", path)
		}
	}
	if len(files) != 1 {
		t.Errorf("layer files %q, want only the binary", files)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReproducible(t *testing.T) {
	var digests []v1.Hash
	var archives [][]byte
	for range 2 {
		img, err := Build(Options{Binary: staticBin, Version: "v1"})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "a.tar")
		if err := WriteArchive(out, img, "meshmark:v1"); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		digests, archives = append(digests, d), append(archives, data)
	}
	if digests[0] != digests[1] {
		t.Errorf("same binary, two digests: %s and %s", digests[0], digests[1])
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Error("same image, two different archives")
	}
}

func TestRefused(t *testing.T) {
	if _, static, err := inspect(mustRead(t, "/bin/ls")); err != nil || static {
		t.Skipf("/bin/ls is not a dynamic executable here (static %v, %v)", static, err)
	}
	_, err := Build(Options{Binary: "/bin/ls"})
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0 go build -o bin/meshmark-pod ./cmd/meshmark-pod") {
		t.Errorf("dynamic binary on scratch: %v", err)
	}

	script := filepath.Join(t.TempDir(), "meshmark")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Options{Binary: script}); err == nil || !strings.Contains(err.Error(), "not a Linux executable") {
		t.Errorf("script: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newRegistry serves go-containerregistry's registry over HTTP on loopback and
// returns its host:port.
func newRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestPush(t *testing.T) {
	host := newRegistry(t)
	img, err := Build(Options{Binary: staticBin})
	if err != nil {
		t.Fatal(err)
	}
	var calls, last int64
	ref, err := Push(context.Background(), img, host+"/meshmark:test", true, func(complete, total int64) {
		calls++
		last = complete
	})
	if err != nil {
		t.Fatal(err)
	}
	if ref.String() != host+"/meshmark:test" {
		t.Errorf("pushed to %s", ref)
	}
	layers, _ := img.Layers()
	size, _ := layers[0].Size()
	if calls == 0 || last < size {
		t.Errorf("progress: %d calls, last at %d bytes; the layer alone is %d", calls, last, size)
	}

	digest, _ := img.Digest()
	byDigest, err := name.ParseReference(host + "/meshmark@" + digest.String())
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(byDigest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(pulled); err != nil {
		t.Fatal(err)
	}
	if d, _ := pulled.Digest(); d != digest {
		t.Errorf("pulled %s, pushed %s", d, digest)
	}
	checkLayers(t, pulled, staticBin, 1)
}

// TestBase builds on a base pulled from a registry, which also allows a dynamic
// binary: the base is where its libraries would come from.
func TestBase(t *testing.T) {
	host := newRegistry(t)
	baseLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "etc/base", Mode: 0o644, Size: 4})
		tw.Write([]byte("base"))
		tw.Close()
		return io.NopCloser(&buf), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	base, err := mutate.AppendLayers(empty.Image, baseLayer)
	if err != nil {
		t.Fatal(err)
	}
	base, err = mutate.Config(base, v1.Config{Cmd: []string{"/bin/sh"}, Labels: map[string]string{"from": "base"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := base.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if base, err = mutate.ConfigFile(base, cf); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(context.Background(), base, host+"/base:1", false, nil); err != nil {
		t.Fatal(err)
	}

	img, err := Build(Options{Binary: "/bin/ls", Base: host + "/base:1"})
	if err != nil {
		t.Fatal(err)
	}
	checkLayers(t, img, "/bin/ls", 2)
	got, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	l := got.Config.Labels
	if len(got.Config.Cmd) != 0 || got.Config.Entrypoint[0] != BinaryPath ||
		l["from"] != "base" || l["org.opencontainers.image.base.name"] != host+"/base:1" {
		t.Errorf("config on the base: %+v", got.Config)
	}
	layers, _ := img.Layers()
	if mt, _ := layers[1].MediaType(); mt != types.DockerLayer {
		t.Errorf("layer on a Docker base is %s", mt)
	}

	cf.Architecture = "s390x"
	if runtime.GOARCH == "s390x" {
		cf.Architecture = "arm64"
	}
	other, _ := mutate.ConfigFile(base, cf)
	if _, err := Push(context.Background(), other, host+"/base:other", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Options{Binary: staticBin, Base: host + "/base:other"}); err == nil || !strings.Contains(err.Error(), "linux/"+cf.Architecture) {
		t.Errorf("base for another architecture: %v", err)
	}
}

func TestDefaultTag(t *testing.T) {
	for version, want := range map[string]string{
		"dev":                     "meshmark:dev",
		"v0.3.0-12-gabcdef-dirty": "meshmark:v0.3.0-12-gabcdef-dirty",
		"1.0+build/7":             "meshmark:1.0-build-7",
		"":                        "meshmark:dev",
		".x":                      "meshmark:v.x",
		strings.Repeat("a", 200):  "meshmark:" + strings.Repeat("a", 128),
	} {
		got := DefaultTag(version)
		if got != want {
			t.Errorf("DefaultTag(%q) = %q, want %q", version, got, want)
		}
		if _, err := name.NewTag(got); err != nil {
			t.Errorf("DefaultTag(%q) = %q: %v", version, got, err)
		}
	}
}
