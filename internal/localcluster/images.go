package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	gcrname "github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/prereq"
)

// Image is an image to load into every node, under the name pods ask for.
type Image = image.Named

// CoreDNSImage is the name cluster DNS runs under.
const CoreDNSImage = "registry.k8s.io/coredns/coredns:" + prereq.CoreDNSVersion

// StaticImage is an image holding one static executable at path, as its entrypoint.
func StaticImage(name, binary, path string, args ...string) Image {
	return Image{Name: name, Build: func() (v1.Image, error) {
		return image.FromFiles([]image.File{{Path: path, Source: binary, Mode: 0o755}},
			image.Config{Entrypoint: append([]string{path}, args...)})
	}}
}

// baseImages are what every cluster needs: the pods' sandbox and cluster DNS.
func baseImages(pause string) ([]Image, error) {
	coredns, err := lookPath("coredns")
	if err != nil {
		return nil, err
	}
	return []Image{
		PauseImageFrom(pause),
		StaticImage(CoreDNSImage, coredns, "/coredns"),
	}, nil
}

// PauseImageFrom is the sandbox image made of a static binary that, given "pause",
// waits for a signal and reaps what it adopts, as Kubernetes' pause does.
func PauseImageFrom(binary string) Image {
	return StaticImage(PauseImage, binary, "/pause", "pause")
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// loadImages builds each image once and imports it into every node's containerd,
// under the k8s.io namespace the kubelet uses.
func (b *bringup) loadImages(ctx context.Context) error {
	pause := b.opts.PauseBinary
	if pause == "" {
		return fmt.Errorf("no pause binary: give Options.PauseBinary")
	}
	base, err := baseImages(pause)
	if err != nil {
		return err
	}
	return loadImages(ctx, b.dir, b.st.Nodes, append(base, b.opts.Images...), b.progress)
}

// LoadImages imports images into every node of a running cluster.
func LoadImages(ctx context.Context, name string, images []Image) error {
	st, err := Load(name)
	if err != nil {
		return err
	}
	return loadImages(ctx, Dir(name), st.Nodes, images, func(string, ...any) {})
}

func loadImages(ctx context.Context, dir string, nodes []Node, images []Image, progress func(string, ...any)) error {
	ctr, err := exec.LookPath("ctr")
	if err != nil {
		return fmt.Errorf("ctr (Debian's containerd package) not found: %w", err)
	}
	imgDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imgDir, 0o700); err != nil {
		return err
	}
	for _, im := range images {
		img, err := im.Build()
		if err != nil {
			return fmt.Errorf("image %s: %w", im.Name, err)
		}
		tag := strings.TrimPrefix(im.Name, "docker.io/")
		archive := filepath.Join(imgDir, unsafeFileChars.ReplaceAllString(tag, "_")+".tar")
		if err := image.WriteArchive(archive, img, tag); err != nil {
			return fmt.Errorf("image %s: %w", im.Name, err)
		}
		// Each node's containerd unpacks the image into its own storage: in parallel.
		errs := make(chan error, len(nodes))
		for _, n := range nodes {
			go func() {
				sock := containerdSocket(filepath.Join(dir, "nodes", n.Name))
				if err := run(ctx, ctr, "--address", sock, "-n", "k8s.io", "images", "import", archive); err != nil {
					errs <- fmt.Errorf("image %s into %s: %w", im.Name, n.Name, err)
					return
				}
				for _, alias := range im.Aliases {
					if err := run(ctx, ctr, "--address", sock, "-n", "k8s.io", "images", "tag", "--force", normalized(im.Name), normalized(alias)); err != nil {
						errs <- fmt.Errorf("image %s as %s in %s: %w", im.Name, alias, n.Name, err)
						return
					}
				}
				errs <- nil
			}()
		}
		var failed []error
		for range nodes {
			if err := <-errs; err != nil {
				failed = append(failed, err)
			}
		}
		if len(failed) > 0 {
			return errors.Join(failed...)
		}
		progress("  %s (%.1f MiB)", im.Name, float64(imageSize(img))/(1<<20))
		os.Remove(archive)
	}
	return nil
}

// imageSize is the size of an image's layers as stored.
func imageSize(img v1.Image) int64 {
	layers, _ := img.Layers()
	var n int64
	for _, l := range layers {
		if s, err := l.Size(); err == nil {
			n += s
		}
	}
	return n
}

// normalized is an image name as containerd stores it: with its registry, Docker Hub's
// as docker.io, and its library/ path there.
func normalized(name string) string {
	ref, err := gcrname.NewTag(name)
	if err != nil {
		return name
	}
	registry := ref.RegistryStr()
	if registry == gcrname.DefaultRegistry {
		registry = "docker.io"
	}
	return registry + "/" + ref.RepositoryStr() + ":" + ref.TagStr()
}
