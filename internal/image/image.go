// Package image owns the container image that runs meshmark's in-pod roles in
// Kubernetes pods: it puts the small binary meshmark-pod (the workload service, the load
// generator, the plaintext probe, pause) into a one-layer image on scratch (or on a base
// the user names), writes that image as an OCI archive and pushes it to a registry. No
// Docker daemon is involved, and nothing is pulled that the user did not name.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the image holds meshmark-pod; it is the entrypoint, and a pod's
// arguments name the role (service, generator, plaintext-probe, pause).
const BinaryPath = "/usr/local/bin/meshmark-pod"

// Source is the org.opencontainers.image.source label of every image.
const Source = "https://github.com/meshmark/meshmark"

// epoch is every timestamp in the image, so that the same binary gives the same digest.
var epoch = time.Unix(0, 0).UTC()

// Options says what Build puts in the image.
type Options struct {
	// Binary is the meshmark-pod binary to package (podcmd.Find finds the one beside
	// meshmark).
	Binary string
	// Base is a reference to pull and build on; empty means scratch.
	Base string
	// Insecure allows pulling Base over plain HTTP.
	Insecure bool
	// Version goes into the org.opencontainers.image.version label when not empty.
	Version string
	// Context cancels pulling Base; nil means context.Background().
	Context context.Context
}

// Build returns an image whose one added layer holds the binary at BinaryPath as its
// entrypoint, for the platform the binary was compiled for.
func Build(opts Options) (v1.Image, error) {
	path := opts.Binary
	if path == "" {
		return nil, errors.New("no binary to put in the image (build meshmark-pod with `make build`)")
	}
	// Read once: the layer's digests and contents must come from the same bytes even
	// if the file is rebuilt meanwhile.
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	arch, static, err := inspect(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !static && opts.Base == "" {
		return nil, fmt.Errorf("%s is dynamically linked and would not run on the empty base image: "+
			"build it with CGO_ENABLED=0 (CGO_ENABLED=0 go build -o bin/meshmark-pod ./cmd/meshmark-pod, as `make build` does), "+
			"or name a base image that has its libraries with --base", path)
	}

	base, layerType := empty.Image, types.OCILayer
	labels := map[string]string{}
	if opts.Base != "" {
		if base, err = pull(opts, arch); err != nil {
			return nil, err
		}
		mt, err := base.MediaType()
		if err != nil {
			return nil, err
		}
		// A layer of the other family would make a manifest some registries refuse.
		if mt == types.DockerManifestSchema2 {
			layerType = types.DockerLayer
		}
		digest, err := base.Digest()
		if err != nil {
			return nil, err
		}
		labels["org.opencontainers.image.base.name"] = opts.Base
		labels["org.opencontainers.image.base.digest"] = digest.String()
	}

	layerTar, err := layerTar(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(layerType))
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "meshmark image build"},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: epoch}
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint = []string{BinaryPath}
	// A base's Cmd would become meshmark's arguments.
	cf.Config.Cmd = nil
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	labels["org.opencontainers.image.source"] = Source
	if opts.Version != "" {
		labels["org.opencontainers.image.version"] = opts.Version
	}
	for k, v := range labels {
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if opts.Base == "" {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	return img, nil
}

// goarch maps ELF machines to the architectures of image platforms.
var goarch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_386:     "386",
	elf.EM_ARM:     "arm",
	elf.EM_PPC64:   "ppc64le",
	elf.EM_S390:    "s390x",
	elf.EM_RISCV:   "riscv64",
}

// inspect says which architecture bin is for and whether it runs without a dynamic
// loader, which the empty base image does not have.
func inspect(bin []byte) (arch string, static bool, err error) {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return "", false, fmt.Errorf("not a Linux executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", false, fmt.Errorf("not an executable (ELF type %s)", f.Type)
	}
	arch, ok := goarch[f.Machine]
	if !ok {
		return "", false, fmt.Errorf("unsupported machine %s", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return arch, false, nil
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return "", false, err
	}
	return arch, len(libs) == 0, nil
}

// layerTar is the uncompressed layer: the directories down to the binary, then the
// binary, all owned by root and dated epoch. Runtimes create missing parents on
// their own, but not all with the mode an image author would choose.
func layerTar(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: BinaryPath[1:], Mode: 0o755, Size: int64(len(bin)), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func pull(opts Options, arch string) (v1.Image, error) {
	ref, err := name.ParseReference(opts.Base, nameOptions(opts.Insecure)...)
	if err != nil {
		return nil, fmt.Errorf("--base: %w", err)
	}
	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	want := v1.Platform{OS: "linux", Architecture: arch}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(want))
	if err != nil {
		return nil, fmt.Errorf("pulling base %s: %w", opts.Base, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("pulling base %s: %w", opts.Base, err)
	}
	// A single-platform base is returned whatever WithPlatform asked for.
	if cf.Architecture != "" && cf.Architecture != arch {
		return nil, fmt.Errorf("base %s is for %s/%s, the binary for linux/%s", opts.Base, cf.OS, cf.Architecture, arch)
	}
	return img, nil
}

func nameOptions(insecure bool) []name.Option {
	if insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

// Push writes img to the registry named by ref. progress, when not nil, is called
// with the bytes uploaded so far and the total known so far.
func Push(ctx context.Context, img v1.Image, ref string, insecure bool, progress func(complete, total int64)) (name.Reference, error) {
	r, err := name.ParseReference(ref, nameOptions(insecure)...)
	if err != nil {
		return nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	var done chan struct{}
	if progress != nil {
		updates := make(chan v1.Update, 16)
		done = make(chan struct{})
		// remote.Write closes updates when it returns.
		go func() {
			defer close(done)
			for u := range updates {
				if u.Error == nil {
					progress(u.Complete, u.Total)
				}
			}
		}()
		opts = append(opts, remote.WithProgress(updates))
	}
	err = remote.Write(r, img, opts...)
	if done != nil {
		<-done
	}
	if err != nil {
		return nil, fmt.Errorf("pushing %s: %w", ref, err)
	}
	return r, nil
}

var badTagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// DefaultTag is meshmark:VERSION with VERSION made a valid tag: a version from git
// describe or a build's -ldflags may hold characters a tag may not.
func DefaultTag(version string) string {
	t := badTagChars.ReplaceAllString(version, "-")
	switch {
	case t == "":
		t = "dev"
	case t[0] == '.' || t[0] == '-':
		t = "v" + t
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return "meshmark:" + t
}
